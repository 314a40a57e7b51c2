"""localmq beside persist-queue, diskcache, queuelib, sqlite3, lmdb and a hand-written mmap log, on the same messages.

One function per scenario; the ``impl`` fixture runs it for every implementation and ``body_size`` for 100 B and
1 KiB, so each test id names scenario x body size x implementation (``-k "put_one and lmdb"``).
"""

import time

import pytest

from conftest import BATCH, DECODE_ROUNDS, make_bodies, message_count
from peers import LocalMQ, LocalMQGetMessage, MmapLog, mmap_decode_numpy_fixed, mmap_decode_struct


def chunks(bodies):
    return [bodies[i : i + BATCH] for i in range(0, len(bodies), BATCH)]


def check(count, first, last, bodies):
    """What was read back is what was written: the count, the first body and the last body."""
    assert count == len(bodies), f"read back {count} of {len(bodies)} messages"
    assert bytes(first) == bodies[0], "first body differs"
    assert bytes(last) == bodies[-1], "last body differs"


def consume(it):
    """Read every body from an iterator: (count, first, last, total bytes)."""
    first = last = None
    count = total = 0
    for body in it:
        if first is None:
            first = body
        count += 1
        total += len(body)
        last = body
    return count, first, last, total


def verify_written(bodies):
    def verify(store, _):
        count, first, last, _ = consume(store.read_all())
        check(count, first, last, bodies)

    return verify


def verify_read(bodies):
    def verify(store, result):
        count, first, last, total = result
        check(count, first, last, bodies)
        assert total == sum(map(len, bodies))

    return verify


def test_put_one(impl, body_size, bench):
    """Scenario 1: put N messages one at a time; the timed region ends when all are visible to a reader
    (localmq: after wait_for_dispatch(), i.e. dispatch to the ConsumeQueue included)."""
    bodies = make_bodies(message_count(impl, body_size), body_size)

    def target(store):
        put = store.put
        for body in bodies:
            put(body)
        store.wait_visible()

    bench.run(
        scenario="put",
        cls=impl,
        body_size=body_size,
        count=len(bodies),
        target=target,
        verify=verify_written(bodies),
        note="one put per message",
    )


def test_put_batch(impl, body_size, bench):
    """Scenario 2: put N messages in batches of 1000 through each store's batch API (``Store.batch_api``);
    stores without one loop over put(). Timed until visible, as scenario 1."""
    bodies = make_bodies(message_count(impl, body_size), body_size)
    batches = chunks(bodies)

    def target(store):
        put_batch = store.put_batch
        for batch in batches:
            put_batch(batch)
        store.wait_visible()

    bench.run(
        scenario="put_batch_1000",
        cls=impl,
        body_size=body_size,
        count=len(bodies),
        target=target,
        verify=verify_written(bodies),
        note=impl.batch_api,
    )


def test_read_all(impl, body_size, bench):
    """Scenario 3: read back N messages written (untimed) by put_batch, touching every body
    (localmq: get_bodies in batches of 1024; peers: ``Store.read_api``)."""
    bodies = make_bodies(message_count(impl, body_size), body_size)
    batches = chunks(bodies)

    def prepare(store):
        for batch in batches:
            store.put_batch(batch)
        store.wait_visible()

    bench.run(
        scenario="read",
        cls=impl,
        body_size=body_size,
        count=len(bodies),
        prepare=prepare,
        target=lambda store: consume(store.read_all()),
        verify=verify_read(bodies),
        note=impl.read_api,
    )


def test_read_all_localmq_get_message(need_localmq, body_size, bench):
    """Scenario 3, localmq through ``get_message`` (batches of 32, a Message per body, every ``.body``): the read
    API before ``get_bodies``, kept measurable beside it (row "localmq get_message")."""
    bodies = make_bodies(message_count(LocalMQGetMessage, body_size), body_size)
    batches = chunks(bodies)

    def prepare(store):
        for batch in batches:
            store.put_batch(batch)
        store.wait_visible()

    bench.run(
        scenario="read",
        cls=LocalMQGetMessage,
        body_size=body_size,
        count=len(bodies),
        prepare=prepare,
        target=lambda store: consume(store.read_all()),
        verify=verify_read(bodies),
        note=LocalMQGetMessage.read_api,
    )


# Scenario 4: columnar decode of a whole written range. Only the hand-written mmap log has a byte range a user
# could decode; the queues and databases above hide theirs.


def _segment_of(store, caveats):
    """(base offset, buffer, readable end) of the CommitLog segment holding the round's messages."""
    st = store.st
    try:
        segments = st.commit_log_segments
    except AttributeError as e:
        # Fallback while the store lacks commit_log_segments(): a copy of the segment file, read untimed.
        caveats.add(f"segment read with open().read() ({e})")
        with open(store.path_of_first_segment, "rb") as f:
            return 0, f.read(), -1
    base, view, end = segments()[0]
    return base, view, end


def _localmq_decoder(caveats):
    """(RecordColumns, decode_range) from ``localmq``, or from ``localmq._columns`` with the gap noted."""
    import localmq

    try:
        return localmq.RecordColumns, localmq.decode_range
    except AttributeError as e:
        from localmq import _columns

        caveats.add(f"from localmq._columns ({e})")
        return _columns.RecordColumns, _columns.decode_range


def test_decode_range_localmq(need_localmq, body_size, bench):
    """Scenario 4, localmq: ``decode_range`` of the segment into preallocated ``RecordColumns`` (17 columns:
    offsets, sizes, queue fields, timestamps, CRC field, tags code, body/topic/properties positions), CRC
    not checked (decode_range's default)."""
    count = message_count(LocalMQ, body_size)
    bodies = make_bodies(count, body_size)
    batches = chunks(bodies)
    caveats = set()
    record_columns, decode_range = _localmq_decoder(caveats)
    seg = {}

    class Decoded(LocalMQ):
        def open(self, directory, count=0, body_size=0):
            super().open(directory, count, body_size)
            self.path_of_first_segment = directory / "commitlog" / ("0" * 20)
            return self

        def close(self):
            # The columns and our view hold an export of the mapping: drop them before the store unmaps it.
            seg.clear()
            super().close()

    def prepare(store):
        for batch in batches:
            store.put_batch(batch)
        store.wait_visible()
        base, view, end = _segment_of(store, caveats)
        seg.update(base=base, view=view, end=end, cols=record_columns(count))

    def target(store):
        return decode_range(seg["view"], seg["cols"], 0, seg["end"], seg["base"])

    def verify(store, result):
        n, _, reason = result
        cols = seg["cols"]
        assert reason in ("end", "blank"), reason
        check(n, cols.body(0), cols.body(n - 1), bodies)
        assert int(cols["body_len"].sum()) == count * body_size

    bench.run(
        scenario="decode_range",
        cls=Decoded,
        body_size=body_size,
        count=count,
        prepare=prepare,
        target=target,
        verify=verify,
        rounds=DECODE_ROUNDS,
        implementation="localmq",
        note="decode_range into RecordColumns",
        caveats=caveats,
    )


def _mmap_log_prepared(bodies):
    batches = chunks(bodies)

    def prepare(store):
        for batch in batches:
            store.put_batch(batch)

    return prepare


def test_decode_range_mmap_struct(body_size, bench):
    """Scenario 4, mmap log: a Python loop of struct.unpack_from into array columns (body position, length)."""
    count = message_count(MmapLog, body_size)
    bodies = make_bodies(count, body_size)

    def verify(store, result):
        pos, lens = result
        mm = store.mm
        check(len(pos), mm[pos[0] : pos[0] + lens[0]], mm[pos[-1] : pos[-1] + lens[-1]], bodies)

    bench.run(
        scenario="decode_range",
        cls=MmapLog,
        body_size=body_size,
        count=count,
        prepare=_mmap_log_prepared(bodies),
        target=lambda store: mmap_decode_struct(store.mm),
        verify=verify,
        rounds=DECODE_ROUNDS,
        implementation="mmap log: struct loop",
        note="struct.unpack_from loop into array('q')/array('i')",
    )


def test_decode_range_mmap_numpy_fixed(body_size, bench):
    """Scenario 4, mmap log: numpy frombuffer with a (length, body) dtype; valid only for equal-size frames."""
    count = message_count(MmapLog, body_size)
    bodies = make_bodies(count, body_size)

    def verify(store, result):
        pos, lens = result
        mm = store.mm
        check(len(pos), mm[pos[0] : pos[0] + lens[0]], mm[pos[-1] : pos[-1] + lens[-1]], bodies)

    bench.run(
        scenario="decode_range",
        cls=MmapLog,
        body_size=body_size,
        count=count,
        prepare=_mmap_log_prepared(bodies),
        target=lambda store: mmap_decode_numpy_fixed(store.mm, count, body_size),
        verify=verify,
        rounds=DECODE_ROUNDS,
        implementation="mmap log: numpy (fixed size only)",
        note="np.frombuffer record dtype + length check; equal-size frames only",
    )


def test_put_latency(impl, body_size, bench):
    """Scenario 5: the latency of each single put (100 B), timed one by one with perf_counter_ns; the percentiles
    are in ``extra_info["latency_us"]`` (perf/plots.py draws them). Durability as each store's defaults."""
    if body_size != 100:
        pytest.skip("latency is measured at 100 B")
    bodies = make_bodies(min(20_000, message_count(impl, body_size)), body_size)
    samples = []

    def target(store):
        put = store.put
        clock = time.perf_counter_ns
        out = [0] * len(bodies)
        for i, body in enumerate(bodies):
            t0 = clock()
            put(body)
            out[i] = clock() - t0
        store.wait_visible()
        samples.append(out)

    bench.run(
        scenario="put_latency",
        cls=impl,
        body_size=body_size,
        count=len(bodies),
        target=target,
        verify=verify_written(bodies),
        note="one put per message, each timed",
    )
    lat = sorted(x for run in samples for x in run)
    pct = {p: lat[min(len(lat) - 1, int(len(lat) * p / 100))] / 1000 for p in (50, 90, 99, 99.9)}
    bench.benchmark.extra_info["latency_us"] = {str(k): round(v, 2) for k, v in pct.items()}
