"""kill -9 of a process producing and consuming: no acknowledged message lost, committed offsets never go back
and a restarted consumer neither skips nor rewinds past its commit (Embedded and Local queues)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import localmq
from localmq.store.config_json import read_config_json

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import sys
    import localmq
    path, kind, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "local":
        mq = localmq.open(path, mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=20 * 512)
    else:
        mq = localmq.open(path, kind="embedded", partition_size=64 * 1024, flush_interval_ms=20)
    p = mq.create_producer(queue_id=0)
    c = mq.create_consumer("g", "T", batch_size=8, auto_commit=kind == "embedded")
    out = sys.stdout
    out.write("READY %s\\n" % c.committed("T", 0))
    out.flush()
    seq = start
    while True:
        r = p.send("T", b"%d" % seq, keys="k%d" % seq)
        out.write("S %d %d\\n" % (seq, r.queue_offset))
        seq += 1
        msgs = c.poll_batch(5, timeout=0)
        for m in msgs:
            out.write("D %d %s\\n" % (m.queue_offset, m.body.decode()))
        if msgs:
            c.commit()
            out.write("C %d\\n" % c.committed("T", 0))
        out.flush()
""")


def run_round(path, kind, start, lines_before_kill):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), kind, str(start)], stdout=subprocess.PIPE, env=env, text=True
    )
    lines = []
    try:
        deadline = time.monotonic() + 60
        while len(lines) < lines_before_kill and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.split())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # lines the child wrote before it died count too: they were written after the acknowledgment
        lines += [ln.split() for ln in proc.stdout.read().splitlines() if ln.strip()]
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    # a line cut by the kill is not an acknowledgment
    return [
        ln
        for ln in lines
        if ln and (ln[0] == "READY" and len(ln) == 2 or len(ln) == 3 or ln[0] == "C" and len(ln) == 2)
    ]


@pytest.mark.parametrize("kind", ["embedded", "local"])
def test_sigkill_loses_nothing_acknowledged_and_offsets_never_go_back(tmp_path, kind):
    path = tmp_path / "q"
    acked = {}  # seq -> queue offset
    last_commit = None
    seq = 0
    for rnd in range(3):
        lines = run_round(path, kind, seq, 3000 + 1000 * rnd)
        ready = lines[0]
        assert ready[0] == "READY"
        restart_commit = None if ready[1] == "None" else int(ready[1])
        if last_commit is not None:
            assert restart_commit is not None and restart_commit >= last_commit, "offset went backwards"
        delivered = [int(ln[1]) for ln in lines if ln[0] == "D"]
        if delivered:
            # the restarted consumer resumes exactly at its commit: nothing skipped, nothing before it
            assert delivered[0] == (restart_commit or 0)
            assert delivered == list(range(delivered[0], delivered[0] + len(delivered)))
        for ln in lines:
            if ln[0] == "S":
                acked[int(ln[1])] = int(ln[2])
            elif ln[0] == "C":
                last_commit = int(ln[1])
        assert acked, "the child acknowledged nothing"
        seq = max(acked) + 1
        doc = read_config_json(path / "config" / "consumerOffset.json", default=None)
        if last_commit is not None:
            # commit() is durable when it returns
            assert doc["offsetTable"]["T@g"][0] >= last_commit
    if kind == "local":
        mq = localmq.open(path, mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=20 * 512)
    else:
        mq = localmq.open(path, kind="embedded", partition_size=64 * 1024)
    try:
        if isinstance(mq, localmq.LocalMessageQueue):
            mq.wait_for_dispatch(10)
        stored = {}
        off = 0
        while True:
            r = mq.get_message("T", 0, off, 256)
            if not r.messages:
                break
            for m in r.messages:
                stored[m.queue_offset] = int(m.body)
            off = r.next_begin_offset
        for s, qo in acked.items():
            assert stored.get(qo) == s, f"acknowledged message {s} at offset {qo} lost"
        committed = read_config_json(mq.offset_store_path)["offsetTable"]["T@g"][0]
        assert last_commit <= committed <= mq.max_offset("T", 0)
    finally:
        mq.close()
