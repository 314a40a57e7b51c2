"""The running store's queue snapshot (issue 27): a cut written by the queue flush's thorough pass, read only by
an open after a crash. The writer is a real process, killed with SIGKILL after messages it wrote past the cut; the
open takes the queues the cut vouches for from it, unread, and every message put is read back exactly once, in
order, at its queue offset, whatever the file system tells of the writes after the cut (tmpfs does not change a
file's ctime for a write through a mapping to a page already written)."""

import errno
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import localmq
from helpers import kill_when_ready, patch, queue_messages, run_on_tmpfs, wait_until
from localmq.layout import CQ_UNIT_SIZE, MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2
from localmq.queues.message_store import DefaultMessageStore
from localmq.store.queue_snapshot import FRESH_NS, NOT_VOUCHED, read_snapshot

SEG = 64 * 1024
MAGIC_V1, MAGIC_V2 = (m.to_bytes(4, "big", signed=True) for m in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2))
CQ_FILE = 20 * CQ_UNIT_SIZE
KW = dict(mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=CQ_FILE)
OLD = [f"T{t}" for t in range(10)]  # written before the cut
TOUCHED = OLD[:5]  # written to again after the cut
NEW = ["N0", "N1", "N2"]  # made after the cut
QUEUES = 4
BEFORE = 25  # messages a queue before the cut: two files, the second partly written
AFTER = 3  # messages a queue after it

# The writer: messages before the cut, the cut (the first queue flush pass after the open is a thorough one, the
# next thorough one is an hour away), messages after it, then "ready" and it waits for its SIGKILL.
WRITER = textwrap.dedent(
    """
    import os, sys, time
    import localmq
    root = sys.argv[1]
    KW = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 20,
              flush_consume_queue_thorough_interval=3_600_000, flush_interval_consume_queue=2000)
    def body(t, q, i):
        return f"{t}/{q}/{i}:".encode() * 40
    st = localmq.open(root, **KW)
    for i in range(25):
        for t in [f"T{k}" for k in range(10)]:
            for q in range(4):
                st.put(t, body(t, q, i), queue_id=q)
    assert st.wait_for_dispatch(30)
    running = os.path.join(root, "config", "queues.running")
    deadline = time.monotonic() + 30
    while not os.path.exists(running):
        assert time.monotonic() < deadline, "no running snapshot"
        time.sleep(0.01)
    for i in range(25, 28):
        for t in ["T0", "T1", "T2", "T3", "T4", "N0", "N1", "N2"]:
            for q in range(4):
                st.put(t, body(t, q, i), queue_id=q)
    assert st.wait_for_dispatch(30)
    print("ready", flush=True)
    time.sleep(3600)
    """
)


def body(t, q, i):
    return f"{t}/{q}/{i}:".encode() * 40


def expected():
    want = {}
    for t in OLD + NEW:
        first = BEFORE if t in NEW else 0
        last = BEFORE + AFTER if t in TOUCHED or t in NEW else BEFORE
        for q in range(QUEUES):
            want[(t, q)] = [body(t, q, i) for i in range(first, last)]
    return want


def every_queue(st):
    """{(topic, queue id): [bodies]}, each message at its queue offset (the offsets dense from the min offset)."""
    got = {}
    for t in OLD + NEW:
        for q in range(QUEUES):
            msgs = queue_messages(st, t, q, wait=False, start=st.min_offset(t, q))
            assert [m.queue_offset for m in msgs] == list(range(st.min_offset(t, q), st.max_offset(t, q)))
            got[(t, q)] = [bytes(m.body) for m in msgs]
    return got


def crash(tmp_path, writer=WRITER):
    root = tmp_path / "s"
    script = tmp_path / "writer.py"
    script.write_text(writer)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    kill_when_ready([script, root], env, 0.05)
    assert (root / "abort").exists()
    assert (root / "config" / "queues.running").is_file()
    return root


AFTER_CUT = re.compile(r"consume queue (\S+): written after the running store's cut")


def after_cut(text):
    """The queues the open found written after the cut (their row's check failed at their first record past it)."""
    return sorted(set(AFTER_CUT.findall(text)))


def touched():
    return sorted(f"{t}-{q}" for t in TOUCHED for q in range(QUEUES))


def check_reopened(st):
    """Every message once, in order; a put after the open gets its queue's next offset."""
    want = expected()
    got = every_queue(st)
    for t in NEW:  # made after the cut: offsets from 0
        for q in range(QUEUES):
            assert st.min_offset(t, q) == 0 and st.max_offset(t, q) == AFTER
    assert got == want
    assert st.put("T7", b"next", queue_id=1).queue_offset == BEFORE
    assert st.put("T2", b"next", queue_id=3).queue_offset == BEFORE + AFTER


def test_an_open_after_a_crash_takes_the_queues_the_cut_vouches_for_and_loses_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="localmq")
    root = crash(tmp_path)
    with localmq.open(root, **KW) as st:
        rec = st.recovery
        assert rec.mode == "abnormal"
        # every queue of the cut is taken as its row; those written after it fail their row's check (their files'
        # ctimes) at their first record past the cut, met by the open's re-dispatch, and are checked then
        assert rec.cq_vouched == len(OLD) * QUEUES
        assert rec.cq_damaged == [] and rec.cq_rebuilt == {}
        assert after_cut(caplog.text) == touched()
        # the cut is kept, as it was: the next open after a crash before this session's first cut reads it again
        assert (root / "config" / "queues.running").is_file()
        # the vouched queues were neither read nor built by the open
        assert st.stats()["consume_queues_built"] == (len(TOUCHED) + len(NEW)) * QUEUES
        check_reopened(st)
    # the same store checked queue by queue (no snapshot: its clean close wrote one, removed here) agrees
    os.unlink(root / "config" / "queues.snapshot")
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == 0
        want = expected()
        want[("T7", 1)].append(b"next")
        want[("T2", 3)].append(b"next")
        assert every_queue(st) == want


def test_cuts_that_reuse_the_last_cuts_stamps_vouch_only_for_what_did_not_change(tmp_path, caplog):
    # cuts every 300 ms: the queues not written since the last cut are written with that cut's stamps (no lstat);
    # after the crash every one of those holds its row's check, and nothing is lost
    caplog.set_level(logging.INFO, logger="localmq")
    writer = WRITER.replace(
        "flush_consume_queue_thorough_interval=3_600_000", "flush_consume_queue_thorough_interval=300"
    )
    four_cuts = (
        "seen, last = 0, None\nwhile seen < 4:\n"
        "    ino = os.stat(running).st_ino if os.path.exists(running) else None\n"
        "    seen, last = seen + (ino is not None and ino != last), ino"
    )
    writer = writer.replace("while not os.path.exists(running):", four_cuts)
    root = crash(tmp_path, writer)
    with localmq.open(root, **KW) as st:
        assert st.recovery.mode == "abnormal"
        assert st.recovery.cq_vouched >= (len(OLD) - len(TOUCHED)) * QUEUES
        check_reopened(st)
    for t in OLD[len(TOUCHED) :]:  # never written after the cuts: every row held its check
        assert f"consume queue {t}-" not in caplog.text


def test_a_clean_open_reads_the_close_snapshot_and_never_the_running_one(tmp_path, caplog):
    root = crash(tmp_path)
    with localmq.open(root, **KW):
        # older than what a close leaves unvouched (the open's re-dispatch wrote the queues touched after the cut)
        time.sleep(2 * FRESH_NS / 1e9)
    assert (root / "config" / "queues.snapshot").is_file()
    running = root / "config" / "queues.running"
    # a running snapshot left beside a clean close's (written by the session before it) is not read: it is removed
    running.write_bytes(b"not a snapshot")
    with localmq.open(root, **KW) as st:
        assert st.recovery.mode != "abnormal"
        assert st.recovery.cq_vouched == (len(OLD) + len(NEW)) * QUEUES
        # the close's snapshot is the running store's first cut now (the one left there is gone)
        assert not (root / "config" / "queues.snapshot").exists()
        assert running.read_bytes()[:4] == b"LMQR"
        assert "queues.running" not in caplog.text  # not read (it would be refused, and that logged)
        assert every_queue(st) == expected()


# A clean open (the close's snapshot read) whose queue flush's first pass, and with it the first cut, is an hour away:
# one message to each queue of T5, then "ready" and it waits for its SIGKILL.
AGAIN = textwrap.dedent(
    """
    import sys, time
    import localmq
    st = localmq.open(sys.argv[1], mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 20,
                      flush_interval_consume_queue=3_600_000)
    assert st.recovery.cq_vouched == 13 * 4
    for q in range(4):
        st.put("T5", b"after the open", queue_id=q)
    assert st.wait_for_dispatch(30)
    print("ready", flush=True)
    time.sleep(3600)
    """
)


def test_a_crash_before_the_first_cut_opens_from_the_clean_close_snapshot_kept_as_the_cut(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="localmq")
    root = crash(tmp_path)
    with localmq.open(root, **KW):
        time.sleep(2 * FRESH_NS / 1e9)  # (as above: the re-dispatch's writes vouched for by the close)
    script = tmp_path / "again.py"
    script.write_text(AGAIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    kill_when_ready([script, root], env, 0.05)
    assert (root / "config" / "queues.running").read_bytes()[:4] == b"LMQR"
    caplog.clear()
    with localmq.open(root, **KW) as st:
        assert st.recovery.mode == "abnormal"
        # every queue taken as its row of the close's snapshot; T5's fail their check at their record past it
        assert st.recovery.cq_vouched == (len(OLD) + len(NEW)) * QUEUES
        assert after_cut(caplog.text) == [f"T5-{q}" for q in range(QUEUES)]
        assert st.stats()["consume_queues_built"] == QUEUES
        want = expected()
        for q in range(QUEUES):
            want[("T5", q)].append(b"after the open")
        assert every_queue(st) == want


# An open after a crash (the cut read) whose queue flush's first pass, and with it the session's first cut, is an
# hour away: one message to each queue of T5, then "ready" and it waits for its SIGKILL (a crash loop).
CRASH_AGAIN = AGAIN.replace(
    "assert st.recovery.cq_vouched == 13 * 4",
    "assert st.recovery.mode == 'abnormal' and st.recovery.cq_vouched == 10 * 4",
)


def test_a_crash_before_the_first_cut_of_a_session_opened_after_a_crash_opens_from_the_crashs_cut_kept(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="localmq")
    root = crash(tmp_path)
    running = root / "config" / "queues.running"
    cut = running.read_bytes()
    script = tmp_path / "again.py"
    script.write_text(CRASH_AGAIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    kill_when_ready([script, root], env, 0.05)
    # the open after the first crash kept the cut it read, as it was: this session wrote none of its own
    assert running.read_bytes() == cut
    with localmq.open(root, **KW) as st:
        assert st.recovery.mode == "abnormal"
        # the cut's queues taken as its rows again; those written after it, before the first crash (T0..T4) or by
        # the session between the crashes (T5), fail their row's check at their first record past the cut
        assert st.recovery.cq_vouched == len(OLD) * QUEUES
        assert after_cut(caplog.text) == sorted(touched() + [f"T5-{q}" for q in range(QUEUES)])
        want = expected()
        for q in range(QUEUES):
            want[("T5", q)].append(b"after the open")
        assert every_queue(st) == want
        assert st.put("T5", b"next", queue_id=2).queue_offset == BEFORE + 1


def test_an_open_after_a_crash_that_repaired_the_log_before_the_cut_keeps_no_cut(tmp_path):
    root = crash(tmp_path)
    kw = dict(KW, check_crc_on_recover=True)
    snap = read_snapshot(str(root), str(root / "checkpoint"), str(root / "commitlog"), CQ_FILE, SEG, running=True)
    # a record before the cut's end, in the segment that holds the cut (the one a cut allows to change): its body
    # damaged, so that recovery replaces it by a gap record and resynchronises on the next one
    base = snap.log_end // SEG * SEG
    seg = root / "commitlog" / f"{base:020d}"
    data = seg.read_bytes()
    pos, starts = 0, []
    while base + pos < snap.log_end:
        starts.append(pos)
        pos += int.from_bytes(data[pos : pos + 4], "big")
    assert len(starts) >= 3
    patch(seg, starts[-2] + 200, b"\0" * 16)
    with localmq.open(root, **dict(kw, flush_interval_consume_queue=3_600_000)) as st:
        assert st.recovery.gaps and st.recovery.gaps[0]["offset"] == base + starts[-2]
        assert st.recovery.cq_vouched == 0  # every queue checked: the log changed before the cut
        assert not (root / "config" / "queues.running").exists()  # and the cut is not kept


def records_after(root, start):
    """[(offset, size, (topic, queue id, i) or None)] of the records from ``start`` on (the writer's bodies say
    whose; None: another body)."""
    out = []
    for name in sorted(os.listdir(root / "commitlog")):
        base = int(name)
        data = (root / "commitlog" / name).read_bytes()
        pos = max(0, start - base)
        if pos >= len(data):
            continue
        while pos + 8 <= len(data):
            size = int.from_bytes(data[pos : pos + 4], "big")
            if size <= 0 or data[pos + 4 : pos + 8] not in (MAGIC_V1, MAGIC_V2):  # the end of the data or a blank
                break
            found = re.search(rb"([TN]\d)/(\d)/(\d+):", data[pos : pos + size])
            out.append((base + pos, size, (found[1].decode(), int(found[2]), int(found[3])) if found else None))
            pos += size
    return out


@pytest.mark.parametrize(
    "kept,which",
    [(False, "middle"), (True, "middle"), (True, "session")],
    ids=["cut", "cut-kept-by-a-crash-open", "in-the-crash-opens-session"],
)
def test_damage_past_the_cut_with_records_after_it_costs_only_its_record(tmp_path, caplog, kept, which):
    # the rows end at the cut, and the queues written after it are rows too: damage past the cut looked like a torn
    # tail to the walk, which cut the log there and dropped the valid records after it (their queue offsets given
    # again), or it built such a row to check the records after it against, whose repair re-dispatched into the
    # damage (the open failed); a full check writes a gap record instead. ``kept``: a crash loop's second open, which
    # reads the same cut kept by the first, whose session wrote after it as well ("session": the damage among the
    # records of that session, past every queue the open loads from its files)
    root = crash(tmp_path)
    if kept:
        script = tmp_path / "again.py"
        script.write_text(CRASH_AGAIN)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        kill_when_ready([script, root], env, 0.05)
    snap = read_snapshot(str(root), str(root / "checkpoint"), str(root / "commitlog"), CQ_FILE, SEG, running=True)
    after = records_after(root, snap.log_end)
    assert len(after) > 10
    at, _, key = after[len(after) // 2 if which == "middle" else -3]  # valid records after it
    # (the crash open's session put one message to each queue of T5, in queue order, its body "after the open")
    topic, qid, i = key if which == "middle" else ("T5", 1, BEFORE)
    assert (key is None) == (which == "session")
    seg = root / "commitlog" / f"{at // SEG * SEG:020d}"
    patch(seg, at % SEG + 4, b"\xde\xad\xbe\xef")  # its magic code garbled
    caplog.set_level(logging.WARNING, logger="localmq")
    with localmq.open(root, **KW) as st:
        rec = st.recovery
        assert [g["offset"] for g in rec.gaps] == [at] and rec.dropped_at is None
        assert "past the running store's cut, with records after it" in caplog.text
        assert rec.cq_vouched == 0
        want = expected()
        if kept:
            for q in range(QUEUES):
                want[("T5", q)].append(b"after the open")
        for t, q in want:
            got = []
            for off in range(st.min_offset(t, q), st.max_offset(t, q)):
                try:
                    got += [bytes(m.body) for m in st.get_message(t, q, off, 1).messages]
                except localmq.CorruptMessageError as e:  # the damaged record's unit
                    assert e.queue_offset == off
                    got.append(None)
            lost = [k for k, b in enumerate(want[(t, q)]) if b != (got[k] if k < len(got) else b"")]
            assert lost == ([i - st.min_offset(t, q)] if (t, q) == (topic, qid) else []), (t, q, lost)
            assert len(got) == len(want[(t, q)])
            assert st.put(t, b"next", queue_id=q).queue_offset == st.min_offset(t, q) + len(got)


def test_an_old_segment_changed_after_the_cut_turns_every_queue_back_to_the_checks(tmp_path, caplog):
    root = crash(tmp_path)
    segments = sorted(os.listdir(root / "commitlog"))
    assert len(segments) > 3
    os.utime(root / "commitlog" / segments[1])  # its ctime moves: nothing before the cut is vouched for
    with localmq.open(root, **KW) as st:
        assert "changed since" in caplog.text
        assert st.recovery.cq_vouched == 0
        assert every_queue(st) == expected()


def test_a_vouched_queue_damaged_after_the_crash_is_checked_and_only_its_damaged_unit_is_lost(tmp_path):
    root = crash(tmp_path)
    qdir = root / "consumequeue" / "T8" / "2"
    first = sorted(os.listdir(qdir))[0]
    patch(qdir / first, 5 * CQ_UNIT_SIZE, b"\xff" * CQ_UNIT_SIZE)  # unit 5 points nowhere: its file's ctime moves
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(OLD) * QUEUES
        assert every_queue(st) == expected()  # checked on its first use: the bad unit cut, indexed again
        assert "T8-2" in st.recovery.cq_rebuilt


def test_a_failed_open_after_a_crash_gives_the_running_snapshot_back(tmp_path):
    root = crash(tmp_path)
    before = (root / "config" / "queues.running").read_bytes()
    middle = root / "commitlog" / sorted(os.listdir(root / "commitlog"))[1]
    os.rename(middle, tmp_path / "aside")
    with pytest.raises(localmq.DamagedLogError):
        localmq.open(root, **KW)
    assert (root / "config" / "queues.running").read_bytes() == before
    os.rename(tmp_path / "aside", middle)
    with localmq.open(root, **KW) as st:
        # the segment moved back has another ctime (a rename changes it): the cut is not believed
        assert st.recovery.cq_vouched == 0
        assert every_queue(st) == expected()


# run on a fresh tmpfs (run_on_tmpfs): the writer killed there, then what follows
TMPFS_CRASHED = """
import errno, json, os, shutil, subprocess, sys, time, signal
import localmq
sys.path.insert(0, {tests!r})
import test_running_snapshot as t
from helpers import wait_until
mnt = sys.argv[1]
root = os.path.join(mnt, "s")
script = os.path.join(mnt, "writer.py")
with open(script, "w") as f:
    f.write(t.WRITER)
proc = subprocess.Popen([sys.executable, script, root], stdout=subprocess.PIPE)
assert proc.stdout.readline().strip() == b"ready"
proc.send_signal(signal.SIGKILL)
proc.wait(30)
"""

TMPFS_CHECK = TMPFS_CRASHED + textwrap.dedent(
    """
    import io, logging
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logging.getLogger("localmq").addHandler(handler)
    logging.getLogger("localmq").setLevel(logging.INFO)
    with localmq.open(root, **t.KW) as st:
        vouched = st.recovery.cq_vouched
        repaired = sorted(st.recovery.cq_rebuilt)
        t.check_reopened(st)
    print(json.dumps({{"vouched": vouched, "repaired": repaired, "after_cut": t.after_cut(buf.getvalue())}}))
    """
)


def test_on_tmpfs_writes_after_the_cut_the_ctime_misses_are_found_by_the_row_check(tmp_path):
    # on tmpfs a write through a mapping to a page written before does not change the file's ctime (Linux 6.x):
    # the queues written after the cut keep the ctimes the cut recorded; the check of each row on its first use
    # finds units past its max offset, and the queue is checked against the log as after any crash
    tests = os.path.dirname(os.path.abspath(__file__))
    p = run_on_tmpfs(tmp_path, TMPFS_CHECK.format(tests=tests), "64m")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["vouched"] == len(OLD) * QUEUES
    assert out["repaired"] == []  # nothing cut: the units after the cut match the log
    assert out["after_cut"] == touched()  # each found by its unit past the row's max offset (the ctime kept)


TMPFS_FULL = TMPFS_CRASHED + textwrap.dedent(
    """
    # the queues made after the cut lose their files (derived data: the open makes them again from the log), and the
    # disk is full: the open's re-dispatch past the cut cannot make them
    for topic in t.NEW:
        shutil.rmtree(os.path.join(root, "consumequeue", topic))
    # the segments the writer made ahead hold no record: gone too, as the open's recovery would delete them (their
    # blocks would make room for the queues' files)
    log_dir = os.path.join(root, "commitlog")
    for name in sorted(os.listdir(log_dir), reverse=True):
        with open(os.path.join(log_dir, name), "rb") as f:
            if any(f.read()):
                break
        os.unlink(os.path.join(log_dir, name))
    ballast = os.path.join(mnt, "ballast")
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    st = localmq.open(root, **t.KW)
    try:
        blocked = st.recovery.dispatch_blocked
        vouched = st.recovery.cq_vouched
        assert blocked is not None and "No space left" in blocked, blocked
        # what the cut vouches for and the log indexed is readable meanwhile, each message once at its offset
        for topic in t.OLD:
            for q in range(t.QUEUES):
                want = t.expected()[(topic, q)]
                got = [bytes(m.body) for m in t.queue_messages(st, topic, q, wait=False)]
                assert got == want[: len(got)], (topic, q)
                if topic not in t.TOUCHED:
                    assert got == want, (topic, q)
        os.unlink(ballast)  # space returns: the dispatcher, retrying every 100 ms, makes the files and goes on
        assert st.wait_for_dispatch(30), st.stats()["dispatch_blocked"]
        assert wait_until(lambda: st.stats()["dispatch_blocked"] is None)
        t.check_reopened(st)
    finally:
        st.close()
    want = t.expected()
    want[("T7", 1)].append(b"next")  # check_reopened's puts
    want[("T2", 3)].append(b"next")
    with localmq.open(root, **t.KW) as st:
        assert st.recovery.mode == "normal"
        assert t.every_queue(st) == want
    print(json.dumps({{"vouched": vouched, "blocked": blocked}}))
    """
)


def test_a_full_disk_blocks_the_redispatch_past_the_cut_and_loses_nothing_once_space_returns(tmp_path):
    # the open after a crash re-dispatches from the cut; the queues made after it have to be made again (their files
    # are gone) on a full disk: the open goes on with the dispatch blocked, the cut's queues readable, and once space
    # returns every message is indexed once, at its queue offset (the factory steps over the rows' records before
    # the cut by the dispatcher's own position, also when the dispatch resumes later)
    tests = os.path.dirname(os.path.abspath(__file__))
    p = run_on_tmpfs(tmp_path, TMPFS_FULL.format(tests=tests), "8m")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["vouched"] == len(OLD) * QUEUES


def test_a_queue_whose_file_goes_while_a_cut_is_written_leaves_its_topic_to_the_open_listing(tmp_path):
    # retention may delete a queue's first file between the cut and its writing: the queue is then not in the
    # topic's row, so the topic's directory must not be vouched for (the open would take the topic's queues from
    # the rows and never see that one)
    root = tmp_path / "s"
    with localmq.open(root, **KW, flush_consume_queue_thorough_interval=3_600_000) as st:
        for i in range(BEFORE):
            for q in range(QUEUES):
                st.put("R", body("R", q, i), queue_id=q)
        assert st.wait_for_dispatch(10)
        time.sleep(2 * FRESH_NS / 1e9)
        svc = st._cq_flush_service
        cut = svc.take_cut()
        qdir = root / "consumequeue" / "R" / "3"
        os.unlink(qdir / sorted(os.listdir(qdir))[0])  # as retention unlinks an expired file
        assert wait_until(lambda: svc.write_cut(cut))
        snap = read_snapshot(str(root), str(root / "checkpoint"), str(root / "commitlog"), CQ_FILE, SEG, running=True)
        assert snap is not None and snap.running
        assert snap.topics["R"].dir_ctime == NOT_VOUCHED
        assert sorted(snap.topics["R"].qids) == [0, 1, 2]  # the other three still vouched for, each its own row


def test_a_failed_open_after_rows_were_checked_changes_no_byte_of_the_queues(tmp_path, monkeypatch):
    # the open builds the queues written after the cut during its re-dispatch and checks them; an open that fails
    # after that leaves every queue file as the crash left it, and the running snapshot in place
    root = crash(tmp_path)
    files = lambda: {p: p.read_bytes() for p in sorted((root / "consumequeue").rglob("*")) if p.is_file()}  # noqa: E731
    before = files()
    running = (root / "config" / "queues.running").read_bytes()

    def fail(self, last_exit_ok):
        raise OSError(errno.EIO, "injected: the index cannot be read")

    monkeypatch.setattr(DefaultMessageStore, "_load_index", fail)
    with pytest.raises(OSError, match="injected"):
        localmq.open(root, **KW)
    monkeypatch.undo()
    assert files() == before
    assert (root / "config" / "queues.running").read_bytes() == running
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(OLD) * QUEUES
        check_reopened(st)


# The session after a clean open whose recovery cut the log's damaged tail: the store's dispatcher stopped (so that
# the put it makes next is not dispatched before the kill), a put to A, SIGKILL.
CUT_TAIL = textwrap.dedent(
    """
    import os, signal, sys
    import localmq
    st = localmq.open(sys.argv[1], mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 100,
                      flush_interval_consume_queue=3_600_000)
    assert st.recovery.dropped_at is not None
    st._stop_service(st._reput_service)
    st.put("A", b"R" * 1500, queue_id=0)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def closed_with_a_torn_tail(root, kw):
    """A and B, 20 messages each, then one more to B whose record's header is torn behind the store before its clean
    close (size and magic kept, the rest garbage); returns the torn record's offset."""
    with localmq.open(root, **kw) as st:
        for i in range(20):
            st.put("A", b"a%d" % i * 10, queue_id=0)
            st.put("B", b"b%d" % i * 10, queue_id=0)
        last = st.put("B", b"L" * 800, queue_id=0)
        assert st.wait_for_dispatch(10)
        st.flush()
        seg = root / "commitlog" / sorted(os.listdir(root / "commitlog"))[0]
        with open(seg, "r+b") as f:
            f.seek(last.physical_offset + 8)
            f.write(bytes(range(7, 63)))
        time.sleep(2 * FRESH_NS / 1e9)
    return last.physical_offset


def test_a_clean_open_whose_recovery_cut_the_log_keeps_no_first_cut_and_loses_nothing_after_a_crash(tmp_path):
    # the close's snapshot vouches for A's row up to the close's log end; the open cuts the torn record below it, so
    # a put lands in what the snapshot calls A's past: kept as the first cut, it made the open after a crash step
    # over that put (a review found it: the message lost, its queue offset given again)
    kw = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 100)
    root = tmp_path / "s"
    torn = closed_with_a_torn_tail(root, kw)
    with localmq.open(root, **kw) as st:  # its dispatcher starts at the log's new end, not at the rows' old one
        assert st.recovery.dropped_at == torn
        assert not (root / "config" / "queues.running").exists()
        assert st.put("A", b"after", queue_id=0).queue_offset == 20
        assert st.wait_for_dispatch(10) and st._reput.error is None
        assert [bytes(m.body) for m in queue_messages(st, "A", 0)][-1] == b"after"
    # the same, the session killed before its put to A is dispatched
    root = tmp_path / "s2"
    closed_with_a_torn_tail(root, kw)
    script = tmp_path / "cut_tail.py"
    script.write_text(CUT_TAIL)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, str(script), str(root)], env=env, capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr
    with localmq.open(root, **kw) as st:
        assert st.recovery.mode == "abnormal"
        bodies = [bytes(m.body) for m in queue_messages(st, "A", 0)]
        assert len(bodies) == 21 and bodies[-1] == b"R" * 1500
        assert st.put("A", b"next", queue_id=0).queue_offset == 21


def test_a_failed_open_after_the_close_snapshot_became_the_first_cut_changes_nothing(tmp_path, monkeypatch):
    # a clean close leaves the session's last cut beside its snapshot; an open that fails after it wrote the first
    # cut gives both back as they were
    import hashlib

    import localmq.queues.message_store as message_store

    kw = dict(KW, flush_consume_queue_thorough_interval=200)
    root = tmp_path / "s"
    with localmq.open(root, **kw) as st:
        for i in range(50):
            st.put("A", b"x" * 100, queue_id=i % 4)
        assert wait_until(lambda: (root / "config" / "queues.running").exists(), 30)
        st.put("B", b"y" * 100, queue_id=0)  # after the cut: the close's snapshot differs from it
        assert st.wait_for_dispatch(10)
        time.sleep(2 * FRESH_NS / 1e9)

    def files():
        return {
            os.path.relpath(os.path.join(d, n), root): hashlib.sha1(Path(d, n).read_bytes()).hexdigest()
            for d, _, names in os.walk(root)
            for n in names
        }

    before = files()
    assert {"config/queues.running", "config/queues.snapshot"} <= set(before)

    def fails(*a, **k):
        assert (root / "config" / "queues.running").read_bytes()[:4] == b"LMQR"  # the first cut is written
        assert not (root / "config" / "queues.snapshot").exists()
        raise OSError(errno.EIO, "injected", str(root))

    monkeypatch.setattr(message_store, "check_log_start", fails)
    with pytest.raises(localmq.LocalMQError):
        localmq.open(root, **kw)
    monkeypatch.undo()
    assert files() == before
    with localmq.open(root, **kw) as st:
        assert st.recovery.cq_vouched == 5
