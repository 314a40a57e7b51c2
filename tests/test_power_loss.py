"""Power cuts of localmq itself (issue 24, item 2): real writer processes on powerfs, SIGKILLed, then a power cut.

Each cut: a fresh backing directory, powerfs mounted over it, a writer process (tests/power_writer.py, forked from
one server per module) opening a store on the mount with small files (64 KiB CommitLog segments, ConsumeQueue
files of 16 to 256 units, 3 topics x 2 queues, segments created ahead or not, half the cuts with at most 16 queue files
mapped, so that files are unmapped before their units are flushed) and putting a seeded workload from 1-3
threads, each acknowledgement reported on its stdout; in most cuts a consumer in it commits offsets (durable
commits), and a thread reports the flushed offset (``st.stats()["flushed_offset"]``).
The writer is SIGKILLed at a seeded moment, then ``cut(mode, seed)``. For some cuts the store is opened again
through powerfs by a second writer session (recovery through the file system), killed at a seeded moment (often
during the open) and cut again. Then the BACKING directory is opened directly with ``localmq.open`` (no FUSE, no
salvage) and checked:

* the store opens; nothing was salvaged;
* SYNC_FLUSH: every acknowledged message is there, byte for byte, at its queue offset and physical offset;
* ASYNC_FLUSH: every message acknowledged whose last byte lies below the last flushed offset the writer reported is
  there; the loss after it is measured (messages, bytes, age of the oldest lost acknowledgement);
* every mode: every message found was put (its body is the seeded body of its id, and no thread's id is past its
  last put), none twice, each queue's offsets dense from 0 (a unit lost to a gap counts as a lost message), each
  (session, thread) in order; the committed offsets of the consumer are durable (not below what a commit returned)
  and never ahead of the messages that survived in their queue; every surviving acknowledged message is found by its
  key (the index); new puts are taken and get the next queue offsets.

``LOCALMQ_POWER_CUTS=N`` runs N cuts in all (default 204: 34 per flush mode x cut mode); ``LOCALMQ_POWER_SEED=S``
replays one seed of the test named in the failure (its message gives the command); ``LOCALMQ_POWER_REPORT=path``
appends each test's figures as a JSON line (``-s`` prints them). A seed fixes the workload, the settings, the kill
delays and the cut; the threads' interleaving and the moment the kill lands are the machine's, so a replay finds the
same kind of state, not always the same bytes. The backing directories go to /dev/shm when it is writable (see
``power_dir``).

After the loop, a crash sweep of one recovery; each bug the cuts found is reproduced on its own in
tests/test_power_loss_found.py. tests/powerfs/README.md ends with the figures of these runs.

Shared stores (``shared=True``) refuse FUSE mounts (UnsupportedFilesystemError): tests/test_power_loss_shared.py
cuts them on ext4 over a loop device whose image lies on powerfs, with this module's checks.
"""

import json
import math
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import localmq
import power_writer
from localmq import GetStatus
from localmq.store.config_json import read_offset_table
from powerfs import PowerFS, PowerFSError

FLUSHES = ("SYNC_FLUSH", "ASYNC_FLUSH")
MODES = ("all", "random", "torn")
SEGMENT = 64 * 1024
TOPICS = ["pa", "pb", "pc"]
QUEUES = 2
SIZES = (16, 700)
WRITER = Path(__file__).resolve().with_name("power_writer.py")

TOTAL_CUTS = int(os.environ.get("LOCALMQ_POWER_CUTS", "204"))
CUTS_PER_TEST = max(1, math.ceil(TOTAL_CUTS / (len(FLUSHES) * len(MODES))))
REPLAY_SEED = os.environ.get("LOCALMQ_POWER_SEED")
# pytest-timeout's 300 s holds for the default run (about 30 s per test); a long run gets 3 s per cut
TIMEOUT = max(300, CUTS_PER_TEST * 3)

try:  # the per-test limit, where pytest-timeout is installed (every wait below has its own timeout too)
    import pytest_timeout  # noqa: F401

    pytestmark = pytest.mark.timeout(TIMEOUT)
except ImportError:
    pass


# -- the writer server ---------------------------------------------------------------------------------------------


class WriterServer:
    """tests/power_writer.py as a fork server: ``run(job, ...)`` forks one writer, kills it, returns its lines."""

    def __init__(self):
        self.err = tempfile.TemporaryFile()
        # the localmq this test imported (this checkout's), whatever else is installed
        here = str(Path(localmq.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=env
        )
        self.buf = b""

    def _lines(self, deadline):
        """Complete lines read so far (at least one, unless the deadline passed)."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise AssertionError(f"the writer server exited: {self.stderr()}")
                self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [ln.decode() for ln in lines]

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-4000:]

    def run(self, job, kill_after, *, from_ready=True, timeout=30.0):
        """Start ``job``; SIGKILL the writer ``kill_after`` s after its "R" line (``from_ready``) or after its start;
        wait until the server reaped it. Returns (lines, {line index: time read}, kill time)."""
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        start = time.monotonic()
        deadline = start + timeout
        pid = killed = None
        lines, times = [], {}
        kill_at = None if from_ready else start + kill_after
        try:
            while True:
                now = time.monotonic()
                if pid is not None and killed is None and kill_at is not None and now >= kill_at:
                    os.kill(pid, signal.SIGKILL)
                    killed = now
                wait_until = min(deadline, kill_at) if (kill_at is not None and killed is None) else deadline
                got = self._lines(max(wait_until, time.monotonic() + 0.001))
                if not got and time.monotonic() >= deadline:
                    raise AssertionError(f"the writer did not end within {timeout} s: {lines[-5:]}")
                for ln in got:
                    if ln.startswith("P "):
                        pid = int(ln.split()[1])
                    elif ln.startswith("E "):
                        if killed is None:
                            raise AssertionError(f"the writer exited by itself ({ln}): {lines[-5:]}\n{self.stderr()}")
                        return lines, times, killed
                    else:
                        if ln.startswith(("R ", "F ")) and from_ready:
                            kill_at = time.monotonic() + kill_after
                        elif ln.startswith("X "):
                            raise AssertionError(f"the writer failed: {ln[2:]}")
                        times[len(lines)] = time.monotonic()
                        lines.append(ln)
        except BaseException:
            if pid is not None and killed is None:
                os.kill(pid, signal.SIGKILL)
                killed = time.monotonic()
            if pid is not None:  # let the server reap it before the next job (and before any cut)
                end = time.monotonic() + 30
                while time.monotonic() < end and not any(ln.startswith("E ") for ln in self._lines(end)):
                    pass
            raise

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()
        self.err.close()


@pytest.fixture(scope="module")
def server():
    s = WriterServer()
    yield s
    s.close()


# -- one session's report ------------------------------------------------------------------------------------------


class Session:
    """What one writer session reported: acknowledgements, other outcomes, durable offsets, consumer commits."""

    def __init__(self, number, job, lines, times, killed):
        self.number, self.job, self.killed = number, job, killed
        self.lines = lines
        self.acks = {}  # (thread, i) -> (topic, qid, queue offset, physical offset, size, time read)
        self.last_put = {}  # thread -> highest i reported (acknowledged or not)
        self.durable = 0  # highest flushed offset reported
        self.commits = {}  # (topic, qid) -> highest committed offset reported
        self.recovery = None
        for n, ln in enumerate(lines):
            f = ln.split()
            if f[0] == "A":
                k, i = int(f[1]), int(f[2])
                self.acks[(k, i)] = (f[3], int(f[4]), int(f[5]), int(f[6]), int(f[7]), times[n])
                self.last_put[k] = max(self.last_put.get(k, -1), i)
            elif f[0] == "N":
                k, i = int(f[1]), int(f[2])
                self.last_put[k] = max(self.last_put.get(k, -1), i)
            elif f[0] == "D":
                self.durable = max(self.durable, int(f[1]))
            elif f[0] == "C":
                key = (f[1], int(f[2]))
                self.commits[key] = max(self.commits.get(key, -1), int(f[3]))
            elif f[0] == "R":
                self.recovery = f[1:]


# -- one cut -------------------------------------------------------------------------------------------------------


def settings(rng, flush):
    cfg = dict(
        flush_disk_type=flush,
        mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * rng.choice([16, 64, 256]),
        flush_interval_consume_queue=rng.choice([10, 100, 1000]),
        preallocate_mapped_file=rng.random() < 0.7,
    )
    # the running store's queue cut at each thorough pass (the first pass is one): often, so that cuts fall while
    # one is taken, flushed, waited for and written, and the opens after them take queues from one
    cfg["flush_consume_queue_thorough_interval"] = rng.choice([30, 200, 60_000])
    if flush == "ASYNC_FLUSH":
        cfg.update(
            flush_interval_commit_log=rng.choice([10, 50, 200, 500]), flush_commit_log_least_pages=rng.choice([0, 1, 4])
        )
    # the smallest budget of mapped queue files: queue files (16 units each, at the smallest) are unmapped while
    # their units are not flushed yet, and the ConsumeQueue flush makes them durable through a descriptor
    cfg["max_mapped_queue_files"] = rng.choice([16, 4096])
    return cfg


def job_for(rng, root, cfg, seed, session):
    return dict(
        root=str(root),
        config=cfg,
        seed=seed,
        session=session,
        threads=rng.choice([1, 2, 3]),
        topics=TOPICS,
        queues=QUEUES,
        sizes=list(SIZES),
        consumer=rng.random() < 0.6,
    )


def powerfs_mounts(under):
    """The powerfs mounts at or below the directory ``under`` (other test runs on this machine may have their own)."""
    root = os.path.realpath(under)
    with open("/proc/self/mountinfo") as f:
        return [
            line
            for line in f
            if " fuse.powerfs " in line and (line.split()[4] == root or line.split()[4].startswith(root + "/"))
        ]


def mounted(disk, mnt):
    fs = PowerFS(disk, mnt)
    try:
        fs.mount()
    except PowerFSError as e:
        pytest.fail(str(e), pytrace=False)
    return fs


def run_cut(server, base, flush, mode, seed, figures):
    """One cut (two with a recovery through powerfs), then the checks. Returns what the check measured."""
    rng = random.Random(f"{flush}/{mode}/{seed}")
    disk, mnt = base / "disk", base / "mnt"
    shutil.rmtree(disk, ignore_errors=True)
    disk.mkdir(parents=True)
    cfg = settings(rng, flush)
    sessions = []
    t0 = time.monotonic()
    fs = mounted(disk, mnt)
    try:
        job = job_for(rng, mnt / "store", cfg, seed, 1)
        lines, times, killed = server.run(job, rng.uniform(0.0, 0.4))
        sessions.append(Session(1, job, lines, times, killed))
        fs.cut(mode, rng.randrange(1 << 31))
    finally:
        fs.unmount()
    if rng.random() < 0.3:  # recovery through powerfs, cut again (often during the open)
        figures["recuts"] += 1
        fs = mounted(disk, mnt)
        try:
            job = job_for(rng, mnt / "store", cfg, seed, 2)
            lines, times, killed = server.run(job, rng.uniform(0.0, 0.5), from_ready=False)
            sessions.append(Session(2, job, lines, times, killed))
            fs.cut(mode, rng.randrange(1 << 31))
        finally:
            fs.unmount()
    check(disk / "store", cfg, flush, seed, sessions, figures)
    figures["cuts"] += 1
    figures["seconds"] += time.monotonic() - t0
    figures["per_cut"].append(time.monotonic() - t0)


def read_queue(st, topic, qid):
    """[(queue offset, Message or None for a unit lost to damage)] from 0 to the queue's max offset."""
    out, off, mx = [], 0, st.max_offset(topic, qid)
    while off < mx:
        try:
            g = st.get_message(topic, qid, off, 32)
        except localmq.CorruptMessageError as e:
            assert e.queue_offset == off, (topic, qid, off, e)
            out.append((off, None))
            off = e.next_offset
            continue
        assert g.status is GetStatus.FOUND, (topic, qid, off, mx, g)
        for m in g.messages:
            out.append((off, m))
            off += 1
        assert g.next_begin_offset == off, (topic, qid, g)
    return out


def check(root, cfg, flush, seed, sessions, figures, *, concurrent=False):
    """Open the backing directory's store and check it against what the sessions reported (module docstring).
    ``concurrent``: the sessions were processes writing at once (a shared store), so their messages interleave."""
    offsets_path = root / "config" / "consumerOffset.json"
    offset_table, _ = read_offset_table(offsets_path) if root.exists() else ({}, {})
    expected = {}  # (session, thread) -> the messages it may have put, as generated
    for s in sessions:
        for k in range(s.job["threads"]):  # up to one put in flight per thread, unreported, at the kill
            expected[(s.number, k)] = power_writer.messages(
                s.job["seed"], s.number, k, TOPICS, QUEUES, SIZES, s.last_put.get(k, -1) + 2
            )
    st = localmq.open(root, **cfg)
    try:
        rep = st.recovery
        assert not rep.salvaged, rep
        figures["opened"] += 1
        # an open after a crash that took queues from the running store's cut (config/queues.running): about none
        # here, where every queue is written all the time (a queue written within 50 ms before a cut is not vouched
        # for); tests/test_power_loss_cut.py has idle queues, whose opens after a power cut do take them from it
        figures["opened_from_cut"] += rep.mode == "abnormal" and rep.cq_vouched > 0
        figures["gaps"] += len(rep.gaps)
        figures["dropped_tails"] += rep.dropped_at is not None
        special = SPECIAL_TOPICS if any(s.job.get("special") for s in sessions) else set()
        assert set(st.topics()) <= set(TOPICS) | special, st.topics()
        found = {}  # (session, thread, i) -> (topic, qid, queue offset, physical offset, body)
        lost_units = set()  # (topic, qid, queue offset)
        for topic in TOPICS:
            for qid in range(QUEUES):
                assert st.min_offset(topic, qid) == 0
                order = {}
                for off, m in read_queue(st, topic, qid):
                    if m is None:
                        lost_units.add((topic, qid, off))
                        continue
                    assert m.queue_offset == off and m.topic == topic and m.queue_id == qid, (m, off)
                    ident = power_writer.parse_body(m.body)
                    assert ident is not None, f"a message that no writer put: {topic}-{qid}@{off} {m.body[:60]!r}"
                    s, k, i = ident
                    gen = expected.get((s, k))
                    assert gen is not None and i < len(gen), f"never put: {ident} at {topic}-{qid}@{off}"
                    _, gtopic, gqid, gbody, gkey = gen[i]
                    assert (gtopic, gqid, bytes(m.body)) == (topic, qid, gbody), f"{ident} differs at {off}"
                    assert dict(m.properties) == {"KEYS": gkey}, (
                        f"{ident} at {topic}-{qid}@{off} (commit log {m.physical_offset}): properties "
                        f"{dict(m.properties)!r}, put with KEYS {gkey!r}"
                    )
                    assert ident not in found, f"{ident} twice: {found[ident][:4]} and {(topic, qid, off)}"
                    found[ident] = (topic, qid, off, m.physical_offset, gbody)
                    prev = order.get((s, k), -1)
                    assert i > prev, f"{topic}-{qid}: {(s, k, i)} after {(s, k, prev)}"
                    order[(s, k)] = i
                    assert concurrent or all(ss <= s for ss, _ in order), (
                        f"{topic}-{qid}: session {s} before an older one"
                    )
        # acknowledgements
        lost_durable, lost = [], []
        for s in sessions:
            for (k, i), (topic, qid, qoff, phys, size, t) in s.acks.items():
                figures["acked"] += 1
                must = flush == "SYNC_FLUSH" or phys + size <= s.durable
                figures["acked_must_survive"] += must
                got = found.get((s.number, k, i))
                if got is not None:
                    assert got[:4] == (topic, qid, qoff, phys), (
                        f"{(s.number, k, i)} acknowledged at {(topic, qid, qoff, phys)}, found at {got[:4]}"
                    )
                elif must:
                    lost_durable.append(((s.number, k, i), (topic, qid, qoff, phys, size), s.durable))
                else:
                    lost.append((s, phys, size, t))
        figures["checked"] += sum(len(s.acks) for s in sessions)
        figures["lost_must_survive"] += len(lost_durable)
        assert not lost_durable, (
            f"{len(lost_durable)} acknowledged messages lost ({flush}; must survive), first "
            f"{lost_durable[:3]}; recovery {rep}"
        )
        if flush == "ASYNC_FLUSH":
            # what was lost after the last reported durable offset: messages, bytes, how far past it, and how long
            # before the kill the oldest lost message was acknowledged
            figures["async_cuts"].append(
                dict(
                    interval_ms=cfg["flush_interval_commit_log"],
                    least_pages=cfg["flush_commit_log_least_pages"],
                    acked_past_durable=sum(
                        1 for s in sessions for (_, _, _, phys, size, _) in s.acks.values() if phys + size > s.durable
                    ),
                    lost_msgs=len(lost),
                    lost_bytes=sum(size for _, _, size, _ in lost),
                    past_durable_bytes=max((phys + size - s.durable for s, phys, size, _ in lost), default=0),
                    oldest_lost_ms=round(max(((s.killed - t) * 1000 for s, _, _, t in lost), default=0.0), 1),
                )
            )
        # nothing past what each thread put (one put in flight per thread at the kill)
        for s, k, i in found:
            sess = next(x for x in sessions if x.number == s)
            assert i <= sess.last_put.get(k, -1) + 1, f"{(s, k, i)}: thread {k} reported up to {sess.last_put.get(k)}"
        figures["lost_units"] += len(lost_units)
        # consumer offsets: durable, and never ahead of what survived
        for topic in TOPICS:
            row = offset_table.get(f"{topic}@{power_writer.GROUP}", {})
            for qid, off in row.items():
                figures["offsets_checked"] += 1
                assert off <= st.max_offset(topic, qid), (
                    f"committed offset {off} of {topic}-{qid} is ahead of the {st.max_offset(topic, qid)} messages "
                    f"that survived"
                )
            for s in sessions:
                for (t, qid), off in s.commits.items():
                    if t == topic and s is last_session_reporting(sessions, t, qid):
                        assert row.get(qid, -1) >= off, (
                            f"session {s.number} committed {off} for {t}-{qid}; the file holds {row.get(qid)}"
                        )
        # the index finds every surviving acknowledged message by its key
        if any(s.acks for s in sessions):
            assert st.wait_for_index(30)
            for s in sessions:
                for (k, i), ack in s.acks.items():
                    topic = ack[0]
                    got = found.get((s.number, k, i))
                    if got is None:
                        continue
                    key = expected[(s.number, k)][i][4]
                    hits = st.query_message(topic, key)
                    assert any(bytes(m.body) == got[4] for m in hits), (
                        f"key {key} of {(s.number, k, i)} (commit log {got[3]}) not found: "
                        f"{[(h.physical_offset, h.store_timestamp) for h in hits]}; index {st.stats()['index']}"
                    )
                    figures["keys_checked"] += 1
        # new puts get the next offsets
        for topic in TOPICS:
            for qid in range(QUEUES):
                n = st.max_offset(topic, qid)
                r = st.put(topic, b"after the cut", queue_id=qid)
                assert r.status is localmq.PutStatus.PUT_OK and r.queue_offset == n, (topic, qid, n, r)
        assert st.wait_for_dispatch(30)
        for topic in TOPICS:
            for qid in range(QUEUES):
                n = st.max_offset(topic, qid) - 1
                g = st.get_message(topic, qid, n, 1)
                assert g.status is GetStatus.FOUND and bytes(g.messages[0].body) == b"after the cut"
    finally:
        st.close()


def last_session_reporting(sessions, topic, qid):
    return [s for s in sessions if (topic, qid) in s.commits][-1]


def new_figures():
    return dict(
        cuts=0,
        recuts=0,
        opened=0,
        opened_from_cut=0,
        acked=0,
        acked_must_survive=0,
        checked=0,
        lost_must_survive=0,
        gaps=0,
        dropped_tails=0,
        lost_units=0,
        offsets_checked=0,
        keys_checked=0,
        seconds=0.0,
        per_cut=[],
        async_cuts=[],
        delayed_acked=0,
        delayed_delivered=0,
        txn_committed=0,
        txn_delivered=0,
    )


def summary(flush, mode, f):
    """The figures of one test: counts, time per cut, and for ASYNC_FLUSH the loss after the durable offset."""
    out = {k: v for k, v in f.items() if not isinstance(v, list)}
    out.update(
        flush=flush,
        mode=mode,
        seconds=round(f["seconds"], 1),
        seconds_per_cut=round(f["seconds"] / max(1, f["cuts"]), 3),
    )
    if f["per_cut"]:
        out["seconds_per_cut_max"] = round(max(f["per_cut"]), 3)
    if f["async_cuts"]:
        for k in ("lost_msgs", "lost_bytes", "past_durable_bytes", "oldest_lost_ms", "acked_past_durable"):
            values = [a[k] for a in f["async_cuts"]]
            out[f"async_{k}"] = {"max": max(values), "median": statistics.median(values)}
        out["async_cuts_with_loss"] = sum(1 for a in f["async_cuts"] if a["lost_msgs"])
        by_interval = {}
        for a in f["async_cuts"]:
            by_interval.setdefault(a["interval_ms"], []).append(a["oldest_lost_ms"])
        out["async_oldest_lost_ms_by_interval"] = {k: max(v) for k, v in sorted(by_interval.items())}
    return out


@pytest.fixture(scope="module")
def power_dir(tmp_path_factory):
    """Where the cuts' backing directories and mount points go: /dev/shm when it can be used (the backing directory
    is the simulated machine's disk: its own durability plays no part, and the checks' opens then cost no real
    fsyncs), else pytest's tmp dir. Removed at the end; a failing cut's disk is copied to its test's tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="localmq-power-", dir=shm))
    else:
        d = tmp_path_factory.mktemp("power")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flush", FLUSHES)
def test_power_cuts(server, power_dir, tmp_path, flush, mode):
    base = power_dir / f"{flush}-{mode}"

    def kept_disk():  # what the check found (after its own recovery), for inspection
        if not (base / "disk").exists():
            return ""
        shutil.copytree(base / "disk", tmp_path / "disk", symlinks=True, dirs_exist_ok=True)
        return f"; the disk is kept in {tmp_path / 'disk'}"

    run_cuts(
        base,
        flush,
        mode,
        range(CUTS_PER_TEST),
        lambda seed, figures: run_cut(server, base, flush, mode, seed, figures),
        kept_disk,
        f"tests/test_power_loss.py::test_power_cuts[{flush}-{mode}]",
    )


def run_cuts(base, flush, mode, seeds, cut, kept_disk, test_id):
    """The seed loop of a power-cut test: ``cut(seed, figures)`` for each seed (only ``LOCALMQ_POWER_SEED``'s when
    set), no powerfs mount left under ``base`` after any; a failure names its replay command and what
    ``kept_disk()`` kept. Then the figures' summary (printed, appended to ``LOCALMQ_POWER_REPORT``) and its checks:
    no message that had to survive was lost, and some were checked."""
    figures = new_figures()
    for seed in [int(REPLAY_SEED)] if REPLAY_SEED is not None else seeds:
        try:
            cut(seed, figures)
        except Exception as e:
            raise AssertionError(
                f"power cut failed: flush={flush} mode={mode} seed={seed} (replay: "
                f"LOCALMQ_POWER_SEED={seed} python -m pytest '{test_id}'){kept_disk()}: {e}"
            ) from e
        finally:
            assert not powerfs_mounts(base), "a powerfs mount was left behind"
    shutil.rmtree(base, ignore_errors=True)
    rep = summary(flush, mode, figures)
    print(json.dumps(rep))
    if os.environ.get("LOCALMQ_POWER_REPORT"):
        with open(os.environ["LOCALMQ_POWER_REPORT"], "a") as f:
            f.write(json.dumps(rep) + "\n")
    assert figures["lost_must_survive"] == 0
    assert figures["checked"] > 0


# -- delayed and transactional messages ----------------------------------------------------------------------------

SPECIAL_CUTS = max(1, math.ceil(TOTAL_CUTS / 34))  # 6 per cut mode by default


def _queue_bodies(st, topic):
    """Every body of (topic, 0), in queue order."""
    out, off = [], 0
    while off < st.max_offset(topic, 0):
        g = st.get_message(topic, 0, off, 64)
        assert g.status is GetStatus.FOUND, (topic, off, g)
        out += [bytes(m.body) for m in g.messages]
        off = g.next_begin_offset
    return out


def _bodies_when_due(st, topic, thread, due, deadline):
    """The bodies of (topic, 0) once every message ``i`` of ``due`` (session 1, ``thread``) is among them, or at
    ``deadline``."""
    while True:
        got = _queue_bodies(st, topic)
        found = {power_writer.parse_body(b) for b in got}
        if all((1, thread, i) in found for i in due) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _special_outcomes(lines):
    """({i: status} of the delayed puts, {i: (state, committed)} of the transactions) a writer reported."""
    delayed, txn = {}, {}
    for line in lines:
        f = line.split()
        if f and f[0] == "Y":
            delayed[int(f[1])] = f[2]
        elif f and f[0] == "T":
            txn[int(f[1])] = (f[2], f[3] == "1")
    return delayed, txn


# the topics of the special job (delayed, transactional, retried messages) and the system topics they go through
SPECIAL_TOPICS = {
    "pdelay",
    "ptxn",
    "pretry",
    "%RETRY%PRG",
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
}


def _check_retries(seed, job, lines, sent_back, got_r, got_p, committed_p, figures):
    """Retries in flight: every send-back that returned (its retry record durable) and every even message below the
    group's surviving committed offset reached %RETRY%PRG exactly once, with the body that was put; the committed
    offset is not past the messages that survived."""
    n_r = max((int(f[1]) for f in map(str.split, lines) if f and f[0] == "W"), default=-1) + 2
    want_r = power_writer.messages(seed, 1, 92, ["pretry"], 1, tuple(job["sizes"]), n_r)
    for b in got_r + got_p:
        who = power_writer.parse_body(b)
        assert who is not None and who[:2] == (1, 92), f"never put: {b[:60]!r}"
        assert who[2] < len(want_r) and b == want_r[who[2]][3], f"retry {who}: another body than was put"
    seen_r = [power_writer.parse_body(b)[2] for b in got_r]
    assert all(i % 2 == 0 for i in seen_r), f"a message never sent back is in the retry topic: {seen_r[:20]}"
    dups = len(seen_r) - len(set(seen_r))
    assert dups == 0, f"retries delivered twice: {dups}"
    lost = sorted(sent_back - set(seen_r))
    assert not lost, f"sent back (retry record acknowledged) but never retried: {lost[:20]}"
    committed_p = committed_p or 0
    assert committed_p <= len(got_p), f"PRG committed {committed_p} on pretry, {len(got_p)} messages survived"
    below = [power_writer.parse_body(b)[2] for b in got_p[:committed_p]]
    lost_c = sorted(i for i in below if i % 2 == 0 and i not in set(seen_r))
    assert not lost_c, f"committed past but neither acknowledged nor retried: {lost_c[:20]}"
    figures["retries_sent_back"] = figures.get("retries_sent_back", 0) + len(sent_back)
    figures["retries_delivered"] = figures.get("retries_delivered", 0) + len(seen_r)


def _check_special(root, cfg, seed, job, lines, figures):
    delayed, txn = _special_outcomes(lines)
    acked = {i for i, status in delayed.items() if status == "PUT_OK"}
    committed = {i for i, (state, done) in txn.items() if state == "COMMIT_MESSAGE" and done}
    n_d = max(delayed, default=-1) + 2  # one more may be in the log, its outcome not reported before the kill
    n_t = max(txn, default=-1) + 2
    want_d = power_writer.messages(seed, 1, 90, ["pdelay"], 1, tuple(job["sizes"]), n_d)
    want_t = power_writer.messages(seed, 1, 91, ["ptxn"], 1, tuple(job["sizes"]), n_t)
    with localmq.open(root, **cfg) as st:
        # the delayed messages come when due (level 1: 1 s after they were stored), from the schedule service
        deadline = time.monotonic() + 20
        got_d = _bodies_when_due(st, "pdelay", 90, acked, deadline)
        got_t = _queue_bodies(st, "ptxn")
        # the retries come when due too (1 s after their send-back), to %RETRY%PRG
        sent_back = {int(f[1]) for f in map(str.split, lines) if f and f[0] == "B"}
        got_r = _bodies_when_due(st, "%RETRY%PRG", 92, sent_back, deadline)
        got_p = _queue_bodies(st, "pretry")
        committed_p = st.consumer_offsets.query("PRG", "pretry", 0)
    _check_retries(seed, job, lines, sent_back, got_r, got_p, committed_p, figures)
    for kind, got, want in (("delayed", got_d, want_d), ("transactional", got_t, want_t)):
        for b in got:
            who = power_writer.parse_body(b)
            assert who is not None and who[:2] == (1, 90 if kind == "delayed" else 91), f"never put: {b[:60]!r}"
            assert who[2] < len(want) and b == want[who[2]][3], f"{kind} {who}: another body than was put"
    seen_d = [power_writer.parse_body(b)[2] for b in got_d]
    seen_t = [power_writer.parse_body(b)[2] for b in got_t]
    lost_d = sorted(acked - set(seen_d))
    lost_t = sorted(committed - set(seen_t))
    assert not lost_d, f"SYNC_FLUSH-acknowledged delayed messages never delivered: {lost_d[:20]}"
    assert not lost_t, f"committed transactional messages lost: {lost_t[:20]}"
    rolled_back = sorted(i for i in seen_t if i % 2 == 1)
    assert not rolled_back, f"rolled-back transactional messages delivered: {rolled_back[:20]}"
    dups_t = len(seen_t) - len(set(seen_t))
    assert dups_t == 0, f"transactional messages committed twice: {dups_t}"
    # what was re-put after the last delayOffset.json write that survived is found in the real queue after the
    # open, not delivered again (ScheduleMessageService._delivered_before)
    dups_d = len(seen_d) - len(set(seen_d))
    assert dups_d == 0, f"delayed messages delivered twice: {dups_d}"
    figures["delayed_acked"] += len(acked)
    figures["delayed_delivered"] += len(set(seen_d))
    figures["txn_committed"] += len(committed)
    figures["txn_delivered"] += len(seen_t)


@pytest.mark.parametrize("mode", MODES)
def test_delayed_and_transactional_messages_survive_power_cuts(server, power_dir, mode):
    """SYNC_FLUSH stores taking delayed messages (level 1) and transactions (even ones committed, odd ones rolled
    back) and a consumer sending every even message of its topic back for a retry, beside a plain writer,
    SIGKILLed and cut (a third of the cuts also during a second session's recovery): after the cut every
    acknowledged delayed message is delivered to its topic exactly once, every committed transaction's message is
    there exactly once, none rolled back is, every send-back that returned (and every one the surviving committed
    offset passed) is retried exactly once, and nothing that was never put."""
    base = power_dir / f"special-{mode}"
    figures = dict(cuts=0, recuts=0, delayed_acked=0, delayed_delivered=0, txn_committed=0, txn_delivered=0)
    for seed in [int(REPLAY_SEED)] if REPLAY_SEED is not None else range(SPECIAL_CUTS):
        rng = random.Random(f"special/{mode}/{seed}")
        disk, mnt = base / "disk", base / "mnt"
        shutil.rmtree(disk, ignore_errors=True)
        disk.mkdir(parents=True)
        cfg = dict(settings(rng, "SYNC_FLUSH"), transaction_check_interval=100, transaction_timeout=200)
        job = dict(job_for(rng, mnt / "store", cfg, seed, 1), special=True, consumer=False, threads=1)
        fs = mounted(disk, mnt)
        try:
            lines, _, _ = server.run(job, rng.uniform(0.3, 1.5))
            fs.cut(mode, rng.randrange(1 << 31))
        finally:
            fs.unmount()
        if rng.random() < 0.3:  # recovery through powerfs (the schedule and transaction services start), cut again
            figures["recuts"] += 1
            fs = mounted(disk, mnt)
            try:
                again = dict(job_for(rng, mnt / "store", cfg, seed, 2), consumer=False, threads=0)
                server.run(again, rng.uniform(0.0, 1.5), from_ready=False)
                fs.cut(mode, rng.randrange(1 << 31))
            finally:
                fs.unmount()
        try:
            _check_special(disk / "store", cfg, seed, job, lines, figures)
        except Exception as e:
            raise AssertionError(
                f"power cut failed: mode={mode} seed={seed} (replay: LOCALMQ_POWER_SEED={seed} "
                f"python -m pytest 'tests/test_power_loss.py::"
                f"test_delayed_and_transactional_messages_survive_power_cuts[{mode}]'): {e}"
            ) from e
        figures["cuts"] += 1
        assert not powerfs_mounts(base), "a powerfs mount was left behind"
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(dict(figures, mode=mode)))
    if os.environ.get("LOCALMQ_POWER_REPORT"):
        with open(os.environ["LOCALMQ_POWER_REPORT"], "a") as f:
            f.write(json.dumps(dict(figures, mode=mode, test="special")) + "\n")
    assert figures["delayed_acked"] > 0 and figures["txn_committed"] > 0, figures
    assert figures.get("retries_sent_back", 0) > 0, figures


# the small store of the recovery sweep below and of tests/test_power_loss_found.py
SMALL = dict(mapped_file_size_commit_log=SEGMENT, mapped_file_size_consume_queue=20 * 16)


@pytest.mark.parametrize("mode", ["all", "random"])
def test_a_recovery_cut_at_any_of_its_syncs_and_unlinks_leaves_a_store_that_opens(server, power_dir, mode):
    """A crash sweep of one recovery: a store whose last segments lost their data (the queues point into them) is
    recovered through powerfs with its k-th fsync / directory fsync / unlink failing (EIO: that operation and what
    follows do not happen), then the power is cut, for every k. Recovery deleted the segments past the log's end
    before the queues' units pointing into them were cut durably (the next open refused: "consume queues point
    past the last commit log segment"), and deleted them oldest first (a random cut kept a prefix of the
    deletions: "missing segments between others"), and the segments it creates ahead after the open were created
    even when the one before them could not be (the same refusal). Every state must open."""
    tmp_path = power_dir / f"sweep-{mode}"
    state = tmp_path / "state"
    rng = random.Random(1)
    with localmq.open(state, **SMALL) as st:
        for i in range(900):
            st.put("t%d" % (i % 2), b"%d|" % i + rng.randbytes(rng.randrange(10, 400)), queue_id=i % 2)
    segs = sorted(os.listdir(state / "commitlog"))
    assert len(segs) >= 5
    for j, name in enumerate(segs[-3:]):  # what never reached the disk: half a segment, then two whole ones
        with open(state / "commitlog" / name, "r+b") as f:
            start = SEGMENT // 2 if j == 0 else 0
            f.seek(start)
            f.write(bytes(SEGMENT - start))
    (state / "abort").touch()
    disk, mnt = tmp_path / "disk", tmp_path / "mnt"
    job = dict(
        root=str(mnt),
        config=SMALL,
        seed=0,
        session=1,
        threads=0,
        topics=TOPICS,
        queues=QUEUES,
        sizes=list(SIZES),
        open_may_fail=True,
    )
    k, failed_opens, durable = 0, 0, None
    while True:
        k += 1
        assert k < 500, "the sweep does not end"
        shutil.rmtree(disk, ignore_errors=True)
        shutil.copytree(state, disk)
        fs = mounted(disk, mnt)
        try:
            fs.fail(k, "EIO", ops=["fsync", "fsyncdir", "unlink"])
            lines, _, _ = server.run(job, 0.0)
            injected = fs.counters()["injected"]
            fs.cut(mode, k)
        finally:
            fs.unmount()
        failed_opens += any(ln.startswith("F ") for ln in lines)
        try:
            with localmq.open(disk, **SMALL) as st:
                n = sum(st.max_offset(t, q) for t in ("t0", "t1") for q in (0, 1))
                if durable is None:
                    durable = n
                assert n == durable, (k, n, durable)
        except Exception as e:
            raise AssertionError(
                f"{mode} cut after the recovery's operation {k} failed: the store does not open: {e}"
            ) from e
        if not injected:
            break
    assert k > 10 and failed_opens > 0
    shutil.rmtree(tmp_path)
