"""Soak (issue 27): producers, a consumer group with acks and retries, retention deleting segments and reopen cycles
in one process for ``--seconds``, sampling its descriptors, mappings, RSS and the store's disk once a second.

Usage: python perf/soak.py --seconds N [--queues Q] [--rate MSGS_PER_S] [--reopen-every S] [--out samples.json]
       [--plot perf/plots/soak.png] [--dir PARENT] [--retention aged|instant] [--keep S]

The store (a temporary directory under ``--dir``, removed at the end) has 1 MiB commit log segments, 20 KiB
ConsumeQueue files, small index files (20,000 items) and a budget of 64 mapped queue files for Q queues (default
200: 50 topics x 4), so segments roll, retention deletes them, index files roll and are deleted, and queue files
are evicted and mapped again all along. Retention runs every second, by time at every hour (``delete_when``) with
``file_reserved_time=1``; the sampler sets the mtime of a segment full for ``--keep`` seconds (10) two hours back
(``age_segments``), so the store's own rule deletes it once the dispatcher and the group's committed offsets
(config/consumerOffset.json, written every 5 s) have passed it. ``--retention instant`` uses
``file_reserved_time=0`` instead: segments go at the next pass, and retries still waiting in SCHEDULE_TOPIC_XXXX
can go with them (perf/README.md, "Soak").

Threads: 2 producers send to every queue in turn, ``--rate`` messages a second together, bodies of 100-1000 bytes
that carry (producer, topic, queue, sequence) and their CRC; one ``manual_ack`` consumer of group ``soak`` on every
topic checks each body, acks it, or nacks about 1 % of first deliveries (back through SCHEDULE_TOPIC_XXXX and
``%RETRY%soak`` 2 s later, where it is acked); a sampler; the main thread closes the store and opens it again every
``--reopen-every`` seconds (the producers and the consumer close their clients first and make new ones after).
When the time is up the producers stop, the consumer drains everything (retries included) and the store closes.

The last line of stdout is a JSON summary: counts (put, consumed, nacked, retried, duplicates, missing, bodies
that were never put), reopen cycles, retention's deletions, the samples at start / half / end, and verdicts:
``flat_fds`` / ``flat_maps`` (the maxima of the second half within +8 descriptors / +32 mappings of those of
25-50 %; a sample taken while a reopen closes and opens the store is left out, as its descriptors are the close's
and the open's own, briefly: the close syncs queue files on up to 16 threads, each with a descriptor for the call),
``flat_rss`` (RSS at the end within 30 MiB of RSS at half; the growth is also given split into
anonymous memory, the heap, and the resident pages of mapped files), ``disk_bounded`` (never above a bound
computed from the settings and the rate after the warm-up), ``closed_state_flat`` (the descriptors held while the
store is closed, between two opens, are the same every cycle). ``--out`` writes the summary and every sample;
``--plot`` draws descriptors, mappings, RSS and disk against time into one PNG. Throughput is reported, never judged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
import traceback
import zlib

# the localmq of this checkout, whatever else is installed
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import localmq  # noqa: E402
from proc_stats import fds, maps, rss_anon_kib, rss_file_kib, rss_kib  # noqa: E402 - perf/ (this script's directory)

GROUP = "soak"
QUEUES_PER_TOPIC = 4
PRODUCERS = 2
NACK_FRACTION = 0.01
SEGMENT = 1 << 20
CQ_FILE = 20 * 1024
INDEX_SLOTS, INDEX_ITEMS = 5_000, 20_000
CLEAN_INTERVAL_MS = 1_000
OFFSET_PERSIST_MS = 5_000  # flush_consumer_offset_interval: retention reads the offsets written this often
STORE_CONFIG = dict(
    mapped_file_size_commit_log=SEGMENT,
    mapped_file_size_consume_queue=CQ_FILE,
    max_mapped_queue_files=64,
    max_hash_slot_num=INDEX_SLOTS,
    max_index_num=INDEX_ITEMS,
    # retention by time at every hour: segments whose mtime is 1 hour old (the soak ages them, see age_segments)
    file_reserved_time=1,
    delete_when=";".join("%02d" % h for h in range(24)),
    clean_resource_interval=CLEAN_INTERVAL_MS,
    destroy_mapped_file_interval_forcibly=10_000,
    redelete_hanged_file_interval=10_000,
    flush_consumer_offset_interval=OFFSET_PERSIST_MS,
    # a nack comes back after 2 s (default level 3 + reconsume times, clamped to the last level)
    message_delay_level="1s 2s",
)
AGED_S = 2 * 3600  # what an aged segment's mtime is set back by: past file_reserved_time


MIN_BODY, MAX_BODY = 100, 1000
RECORD_OVERHEAD = 300  # beyond its body, a record's header, topic and properties (UNIQ_KEY...): about 140 here
HEADER = struct.Struct("<4sBHBIH")  # magic, producer, topic index, queue id, sequence, body length
MAGIC = b"SOAK"
CRC = struct.Struct("<I")
FILLER = random.Random(27).randbytes(2 * MAX_BODY)
# flag bits per (producer, topic, queue, sequence)
ORIGINAL, NACKED, RETRIED = 1, 2, 4


def topic_name(i: int) -> str:
    return "soak-%03d" % i


def body_of(pid: int, t: int, q: int, seq: int) -> bytes:
    """A body of 100-1000 bytes naming its (producer, topic, queue, sequence), CRC32 last."""
    n = MIN_BODY + (seq * 2654435761 + t * 40503 + q * 977 + pid * 131) % (MAX_BODY - MIN_BODY + 1)
    head = HEADER.pack(MAGIC, pid, t, q, seq, n)
    start = seq % MAX_BODY
    payload = head + FILLER[start : start + n - HEADER.size - CRC.size]
    return payload + CRC.pack(zlib.crc32(payload))


def disk_bytes(root: str) -> int:
    """Allocated bytes (st_blocks * 512) of every file and directory under ``root``; files retention deletes
    during the walk are skipped."""
    total = 0
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class Cycles:
    """Where the workers park while the main thread closes the store and opens it again."""

    def __init__(self, st, workers: int):
        self.cond = threading.Condition()
        self.st = st
        self.workers = workers
        self.pausing = False
        self.parked = 0
        self.epoch = 0

    def park(self, stop: threading.Event):
        """A worker that closed its clients waits here; returns the store to use next (None: stop)."""
        with self.cond:
            self.parked += 1
            self.cond.notify_all()
            epoch = self.epoch
            while self.epoch == epoch and not stop.is_set():
                self.cond.wait(0.5)
            self.parked -= 1
            return None if stop.is_set() else self.st

    def pause(self, timeout: float = 120.0) -> None:
        with self.cond:
            self.pausing = True
            end = time.monotonic() + timeout
            while self.parked < self.workers:
                left = end - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"only {self.parked} of {self.workers} workers parked in {timeout} s")
                self.cond.wait(left)

    def resume(self, st) -> None:
        with self.cond:
            self.st = st
            self.pausing = False
            self.epoch += 1
            self.cond.notify_all()


class Soak:
    def __init__(self, args, root: str):
        self.args = args
        self.root = root
        self.topics = max(1, args.queues // QUEUES_PER_TOPIC)
        self.names = [topic_name(i) for i in range(self.topics)]
        # one bytearray of flags per (producer, topic, queue): a byte per sequence, appended before the send
        self.flags = [bytearray() for _ in range(PRODUCERS * self.topics * QUEUES_PER_TOPIC)]
        self.stop_load = threading.Event()  # producers stop
        self.stop_all = threading.Event()  # the consumer stops
        self.proc_lock = threading.Lock()  # one reader of /proc at a time: its own descriptors stay out
        self.store_lock = threading.Lock()  # held while the store is closed and opened again
        self.errors: list = []
        self.put = 0
        self.consumed = 0
        self.nacked = 0
        self.retried = 0
        self.dup_original = 0
        self.dup_retry = 0
        self.unexpected_retry = 0
        self.foreign = 0
        self.foreign_examples: list = []
        self.samples: list = []
        self.missing_retries: list = []
        self.reopens: list = []
        self.reopening = False  # a reopen is closing and opening the store: its samples are not steady state
        self.closed_state: list = []  # (fds, maps) while no store is open, each cycle
        self.retention = {
            "deleted_commit_log_files": 0,
            "deleted_consume_queue_files": 0,
            "deleted_index_files": 0,
            "passes": 0,
            "deleted_unconsumed": 0,
            "service_errors": 0,
        }
        self.evictions = 0
        self.nack_times: dict = {}
        self.schedule = {"delivered": 0, "skipped": 0, "redeliveries_avoided": 0, "put_failures": 0}
        self.remaps = 0
        self.t0 = 0.0
        self.st = None
        self.cycles: Cycles | None = None
        self.config = dict(STORE_CONFIG)
        if args.retention == "instant":
            self.config["file_reserved_time"] = 0  # every segment behind the consumers and the dispatcher, at once
        self.rolled: dict = {}  # segment base offset -> when it was first seen full
        self.aged: set = set()

    def key(self, pid: int, t: int, q: int) -> int:
        return (pid * self.topics + t) * QUEUES_PER_TOPIC + q

    # -- workers --------------------------------------------------------------------------------------------------

    def _guard(self, name, fn, *a):
        try:
            fn(*a)
        except BaseException as e:  # noqa: BLE001 - reported in the summary, and the run stops
            self.errors.append(f"{name}: {e!r}\n{traceback.format_exc()}")
            self.stop_load.set()
            self.stop_all.set()
            if fn == self.consumer:
                with self.cycles.cond:
                    self.cycles.workers -= 1  # never block a pause for a dead worker
                    self.cycles.cond.notify_all()

    def producer(self, pid: int) -> None:
        try:
            self._produce(pid)
        finally:
            with self.cycles.cond:  # a pause after this thread ended must not wait for it
                self.cycles.workers -= 1
                self.cycles.cond.notify_all()

    def _produce(self, pid: int) -> None:
        rate = self.args.rate / PRODUCERS
        order = [(t, q) for t in range(self.topics) for q in range(QUEUES_PER_TOPIC)]
        random.Random(pid).shuffle(order)
        st = self.cycles.st
        prods = [st.create_producer(queue_id=q) for q in range(QUEUES_PER_TOPIC)]
        i = 0
        next_t = time.monotonic()
        while not self.stop_load.is_set():
            if self.cycles.pausing:
                for p in prods:
                    p.close()
                st = self.cycles.park(self.stop_load)
                if st is None:
                    return
                prods = [st.create_producer(queue_id=q) for q in range(QUEUES_PER_TOPIC)]
                next_t = time.monotonic()
                continue
            t, q = order[i % len(order)]
            i += 1
            flags = self.flags[self.key(pid, t, q)]
            seq = len(flags)
            flags.append(0)  # before the send: a body the consumer sees always has its byte
            prods[q].send(self.names[t], body_of(pid, t, q, seq))
            self.put += 1  # two threads: read as an approximate progress count; the flags are the truth
            next_t += 1.0 / rate
            pause = next_t - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            elif pause < -1.0:
                next_t = time.monotonic()  # behind (a reopen, a slow disk): no burst to catch up
        for p in prods:
            p.close()

    def check(self, m):
        """(flags, sequence) of the message whose body ``m`` carries, or None (counted as foreign) when ``m`` is not
        a message that was sent: a bad CRC or length, another topic or queue, a sequence never sent."""
        b = bytes(m.body)
        why = None
        if len(b) < HEADER.size + CRC.size:
            why = "short"
        else:
            magic, pid, t, q, seq, n = HEADER.unpack_from(b)
            if magic != MAGIC or n != len(b) or CRC.unpack_from(b, n - CRC.size)[0] != zlib.crc32(b[: -CRC.size]):
                why = "bad magic, length or crc"
            elif pid >= PRODUCERS or t >= self.topics or q >= QUEUES_PER_TOPIC or self.names[t] != m.topic:
                why = "names another queue"
            elif m.reconsume_times == 0 and m.queue_id != q:
                why = "delivered from another queue id"
            elif seq >= len(self.flags[self.key(pid, t, q)]):
                why = "a sequence never sent"
            elif b != body_of(pid, t, q, seq):
                why = "body differs from the one sent"
        if why is not None:
            self.foreign += 1
            if len(self.foreign_examples) < 10:
                self.foreign_examples.append(f"{m.topic}/{m.queue_id}@{m.queue_offset}: {why}")
            return None
        return self.flags[self.key(pid, t, q)], seq

    def consumer(self) -> None:
        rng = random.Random(1)
        st = self.cycles.st
        topics = list(self.names)
        c = st.create_consumer(GROUP, topics, manual_ack=True)
        while not self.stop_all.is_set():
            if self.cycles.pausing:
                c.close()
                st = self.cycles.park(self.stop_all)
                if st is None:
                    return
                c = st.create_consumer(GROUP, topics, manual_ack=True)
                continue
            for m in c.poll_batch(256, timeout=0.2):
                self.consumed += 1
                found = self.check(m)
                if found is None:
                    m.ack()
                    continue
                flags, seq = found
                f = flags[seq]
                if m.reconsume_times == 0:
                    if f & ORIGINAL:
                        self.dup_original += 1
                    f |= ORIGINAL
                    if not f & NACKED and rng.random() < NACK_FRACTION:
                        flags[seq] = f | NACKED
                        m.nack()  # sent back before this returns: it comes back through %RETRY%soak
                        self.nacked += 1
                        self.nack_times[(id(flags), seq)] = round(time.monotonic() - self.t0, 2)
                        continue
                else:
                    self.retried += 1
                    if not f & NACKED:
                        self.unexpected_retry += 1
                    if f & RETRIED:
                        self.dup_retry += 1
                    f |= RETRIED
                flags[seq] = f
                m.ack()
        c.close()

    def sampler(self) -> None:
        next_t = time.monotonic()
        while not self.stop_all.is_set():
            self.sample()
            next_t += 1.0
            self.stop_all.wait(max(0.0, next_t - time.monotonic()))

    def sample(self, phase: str = "") -> dict:
        reopening = self.reopening
        with self.proc_lock:
            s = {
                "t": round(time.monotonic() - self.t0, 2),
                "fds": fds(),
                "maps": maps(),
                "rss_kib": rss_kib(),
                "rss_anon_kib": rss_anon_kib(),
                "rss_file_kib": rss_file_kib(),
                "disk_bytes": disk_bytes(self.root),
                "put": self.put,
                "consumed": self.consumed,
                "nacked": self.nacked,
                "retried": self.retried,
                "reopens": len(self.reopens),
            }
        if self.st is not None and self.store_lock.acquire(blocking=False):
            try:
                stats = self.st.stats()
                s["segments"] = stats["segments"]
                s["mapped_queue_files"] = stats["mapped_queue_files"]
                if self.args.retention == "aged":
                    self.age_segments(stats["commit_log_max_offset"])
            finally:
                self.store_lock.release()
        if phase:
            s["phase"] = phase
        elif reopening or self.reopening:
            s["phase"] = "reopen"
        self.samples.append(s)
        return s

    def age_segments(self, max_offset: int) -> None:
        """Retention at soak speed: a segment full for ``--keep`` seconds gets an mtime 2 hours back, so that the
        store's own time rule (``file_reserved_time=1`` hour, every hour in ``delete_when``) deletes it once the
        dispatcher and the group's committed offsets have passed it. A record is thus kept at least ``--keep``
        seconds after its segment's last write: longer than the 2 s a nacked message waits in
        SCHEDULE_TOPIC_XXXX, which retention does not protect (``--retention instant`` shows what happens then)."""
        now = time.monotonic()
        logdir = os.path.join(self.root, "commitlog")
        try:
            names = os.listdir(logdir)
        except FileNotFoundError:
            return
        old = time.time() - AGED_S
        for name in names:
            if not name.isdigit():
                continue
            base = int(name)
            if base + SEGMENT > max_offset or base in self.aged:
                continue
            seen = self.rolled.setdefault(base, now)
            if now - seen >= self.args.keep:
                try:
                    os.utime(os.path.join(logdir, name), (old, old))
                except FileNotFoundError:
                    pass
                self.aged.add(base)
                del self.rolled[base]

    # -- reopen cycles --------------------------------------------------------------------------------------------

    def _account(self, st) -> None:
        """Add the closing store's retention and mapping counters to the run's (each open starts from 0)."""
        stats = st.stats()
        r = stats["retention"]
        for k in ("deleted_commit_log_files", "deleted_consume_queue_files", "deleted_index_files", "passes"):
            self.retention[k] += r.get(k, 0)
        self.retention["deleted_unconsumed"] += sum(r.get("deleted_unconsumed", {}).values())
        self.retention["service_errors"] += sum(stats["service_errors"].values())
        sched = st.schedule_service
        if sched is not None:
            for k in self.schedule:
                self.schedule[k] += getattr(sched, k, 0)
        self.evictions += stats.get("queue_file_evictions") or 0
        self.remaps += stats.get("queue_file_remaps") or 0

    def reopen(self) -> None:
        t = time.monotonic()
        self.cycles.pause()
        with self.store_lock:
            self._account(self.st)
            self.reopening = True
            try:
                t_close = time.monotonic()
                self.st.close()
                close_s = time.monotonic() - t_close
                with self.proc_lock:
                    self.closed_state.append({"fds": fds(), "maps": maps()})
                t_open = time.monotonic()
                self.st = None
                self.st = localmq.open(self.root, **self.config)
                open_s = time.monotonic() - t_open
            finally:
                self.reopening = False
        self.cycles.resume(self.st)
        self.reopens.append(
            {
                "t": round(t - self.t0, 1),
                "close_s": round(close_s, 3),
                "open_s": round(open_s, 3),
                "paused_s": round(time.monotonic() - t, 3),
            }
        )

    # -- the run ----------------------------------------------------------------------------------------------------

    def lag(self) -> dict:
        lags = self.st.consumer_lag(GROUP)
        return {f"{t}/{q}": v for (t, q), v in lags.items() if v != 0}

    def run(self) -> dict:
        a = self.args
        with self.proc_lock:
            base = {"fds": fds(), "maps": maps(), "rss_kib": rss_kib()}
        self.t0 = time.monotonic()
        self.st = localmq.open(self.root, **self.config)
        self.cycles = Cycles(self.st, PRODUCERS + 1)
        threads = [
            threading.Thread(
                target=self._guard, args=("producer-%d" % i, self.producer, i), name="soak-producer-%d" % i
            )
            for i in range(PRODUCERS)
        ]
        threads.append(threading.Thread(target=self._guard, args=("consumer", self.consumer), name="soak-consumer"))
        sampler = threading.Thread(target=self._guard, args=("sampler", self.sampler), name="soak-sampler")
        for th in threads:
            th.start()
        sampler.start()
        end = self.t0 + a.seconds
        next_reopen = self.t0 + a.reopen_every
        while not self.stop_load.is_set():
            now = time.monotonic()
            if now >= end:
                break
            if now >= next_reopen and end - now > a.reopen_every / 2:
                try:
                    self.reopen()
                except Exception as e:  # noqa: BLE001 - reported in the summary; the run ends
                    self.errors.append(f"reopen: {e!r}\n{traceback.format_exc()}")
                    self.stop_load.set()
                    self.stop_all.set()
                    break
                next_reopen = time.monotonic() + a.reopen_every
            time.sleep(min(0.2, max(0.0, min(end, next_reopen) - time.monotonic())))
        load_end = time.monotonic() - self.t0
        self.stop_load.set()
        for th in threads[:PRODUCERS]:
            th.join(60)
        # drain: every first delivery and every retry consumed, every committed offset at its queue's end
        drain_start = time.monotonic()
        drained = False
        while time.monotonic() - drain_start < a.drain_timeout and not self.errors:
            left, lag = self.outstanding(), self.lag()
            if not left and not lag:
                drained = True
                break
            if a.verbose:
                print(
                    f"drain: {left} outstanding, lag {dict(list(lag.items())[:5])} ({len(lag)} queues)", file=sys.stderr
                )
            time.sleep(0.5)
        drain_s = time.monotonic() - drain_start
        self.stop_all.set()
        for th in threads[PRODUCERS:] + [sampler]:
            th.join(60)
        final_lag = {"?": None}
        if self.st is not None and not self.errors:
            final_lag = self.lag()
            self.missing_retries = self.find_missing_retries()
        if self.st is not None:
            self._account(self.st)
            with self.store_lock:
                self.st.close()
                self.st = None
        with self.proc_lock:
            self.closed_state.append({"fds": fds(), "maps": maps()})
        after = self.sample("closed")
        return self.summary(base, load_end, drained, drain_s, final_lag, after)

    def find_missing_retries(self, limit: int = 20) -> list:
        """Nacked messages whose retry never came: when each was nacked, and where its body is in the store now
        (SCHEDULE_TOPIC_XXXX, %RETRY%soak), to tell a lost send-back from a lost re-put."""
        out = []
        for k, flags in enumerate(self.flags):
            pid, rest = divmod(k, self.topics * QUEUES_PER_TOPIC)
            t, q = divmod(rest, QUEUES_PER_TOPIC)
            i = flags.find(ORIGINAL | NACKED)
            while i >= 0 and len(out) < limit:
                out.append(
                    {
                        "topic": self.names[t],
                        "queue": q,
                        "producer": pid,
                        "seq": i,
                        "nacked_at": self.nack_times.get((id(flags), i)),
                        "body": body_of(pid, t, q, i),
                    }
                )
                i = flags.find(ORIGINAL | NACKED, i + 1)
        if not out:
            return out
        bodies = {m.pop("body"): m for m in out}
        st = self.st
        for topic, qid in [("SCHEDULE_TOPIC_XXXX", 0), ("SCHEDULE_TOPIC_XXXX", 1), ("%RETRY%" + GROUP, 0)]:
            off, end = st.min_offset(topic, qid), st.max_offset(topic, qid)
            while off < end:
                r = st.get_message(topic, qid, off, 32)
                for m in r.messages:
                    hit = bodies.get(bytes(m.body))
                    if hit is not None:
                        hit.setdefault("found", []).append(f"{topic}/{qid}@{m.queue_offset}")
                if r.next_begin_offset <= off:
                    break
                off = r.next_begin_offset
        return out

    def outstanding(self) -> int:
        """First deliveries not seen yet, plus nacked messages whose retry has not come."""
        n = 0
        for flags in self.flags:
            n += flags.count(0) + flags.count(ORIGINAL | NACKED)
        return n

    def counts(self) -> dict:
        put = missing = nacked = retry_missing = 0
        for flags in self.flags:
            put += len(flags)
            missing += flags.count(0) + flags.count(NACKED)
            for v in (ORIGINAL | NACKED, NACKED):
                retry_missing += flags.count(v)
            for v in (ORIGINAL | NACKED, ORIGINAL | NACKED | RETRIED, NACKED, NACKED | RETRIED):
                nacked += flags.count(v)
        return {"put": put, "missing": missing, "nacked": nacked, "retries_missing": retry_missing}

    # -- verdicts -------------------------------------------------------------------------------------------------

    def disk_bound(self) -> dict:
        """What retention keeps at most, from the settings and the rate: the log written while a full segment
        waits to be aged (``--keep``), the group's offsets to be persisted and a pass to run (plus 5 s), at an
        average record of 550 + 300 bytes (bodies of 100-1000 bytes; the header, topic and UNIQ_KEY take about
        140), plus the current segment, the 2 made ahead and the one being aged; two files and a directory block per
        queue; three index files; 1 MiB of config, checkpoint and directories. Without retention a run passes it
        after about a minute and a half."""
        rate_bytes = self.args.rate * ((MIN_BODY + MAX_BODY) / 2 + RECORD_OVERHEAD)
        keep = self.args.keep + 1 if self.args.retention == "aged" else 0
        window_s = keep + OFFSET_PERSIST_MS / 1000 + 2 * CLEAN_INTERVAL_MS / 1000 + 5
        segments = math.ceil(rate_bytes * window_s / SEGMENT) + 4
        queues = self.topics * QUEUES_PER_TOPIC + 1 + 2  # + %RETRY%soak, SCHEDULE_TOPIC_XXXX levels 1 and 2
        cq = queues * (2 * CQ_FILE + 4096) + (self.topics + 2) * 4096
        index = 3 * (40 + INDEX_SLOTS * 4 + INDEX_ITEMS * 20)
        return {"segments": segments, "window_s": window_s, "bytes": segments * SEGMENT + cq + index + (1 << 20)}

    def summary(self, base, load_end, drained, drain_s, final_lag, after) -> dict:
        a = self.args
        load = [s for s in self.samples if "phase" not in s and s["t"] <= load_end]
        warm = [s for s in load if s["t"] < 0.25 * load_end]
        first = [s for s in load if 0.25 * load_end <= s["t"] < 0.5 * load_end]
        second = [s for s in load if s["t"] >= 0.5 * load_end]

        def at(frac):
            t = frac * load_end
            return min(load, key=lambda s: abs(s["t"] - t)) if load else {}

        def median_rss(frac, width=5, key="rss_kib"):
            t = frac * load_end
            near = sorted(load, key=lambda s: abs(s["t"] - t))[:width]
            v = sorted(s[key] for s in near)
            return v[len(v) // 2] if v else 0

        def pick(s):
            return {
                k: s.get(k)
                for k in (
                    "t",
                    "fds",
                    "maps",
                    "rss_kib",
                    "rss_anon_kib",
                    "rss_file_kib",
                    "disk_bytes",
                    "segments",
                    "mapped_queue_files",
                )
            }

        c = self.counts()
        bound = self.disk_bound()
        verdicts = {}
        if first and second:
            fmax = {k: max(s[k] for s in first) for k in ("fds", "maps")}
            smax = {k: max(s[k] for s in second) for k in ("fds", "maps")}
            verdicts["flat_fds"] = smax["fds"] <= fmax["fds"] + 8
            verdicts["flat_maps"] = smax["maps"] <= fmax["maps"] + 32
            rss_growth = median_rss(1.0) - median_rss(0.5)
            # of which the heap's (a leak) and the mapped files' resident pages (bounded by the mappings)
            rss_split = {k: median_rss(1.0, key=k) - median_rss(0.5, key=k) for k in ("rss_anon_kib", "rss_file_kib")}
            verdicts["flat_rss"] = rss_growth <= 30 * 1024
            disk_max = max(s["disk_bytes"] for s in first + second)
            verdicts["disk_bounded"] = disk_max <= bound["bytes"]
        else:
            fmax = smax = {}
            rss_growth = disk_max = None
            rss_split = {}
        cl = [x["fds"] for x in self.closed_state]
        verdicts["closed_state_flat"] = len(cl) >= 2 and max(cl) == min(cl)
        verdicts["correct"] = (
            not self.errors
            and self.foreign == 0
            and c["missing"] == 0
            and c["retries_missing"] == 0
            and drained
            and not final_lag
        )
        per_s = c["put"] / load_end if load_end else 0.0
        return {
            "seconds": a.seconds,
            "retention_mode": a.retention,
            "keep_s": a.keep,
            "load_seconds": round(load_end, 1),
            "queues": self.topics * QUEUES_PER_TOPIC,
            "topics": self.topics,
            "rate_asked": a.rate,
            "put_per_s": round(per_s, 1),
            "put": c["put"],
            "consumed": self.consumed,
            "nacked": self.nacked,
            "retried": self.retried,
            "duplicates": self.dup_original + self.dup_retry,
            "duplicates_original": self.dup_original,
            "duplicates_retry": self.dup_retry,
            "unexpected_retries": self.unexpected_retry,
            "never_put": self.foreign,
            "never_put_examples": self.foreign_examples,
            "missing": c["missing"],
            "retries_missing": c["retries_missing"],
            "deleted_unconsumed_segments": self.retention["deleted_unconsumed"],
            "missing_retry_detail": self.missing_retries,
            "schedule": self.schedule,
            "drained": drained,
            "drain_s": round(drain_s, 1),
            "final_lag": final_lag,
            "reopen_cycles": len(self.reopens),
            "reopen_open_s_max": max((r["open_s"] for r in self.reopens), default=None),
            "reopen_close_s_max": max((r["close_s"] for r in self.reopens), default=None),
            "retention": dict(self.retention),
            "queue_file_evictions": self.evictions,
            "queue_file_remaps": self.remaps,
            "before_open": base,
            "start": pick(at(0.0)),
            "warm_end": pick(at(0.25)),
            "half": pick(at(0.5)),
            "end": pick(at(1.0)),
            "after_close": pick(after),
            "max_25_50": fmax,
            "max_50_100": smax,
            "rss_growth_half_to_end_kib": rss_growth,
            "rss_growth_half_to_end_split_kib": rss_split,
            "disk_max_after_warmup": disk_max,
            "disk_bound": bound,
            "closed_state": self.closed_state,
            "warmup_samples": len(warm),
            "samples": len(self.samples),
            "verdicts": verdicts,
            "errors": self.errors,
        }


def plot(samples: list, summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load = [s for s in samples if "phase" not in s]
    t = [s["t"] / 60 for s in load]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    series = [
        ("fds", "open descriptors", 1),
        ("maps", "mappings (/proc/self/maps lines)", 1),
        ("rss_kib", "RSS (MiB)", 1 / 1024),
        ("disk_bytes", "store disk (MiB)", 1 / (1 << 20)),
    ]
    warm = 0.25 * summary["load_seconds"] / 60
    for ax, (k, label, scale) in zip(axes, series):
        ax.axvspan(0, warm, color="0.9", lw=0)
        for r in summary.get("reopens", []):
            ax.axvline(r / 60, color="tab:red", lw=0.4, alpha=0.4)
        ys = [s[k] * scale for s in load]
        ax.plot(t, ys, lw=0.8)
        ax.set_ylabel(label)
        top = max(ys, default=1)
        if k == "disk_bytes":
            bound = summary["disk_bound"]["bytes"] * scale
            ax.axhline(bound, color="tab:orange", ls="--", lw=0.8, label="bound from the settings and the rate")
            ax.legend(loc="lower right")
            top = max(top, bound)
        ax.set_ylim(0, top * 1.1)
        ax.grid(alpha=0.3)
    axes[3].set_xlabel("minutes (grey: warm-up; red: a close and reopen)")
    fig.suptitle(
        "localmq soak: %d queues, %.0f puts/s, %d reopens, %d segments deleted; %d put, %d consumed, "
        "%d retried"
        % (
            summary["queues"],
            summary["put_per_s"],
            summary["reopen_cycles"],
            summary["retention"]["deleted_commit_log_files"],
            summary["put"],
            summary["consumed"],
            summary["retried"],
        ),
        fontsize=9,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, required=True, help="how long producers run")
    ap.add_argument("--queues", type=int, default=200, help="queues (topics x 4; default 200)")
    ap.add_argument("--rate", type=float, default=300.0, help="messages a second, both producers (default 300)")
    ap.add_argument("--reopen-every", type=float, default=25.0, help="seconds between reopen cycles (default 25)")
    ap.add_argument("--drain-timeout", type=float, default=120.0, help="seconds the consumer gets to catch up")
    ap.add_argument(
        "--retention",
        choices=("aged", "instant"),
        default="aged",
        help="aged (default): segments full for --keep s are aged past file_reserved_time=1 h; "
        "instant: file_reserved_time=0, every segment the consumers passed goes at once",
    )
    ap.add_argument("--keep", type=float, default=10.0, help="seconds a full segment is kept before it is aged")
    ap.add_argument("--verbose", action="store_true", help="progress on stderr")
    ap.add_argument("--dir", default=None, help="parent of the temporary store directory (default: the system's)")
    ap.add_argument("--out", default=None, help="write the summary and every sample as JSON here")
    ap.add_argument("--plot", default=None, help="draw fds, mappings, RSS and disk against time into this PNG")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="localmq-soak-", dir=args.dir)
    try:
        soak = Soak(args, root)
        summary = soak.run()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary["reopen_times"] = soak.reopens
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "samples": soak.samples}, f, indent=1)
    if args.plot:
        plot(soak.samples, dict(summary, reopens=[r["t"] for r in soak.reopens]), args.plot)
    print(json.dumps(summary))
    v = summary["verdicts"]
    return 0 if all(v.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
