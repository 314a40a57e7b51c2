"""The ``localmq`` command, run as a subprocess (``python -m localmq``) on real stores, closed and live."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import localmq

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "shared_worker.py"
# the worker's segment sizes (tests/shared_worker.py KW), so one store serves both
KW = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 1024)
# this checkout's localmq in every subprocess (a script's sys.path starts at its own directory, not the cwd)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
COMMANDS = ["stats", "topics", "lag", "tail", "query", "verify", "dump", "demo"]


def run(*args, timeout=120, check_rc=None):
    p = subprocess.run(
        [sys.executable, "-m", "localmq", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )
    assert "Traceback" not in p.stderr, p.stderr
    if check_rc is not None:
        assert p.returncode == check_rc, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


def run_json(*args):
    p = run(*args, "--json", check_rc=0)
    return json.loads(p.stdout)


def run_lines(*args):
    p = run(*args, "--json", check_rc=0)
    return [json.loads(line) for line in p.stdout.splitlines()]


def body(topic, qid, i):
    return f"{topic}-{qid}-{i:05d}-".encode() * 3


def write_store(path, per_queue=150, topics=("A", "B"), queues=3):
    """A closed store; returns {(topic, qid): [PutResult...]} of what was written."""
    written = {}
    with localmq.open(path, **KW) as st:
        for i in range(per_queue):
            for t in topics:
                for q in range(queues):
                    r = st.put(
                        t,
                        body(t, q, i),
                        queue_id=q,
                        tags="even" if i % 2 == 0 else "odd",
                        keys=[f"{t}-k{q}-{i}"],
                        properties={"UNIQ_KEY": f"U-{t}-{q}-{i}"},
                    )
                    assert r.ok
                    written.setdefault((t, q), []).append(r)
        st.wait_for_dispatch()
        with st.create_consumer("billing", "A") as c:
            got = 0
            while got < min(100, 3 * per_queue):
                got += len(c.poll_batch(32, timeout=1.0))
            c.commit()
    return written


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    return path, write_store(path)


def snapshot(path):
    out = {}
    for dirpath, _, names in os.walk(path):
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[p] = (hashlib.sha1(f.read()).hexdigest(), st.st_mtime_ns, st.st_size)
    return out


# -- help and usage -----------------------------------------------------------------------------------------


def test_help_for_every_command():
    p = run("--help", check_rc=0)
    for c in COMMANDS:
        assert c in p.stdout
        q = run(c, "--help", check_rc=0)
        assert q.stdout.startswith("usage: localmq " + c) and "--json" in q.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--queues", "0"],
        ["demo", "--messages", "-1"],
        ["demo", "--topics", "x"],
        ["query", "somewhere"],
        ["dump", "somewhere", "--limit", "-1"],
        ["tail", "somewhere"],
        [],
        ["nosuchcommand"],
        ["query", "somewhere", "--key", "k", "--id", "00"],
        ["dump", "somewhere", "--since", "yesterday"],
    ],
)
def test_argument_errors_are_usage_errors(args):
    p = run(*args, check_rc=2)
    assert "usage:" in p.stderr


def test_a_path_that_is_not_a_store(tmp_path):
    for c in ("stats", "topics", "verify", "dump"):
        p = run(c, tmp_path / "nothing", check_rc=1)
        assert "nothing" in p.stderr
    (tmp_path / "plain").write_bytes(b"not a store")
    for c in ("stats", "topics", "verify", "lag"):
        p = run(c, tmp_path / "plain", check_rc=1)
        assert "this is a file" in p.stderr and "no such directory" not in p.stderr


def test_version_and_help_of_every_argument():
    p = run("--version", check_rc=0)
    assert p.stdout.split() == ["localmq", localmq.__version__]
    # every argument of every command says what it is (argparse prints an argument without help as a bare name)
    from localmq.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if a.choices and "stats" in a.choices)
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help, f"localmq {name}: {action.option_strings or action.dest} has no help"
    q = run("dlq", "--help", check_rc=0)
    assert "%DLQ%<group>" in q.stdout and "%%" not in q.stdout


def test_main_puts_the_sigterm_handler_back(tmp_path):
    """main() lets SIGTERM stop a command as Ctrl-C does, only while it runs: a program that calls it (and the
    processes it forks afterwards) keeps its own handler. Issue 23: a forked Pool worker that inherited the CLI's
    handler could lose Pool.terminate()'s SIGTERM, and the test run hung."""
    from localmq.cli import main

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["stats", str(tmp_path / "nothing")]) == 1
        assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(SystemExit):
            main(["--version"])
        assert signal.getsignal(signal.SIGTERM) is mine
        # from another thread (where no handler can be installed) it runs and changes nothing
        out = []
        t = threading.Thread(target=lambda: out.append(main(["stats", str(tmp_path / "nothing")])))
        t.start()
        t.join(60)
        assert out == [1] and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_console_script_runs_the_same_main():
    assert 'localmq = "localmq.cli:main"' in (REPO / "pyproject.toml").read_text()
    assert "from localmq.cli import main" in (REPO / "localmq" / "__main__.py").read_text()


# -- a closed store -----------------------------------------------------------------------------------------


def test_no_command_modifies_a_closed_store(store):
    path, written = store
    before = snapshot(path)
    a0 = written[("A", 0)]
    for args in (
        ["stats", path],
        ["topics", path],
        ["lag", path, "--group", "billing"],
        ["tail", path, "A"],
        ["query", path, "--topic", "A", "--key", "A-k0-3"],
        ["query", path, "--id", a0[5].msg_id],
        ["query", path, "--uniq-key", "U-B-1-7"],
        ["query", path, "--topic", "B", "--time", "0"],
        ["verify", path],
        ["dump", path, "--limit", "0"],
    ):
        run(*args, check_rc=0)
        run(*args, "--json", check_rc=0)
        assert snapshot(path) == before, args


def test_stats_and_topics_match_what_was_written(store):
    path, written = store
    s = run_json("stats", path)
    assert s["state"] == "closed" and s["clean_exit"] is True
    assert s["messages"] == sum(len(v) for v in written.values()) == 900
    assert s["queues"] == 6 and s["topics"] == 2
    last = max(r.physical_offset + r.wrote_bytes for v in written.values() for r in v)
    assert s["commit_log"]["end"] == last == s["dispatch"]["dispatched_end"]
    assert s["dispatch"]["behind_bytes"] == 0
    assert s["commit_log"]["segments"] == len(os.listdir(path / "commitlog")) >= 3
    t = run_json("topics", path)["queues"]
    assert {(r["topic"], r["queue_id"]): (r["min_offset"], r["max_offset"], r["messages"]) for r in t} == {
        k: (0, len(v), len(v)) for k, v in written.items()
    }
    assert len(run_json("topics", path, "--topic", "B")["queues"]) == 3
    run("topics", path, "--topic", "C", check_rc=1)
    text = run("stats", path, check_rc=0).stdout
    assert "900 in 6 queue(s) of 2 topic(s)" in text


def test_lag_from_the_committed_offsets(store):
    path, written = store
    rows = run_json("lag", path, "--group", "billing")["lag"]
    assert {(r["topic"], r["queue_id"]) for r in rows} == {("A", 0), ("A", 1), ("A", 2)}
    committed = sum(r["committed"] for r in rows)
    assert committed >= 100
    assert sum(r["lag"] for r in rows) == 450 - committed
    for r in rows:
        assert r["max_offset"] == len(written[("A", r["queue_id"])])
    p = run("lag", path, "--group", "nobody", check_rc=1)
    assert "nobody" in p.stderr


def test_query_by_key_id_uniq_key_and_time(store):
    path, written = store
    (m,) = run_lines("query", path, "--topic", "A", "--key", "A-k2-17")
    assert m["body"].encode() == body("A", 2, 17) and m["queue_offset"] == 17
    r = written[("B", 1)][40]
    (m,) = run_lines("query", path, "--id", r.msg_id)
    assert (m["topic"], m["queue_id"], m["queue_offset"]) == ("B", 1, 40)
    (m,) = run_lines("query", path, "--uniq-key", "U-A-0-99")
    assert m["body"].encode() == body("A", 0, 99)
    found = run_lines("query", path, "--topic", "B", "--time", "0")
    assert sorted((m["queue_id"], m["queue_offset"]) for m in found) == [(0, 0), (1, 0), (2, 0)]
    later = run_lines("query", path, "--topic", "A", "--queue", "1", "--time", str(found[0]["store_timestamp"] + 1))
    assert len(later) == 1 and later[0]["store_timestamp"] > found[0]["store_timestamp"]
    run("query", path, "--topic", "A", "--key", "no-such-key", check_rc=1)
    run("query", path, "--id", "0" * 32, check_rc=1)
    run("query", path, "--id", "xyz", check_rc=2)
    run("query", path, "--key", "A-k2-17", check_rc=2)  # --key needs --topic


def test_tail_shows_the_last_messages_in_log_order(store):
    path, written = store
    got = run_lines("tail", path, "A", "-n", "4")
    want = sorted((r for q in range(3) for r in written[("A", q)]), key=lambda r: r.physical_offset)[-4:]
    assert [m["physical_offset"] for m in got] == [r.physical_offset for r in want]
    got = run_lines("tail", path, "A", "-n", "3", "--queue", "2")
    assert [m["queue_offset"] for m in got] == [147, 148, 149]
    assert [m["body"].encode() for m in got] == [body("A", 2, i) for i in (147, 148, 149)]
    run("tail", path, "C", check_rc=1)


def test_dump_on_the_store_root_with_filters(store):
    path, written = store
    every = run_lines("dump", path, "--limit", "0")
    assert len(every) == 900
    assert [m["physical_offset"] for m in every] == sorted(r.physical_offset for v in written.values() for r in v)
    got = run_lines("dump", path, "--topic", "B", "--queue", "1", "--offset", "100", "--limit", "5")
    assert [(m["topic"], m["queue_id"], m["queue_offset"]) for m in got] == [("B", 1, i) for i in range(100, 105)]
    assert [m["body"].encode() for m in got] == [body("B", 1, i) for i in range(100, 105)]
    t = every[450]["store_timestamp"]
    since = run_lines("dump", path, "--since", str(t), "--limit", "0")
    assert since and all(m["store_timestamp"] >= t for m in since)
    assert len(since) == sum(1 for m in every if m["store_timestamp"] >= t)
    until = run_lines("dump", path, "--until", str(t), "--limit", "0")
    assert len(until) + len(since) == 900 + sum(1 for m in every if m["store_timestamp"] == t)
    start = every[300]["physical_offset"]
    assert run_lines("dump", path, "--start", start, "--limit", "1")[0]["physical_offset"] == start
    run("dump", path, "--start", start + 1, check_rc=2)
    # the commitlog directory and one segment file, as before
    assert len(run_lines("dump", path / "commitlog", "--limit", "3")) == 3
    seg = sorted((path / "commitlog").iterdir())[1]
    assert run_lines("dump", seg, "--limit", "1")[0]["physical_offset"] == int(seg.name)


def test_dump_limit_stops_early(tmp_path):
    path = tmp_path / "big"
    with localmq.open(path, **KW) as st:
        st.put_batch("T", [b"x" * 900] * 3000, queue_id=0)
    segments = len(os.listdir(path / "commitlog"))
    assert segments > 40
    p = run("dump", path, "--limit", "5", check_rc=0)
    assert len(p.stdout.splitlines()) == 6
    assert re.search(r"read from 1 segment\(s\).*stopped: limit", p.stdout), p.stdout
    p = run("dump", path, "--limit", "0", "--topic", "none", check_rc=0)
    assert re.search(rf"0 read|read from {segments} segment\(s\)", p.stdout), p.stdout
    # --offset with --topic and --queue jumps to its segment
    p = run("dump", path, "--topic", "T", "--queue", "0", "--offset", "2990", "--limit", "1", check_rc=0)
    assert "T/0@2990" in p.stdout and "read from 1 segment(s)" in p.stdout


def test_verify_clean_then_a_flipped_body_byte_in_an_older_segment(store):
    path, written = store
    p = run("verify", path, check_rc=0)
    assert p.stdout.splitlines()[-1].startswith("ok: 900 records")
    v = run_json("verify", path)
    assert v["ok"] and v["records"] == 900 and v["consume_queue_units"] == 900 and v["problems"] == []
    r = written[("A", 1)][3]  # in the first segment, with many after it
    assert r.physical_offset < KW["mapped_file_size_commit_log"]
    seg = path / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as f:
        f.seek(r.physical_offset)
        raw = f.read(r.wrote_bytes)
        at = r.physical_offset + raw.index(body("A", 1, 3)) + 2
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    p = run("verify", path, check_rc=1)
    assert f"commit log offset {r.physical_offset:,}" in p.stdout and "bad crc" in p.stdout
    v = json.loads(run("verify", path, "--json", check_rc=1).stdout)
    assert not v["ok"] and len(v["problems"]) == 1
    assert v["records"] < 900  # the rest of that segment is not walked; the later ones are
    p = run("dump", path, "--limit", "0", check_rc=1)
    assert "damaged record" in p.stderr


def test_verify_finds_a_consume_queue_unit_that_points_elsewhere(store):
    path, _ = store
    cq = path / "consumequeue" / "B" / "2" / f"{0:020d}"
    with open(cq, "r+b") as f:
        f.seek(20 * 5)
        f.write((113).to_bytes(8, "big"))  # unit 5 now points at another record's offset
    v = json.loads(run("verify", path, "--json", check_rc=1).stdout)
    assert any("B/2@5" in p for p in v["problems"]), v["problems"]


# -- demo ---------------------------------------------------------------------------------------------------


def test_demo_twice_on_one_path(tmp_path):
    for _ in range(2):
        p = run("demo", "--path", tmp_path / "d", "--messages", "3000", "--queues", "2", check_rc=0)
        assert "verified" in p.stdout and "FAILED" not in p.stdout
        assert "the put calls alone" in p.stdout
    d = json.loads(run("demo", "--path", tmp_path / "d", "--messages", "100", "--json", check_rc=0).stdout)
    assert d["verified"] and d["read"] == 100


# -- live stores --------------------------------------------------------------------------------------------


def start_worker(role, path, **args):
    args.setdefault("config", KW)
    p = subprocess.Popen(
        [sys.executable, str(WORKER), role, str(path), json.dumps(args)],
        cwd=REPO,
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    assert line.startswith("open"), line
    return p


def stop_worker(p):
    p.kill()
    p.wait(30)
    drain = getattr(p, "drain", None)
    if drain is not None:
        drain.join(30)  # EOF now that the worker is gone
    p.stdout.close()
    p.stdin.close()


def test_commands_beside_a_live_shared_writer(tmp_path):
    path = tmp_path / "live"
    w = start_worker("produce_forever", path, name="w", queues=2, body=200)
    try:
        acked = 0
        while acked < 2000:
            assert w.stdout.readline().startswith("ack")
            acked += 1
        # the writer keeps putting only while its acks are read
        w.drain = threading.Thread(target=lambda: [None for _ in w.stdout], daemon=True)
        w.drain.start()
        s = run_json("stats", path)
        assert s["state"] == "live, shared" and s["live"]["committed_end"] > 0 and s["messages"] >= 1000
        t = run_json("topics", path)["queues"]
        assert {(r["topic"], r["queue_id"]) for r in t} == {("T", 0), ("T", 1)}
        got = run_lines("tail", path, "T", "-f", "-n", "0", "--max", "25", "--interval", "0.05")
        assert len(got) == 25
        assert all(m["body"].startswith("w-") for m in got)
        per_q = {}
        for m in got:  # new messages, dense per queue
            per_q.setdefault(m["queue_id"], []).append(m["queue_offset"])
        for offs in per_q.values():
            assert offs == list(range(offs[0], offs[0] + len(offs)))
        assert min(m["queue_offset"] for m in got) >= min(r["max_offset"] for r in t) - 1
        (m,) = run_lines("query", path, "--topic", "T", "--time", "0", "--queue", "1")
        assert m["queue_offset"] == 0
        v = run_json("verify", path)
        assert v["ok"], v["problems"]
        assert len(run_lines("dump", path, "--limit", "10")) == 10
        run("lag", path, check_rc=1)  # no group committed anything
    finally:
        stop_worker(w)


def test_a_store_held_by_one_live_process(tmp_path):
    path = tmp_path / "held"
    write_store(path, per_queue=20)
    w = start_worker("idle", path, shared=False)
    try:
        for c in ("stats", "topics", "lag"):
            p = run(c, path, check_rc=3)
            assert "held by one live process" in p.stderr
        run("tail", path, "A", check_rc=3)
        run("query", path, "--topic", "A", "--key", "A-k0-1", check_rc=3)
        assert len(run_lines("dump", path, "--limit", "0")) == 120  # files alone
        v = run_json("verify", path)
        assert v["ok"] and any("held by one live process" in n for n in v["notes"])
    finally:
        stop_worker(w)


def test_tail_follow_stops_cleanly_on_sigterm_and_ctrl_c(store):
    path, _ = store
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = subprocess.Popen(
            [sys.executable, "-m", "localmq", "tail", str(path), "A", "-f", "-n", "2", "--interval", "0.05"],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = [p.stdout.readline(), p.stdout.readline()]
            assert all("A/" in line for line in first)
            time.sleep(0.5)
            p.send_signal(sig)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, err
        assert "Traceback" not in err


def test_commands_read_an_empty_store_with_its_recorded_sizes(tmp_path):
    """A store created with non-default sizes and no message yet has no segment to read its size off: the commands
    take the sizes from config/localmq.json instead of passing the defaults (a StoreSettingsError before)."""
    store = tmp_path / "s"
    localmq.open(store, **KW).close()
    stats = run_json("stats", store)
    assert stats["messages"] == 0 and stats["commit_log"]["segment_size"] == KW["mapped_file_size_commit_log"]
    for args in (("stats",), ("topics",), ("lag",)):
        p = run(args[0], store, *args[1:])
        assert p.returncode in (0, 1) and "Error" not in p.stderr, (args, p.stderr)
