"""Issue 13 (decoders): every public decoder entry checks its positions, sizes and counts, and holds the buffers its
results point into. Calls that crashed the interpreter before run in a subprocess, so a regression fails the test
instead of killing pytest."""

import subprocess
import sys
import textwrap

import pytest

import localmq
from helpers import wait_until
from localmq import _columns, _frame, _index, _record, _scan
from localmq.errors import ArgumentOverflowError, ArgumentRangeError, LocalMQError, PositionOutOfRangeError
from localmq.layout import INDEX_HEADER_SIZE, INDEX_ITEM_SIZE, INDEX_SLOT_SIZE

REC = _record.encode_message("T", b"hello", properties={"TAGS": "a", "KEYS": "k1 k2"}, store_timestamp=5)


def frame_bytes():
    """One valid embedded-queue frame (written through a MappedFile as the queue writes it)."""
    import os
    import shutil
    import tempfile

    from localmq._mapped_file import MappedFile

    d = tempfile.mkdtemp()
    mf = MappedFile(os.path.join(d, "p"), 4096, 0)
    try:
        end = _frame.write_frame(mf, 0, b"body", b"", 1, 2)
        return bytes(memoryview(mf)[:end])
    finally:
        mf.close()
        shutil.rmtree(d)  # every run left a directory in /tmp


def run_isolated(code):
    """Run ``code`` in a fresh interpreter; returns (returncode, stdout, stderr). A segfault is returncode -11."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_error_classes_keep_the_builtins():
    assert issubclass(PositionOutOfRangeError, IndexError) and issubclass(PositionOutOfRangeError, ValueError)
    assert issubclass(ArgumentOverflowError, OverflowError) and issubclass(ArgumentOverflowError, ValueError)
    for cls in (ArgumentRangeError, PositionOutOfRangeError, ArgumentOverflowError):
        assert issubclass(cls, LocalMQError)
        assert cls.__name__ in localmq.__all__ and getattr(localmq, cls.__name__) is cls
    assert ArgumentRangeError("x", "pos").argument == "pos"


# ---------------------------------------------------------------------------------------------- finding 1

NEGATIVE_CALLS = {
    "scan_record": "_record.scan_record(REC, -8)",
    "scan_record_far": "_record.scan_record(REC, -(1 << 40))",
    "walk_records": "_record.walk_records(REC, -8)",
    "walk_records_far": "_record.walk_records(REC, -(1 << 40), -1)",
    "walk_frames": "_frame.walk_frames(REC, -8)",
    "walk_frames_far": "_frame.walk_frames(REC, -(1 << 40))",
    "decode_message": "_record.decode_message(REC, -1)",
    "decode_message_past": "_record.decode_message(REC, len(REC) + 1)",
    "scan_record_past": "_record.scan_record(REC, len(REC) + 9)",
    "walk_records_past": "_record.walk_records(REC, len(REC) + 9)",
    "walk_frames_past": "_frame.walk_frames(REC, len(REC) + 9)",
    "decode_range": "_columns.decode_range(REC, _columns.RecordColumns(4), -8)",
    "scan_range": "_scan.scan_range(REC, -8, -1)",
}


@pytest.mark.parametrize("name", sorted(NEGATIVE_CALLS))
def test_out_of_range_start_raises_typed_error_in_a_subprocess(name):
    """Finding 1: a negative start position segfaulted scan_record, walk_records and walk_frames (or read before
    the buffer); decode_message raised a bare IndexError."""
    code = f"""
        from localmq import _columns, _frame, _record, _scan
        from localmq.errors import PositionOutOfRangeError
        REC = {REC!r}
        try:
            {NEGATIVE_CALLS[name]}
        except PositionOutOfRangeError as e:
            assert isinstance(e, IndexError)
            print("typed", e.argument)
        else:
            print("no error")
    """
    rc, out, err = run_isolated(code)
    assert rc == 0, f"exit {rc}: {err}"
    assert out.startswith("typed"), out + err


def test_valid_positions_still_decode():
    assert _record.scan_record(REC, 0) == ("ok", len(REC))
    assert _record.scan_record(REC, len(REC)) == ("end", 0)
    assert _record.walk_records(REC, len(REC))[1] == "end"
    assert _record.decode_message(REC, 0).body == b"hello"
    f = frame_bytes()
    assert _frame.walk_frames(f, 0)[0] == [0]
    assert _frame.walk_frames(f, len(f)) == ([], len(f), "end")


def test_decode_positions_and_scan_positions_reject_nothing_but_stop_on_bad_positions():
    cols = _columns.RecordColumns(4)
    for bad in ([-1], [len(REC)], [1 << 60], [-(1 << 60)]):
        assert _columns.decode_positions(REC, cols, bad)[2] == "torn"
        assert _scan.scan_positions(REC, bad, [len(REC)])[2] == "torn"


def test_scan_positions_negative_sizes_cannot_shrink_the_output():
    """A negative size after a valid unit made the output buffers smaller than the bytes written (heap overflow)."""
    code = f"""
        from localmq import _scan
        REC = {REC!r}
        data = REC * 4
        n = len(REC)
        out = _scan.scan_positions(data, [0, n, 2 * n], [n, -10 * n, n], fields=("body", "topic"))
        print(out[0], out[1], out[2])
    """
    rc, out, err = run_isolated(code)
    assert rc == 0, err
    assert out.split() == ["1", "1", "corrupt"]


def test_rows_and_counts_are_checked():
    cols = _columns.RecordColumns(4)
    _columns.decode_range(REC * 2, cols)
    with pytest.raises(PositionOutOfRangeError):
        _columns.gather_binary(cols, "body", [-1])
    with pytest.raises(PositionOutOfRangeError):
        _columns.gather_keys(cols, [2])
    with pytest.raises(IndexError):
        cols.body(5)
    with pytest.raises(ArgumentRangeError):
        _columns.RecordColumns(0)
    with pytest.raises(ArgumentRangeError):
        _scan.scan_range(REC, 0, -1, capacity=0)


def test_gathers_check_spans_of_changed_columns():
    """The columns are writable numpy arrays: a position changed after the decode must not make a gather read
    outside the decoded buffer."""
    cols = _columns.RecordColumns(2)
    _columns.decode_range(REC, cols)
    good = _columns.gather_binary(cols, "body")
    for name, value in (("body_pos", 1 << 40), ("body_pos", -(1 << 40)), ("body_len", 1 << 30)):
        saved = cols.arrays[name][0]
        cols.arrays[name][0] = value
        with pytest.raises(PositionOutOfRangeError):
            _columns.gather_binary(cols, "body")
        with pytest.raises(PositionOutOfRangeError):
            cols.gather_bodies()
        if name == "body_pos":  # the message id reads the store host before the body
            with pytest.raises(PositionOutOfRangeError):
                _columns.gather_msg_ids(cols)
        cols.arrays[name][0] = saved
    for name in ("topic_pos", "props_pos"):
        cols.arrays[name][0] = 1 << 40
    with pytest.raises(PositionOutOfRangeError):
        _columns.topic_codes(cols)
    for gather in (_columns.gather_keys, _columns.gather_properties):
        with pytest.raises(PositionOutOfRangeError):
            gather(cols)
    with pytest.raises(PositionOutOfRangeError):
        _columns.gather_property(cols, "TAGS")
    _columns.decode_range(REC, cols)
    assert [a.tolist() for a in _columns.gather_binary(cols, "body")] == [a.tolist() for a in good]


def _index_file(slots=8, items=16):
    return bytearray(INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + items * INDEX_ITEM_SIZE), slots, items


def test_index_entries_check_their_arguments():
    buf, slots, items = _index_file()
    with pytest.raises(ArgumentRangeError):
        _index.select_offsets(buf, slots, -5, 0, 1 << 62, 10)
    with pytest.raises(ArgumentRangeError):
        _index.put_key(buf, slots, items, -5, 0, 0)
    with pytest.raises(ArgumentRangeError):  # C arithmetic wrapped around before: a huge geometry matched
        _index.put_key(buf, (1 << 62) + slots, items, 1, 0, 0)
    with pytest.raises(ArgumentRangeError):
        _index.select_offsets(buf, 1 << 62, 1, 0, 1 << 62, 10)
    assert _index.put_key(buf, slots, items, 3, 100, 1000)
    assert _index.select_offsets(buf, slots, 3, 0, 1 << 62, 10).tolist() == [100]


def test_select_offsets_stays_inside_a_damaged_file():
    """A header counting more items than the file holds and a slot naming the item past the end."""
    code = f"""
        import struct
        from localmq import _index
        slots, items = 8, 4
        buf = bytearray({INDEX_HEADER_SIZE} + slots * {INDEX_SLOT_SIZE} + items * {INDEX_ITEM_SIZE})
        struct.pack_into(">i", buf, 36, items)            # indexCount = item capacity
        struct.pack_into(">i", buf, {INDEX_HEADER_SIZE} + 3 * 4, items)  # slot 3 names item 4 (past the end)
        mv = memoryview(buf)[:len(buf)]
        print(_index.select_offsets(mv, slots, 3, -(1 << 62), 1 << 62, 10).tolist())
    """
    rc, out, err = run_isolated(code)
    assert rc == 0, err
    assert out.strip() == "[]"


def test_index_rows_checks_rows_and_spans():
    buf, slots, items = _index_file()
    cols = _columns.RecordColumns(4)
    data = REC * 2
    _columns.decode_range(data, cols)
    a = cols.arrays
    args = [
        a["physical_offset"],
        a["store_timestamp"],
        a["sys_flag"],
        a["topic_pos"],
        a["topic_len"],
        a["props_pos"],
        a["props_len"],
    ]
    assert _index.index_rows(buf, slots, items, data, *args, 0, 0, 2)[3] == 4  # two records, KEYS "k1 k2" each
    for row, key, count in ((-1, 0, 2), (0, -1, 2), (0, 0, 5)):
        with pytest.raises(ArgumentRangeError):
            _index.index_rows(buf, slots, items, data, *args, row, key, count)
    a["topic_len"][0] = 5000  # longer than a topic can be: the key scratch buffer is sized by the limits
    with pytest.raises(PositionOutOfRangeError):
        _index.index_rows(buf, slots, items, data, *args, 0, 0, 2)
    a["topic_len"][0] = 1
    a["props_pos"][1] = len(data)
    with pytest.raises(PositionOutOfRangeError):
        _index.index_rows(buf, slots, items, data, *args, 0, 0, 2)


# ---------------------------------------------------------------------------------------------- finding 2


def test_decoded_bytearray_cannot_shrink_under_the_columns():
    """Finding 2: decode_range kept a reference to a bytearray without holding its buffer; after the caller shrank
    it, the gathers, topic_codes and gather_keys returned freed heap memory as data."""
    data = bytearray(REC * 50)
    cols = _columns.RecordColumns(64)
    assert _columns.decode_range(data, cols)[0] == 50
    before = (_columns.gather_binary(cols, "body"), _columns.topic_codes(cols), _columns.gather_keys(cols))
    with pytest.raises(BufferError):
        del data[100:]
    with pytest.raises(BufferError):
        data.extend(b"x" * 4096)
    assert len(data) == len(REC) * 50
    after = (_columns.gather_binary(cols, "body"), _columns.topic_codes(cols), _columns.gather_keys(cols))
    assert bytes(after[0][1]) == b"hello" * 50 == bytes(before[0][1])
    assert after[1][1] == ["T"] and bytes(after[2][2]) == bytes(before[2][2]) == b"k1k2" * 50
    assert bytes(cols.gather_bodies()[1]) == b"hello" * 50
    cols.release()  # the columns let go: the bytearray may change again
    del data[100:]
    assert cols.count == 0 and cols.buffer is None


def test_decoded_bytearray_is_released_by_the_next_decode():
    first, second = bytearray(REC), bytearray(REC * 2)
    cols = _columns.RecordColumns(4)
    _columns.decode_range(first, cols)
    _columns.decode_positions(second, cols, [0, len(REC)])
    first.clear()  # no longer held
    with pytest.raises(BufferError):
        second.clear()
    assert cols.buffer is second and cols.count == 2


def test_a_released_memoryview_still_pins_the_decoded_bytes():
    """The index service decodes a memoryview it releases right after (``with view:``): the columns keep their
    own export, so the release works and the bytes stay."""
    data = bytearray(REC * 3)
    cols = _columns.RecordColumns(4)
    with memoryview(data) as view:
        _columns.decode_range(view, cols)
    with pytest.raises(BufferError):
        data.clear()
    assert bytes(_columns.gather_binary(cols, "body")[1]) == b"hello" * 3


# ---------------------------------------------------------------------------------------------- finding 11


def _queues(tmp_path):
    local = localmq.open(tmp_path / "local")
    embedded = localmq.open(tmp_path / "embedded", kind="embedded")
    memory = localmq.MemoryMessageQueue()
    return [local, embedded, memory]


def test_queue_arguments_out_of_range_raise_typed_errors(tmp_path):
    """Finding 11: max_messages 2**31 raised a bare OverflowError (the compiled get path takes an int32)."""
    for q in _queues(tmp_path):
        try:
            q.put("t", b"x", queue_id=0)
            assert wait_until(lambda q=q: q.max_offset("t", 0) == 1)  # the local queue dispatches in a thread
            with pytest.raises(ArgumentOverflowError) as e:
                q.get_message("t", 0, 0, 1 << 31)
            assert e.value.argument == "max_messages" and "max_messages" in str(e.value)
            assert isinstance(e.value, OverflowError)
            with pytest.raises(ValueError):
                q.get_message("t", 0, 0, 0)
            with pytest.raises(localmq.InvalidQueueIdError):
                q.get_message("t", 1 << 70, 0)
            assert q.get_message("t", 0, 1 << 70).status == localmq.GetStatus.OFFSET_OVERFLOW_BADLY
            assert q.get_message("t", 0, -(1 << 70)).status == localmq.GetStatus.OFFSET_TOO_SMALL
            assert q.max_offset("t", 1 << 70) == 0 and q.min_offset("t", 1 << 70) == 0
            assert q.offset_by_time("t", 1 << 70, 0) == 0
            assert q.offset_by_time("t", 0, 1 << 70) == q.max_offset("t", 0)
            assert q.offset_by_time("t", 0, -(1 << 70)) == 0
            assert q.get_message("t", 0, 0, (1 << 31) - 1).status == localmq.GetStatus.FOUND
        finally:
            q.close()


def test_look_message_by_offset_out_of_range(tmp_path):
    q = localmq.open(tmp_path / "s")
    try:
        q.put("t", b"x")
        assert q.look_message_by_offset(1 << 70) is None
        assert q.look_message_by_offset(-(1 << 70)) is None
    finally:
        q.close()


@pytest.mark.parametrize(
    "args, name",
    [
        (("t", "0", 0), "queue_id"),
        (("t", 0, "0"), "offset"),
        (("t", 0, 0, "5"), "max_messages"),
        ((5, 0, 0), "topic"),
        (("t", True, 0), "queue_id"),
        (("t", 0, 1.5), "offset"),
    ],
)
def test_get_message_with_a_wrong_type_names_the_argument(tmp_path, args, name):
    """Issue 14's finding: ``get_message("t", "0", 0)`` was a TypeError from inside a comparison."""
    with localmq.open(tmp_path / "s", mapped_file_size_commit_log=64 * 1024) as st:
        st.put("t", b"x")
        with pytest.raises(localmq.ArgumentTypeError) as e:
            st.get_message(*args)
        assert e.value.argument == name and name in str(e.value) and isinstance(e.value, TypeError)
