"""Acknowledged consumption, retries and delayed delivery (issue 15), beside the Python ack queues a user would pick.

    python -m pytest perf/test_ack_bench.py --benchmark-only -q -p no:cacheprovider -s

- ``test_ack_consume``: consume N 100-byte messages with one acknowledgement per message, then make the consumed
  position durable: localmq (a ``manual_ack`` consumer: ``poll_batch`` + ``m.ack()`` each, ``commit()`` at the
  end), persist-queue's ``SQLiteAckQueue`` (``get()`` + ``ack()`` each; its acks are its commits) and diskcache used
  as an ack queue (``Cache.pull`` from a queue prefix, the item parked under an in-flight key, deleted on ack: the
  same at-least-once contract). The messages are put before each round, untimed.
- ``test_retry_round_trip``: ``nack`` -> delivery again through ``%RETRY%<group>`` with a 1 s delay level: the
  time beyond the 1 s (schedule service wake-up, two re-puts, dispatch, long poll), p50 / p99 over 200 messages.
- ``test_schedule_delivery``: ScheduleMessageService draining 1,000,000 due delayed messages (the store is reopened
  with a 1 s level after putting them under a 1 h level, so all are due at once): messages delivered per second.
"""

import os
import shutil
import statistics
import time

import pytest

import report
from conftest import QUICK, ROWS

localmq = pytest.importorskip("localmq")

BODY = 100
ACK_MESSAGES = {
    "localmq": 2_000 if QUICK else 100_000,
    "persistqueue.SQLiteAckQueue": 300 if QUICK else 5_000,
    "diskcache ack queue": 300 if QUICK else 10_000,
}
ROUNDS = 2 if QUICK else 5
SCHEDULE_MESSAGES = 20_000 if QUICK else 1_000_000
RETRY_MESSAGES = 20 if QUICK else 200
SMALL = {"mapped_file_size_commit_log": 64 << 20, "mapped_file_size_consume_queue": 300_000 * 20}


def _bodies(n):
    filler = bytes(range(256)) * (BODY // 256 + 1)
    return [i.to_bytes(8, "big") + filler[: BODY - 8] for i in range(n)]


class LocalMQAck:
    name = "localmq"

    def open(self, d, bodies):
        self.st = localmq.open(d, **SMALL)
        put = self.st.put
        for b in bodies:
            put("jobs", b, queue_id=0)
        self.st.wait_for_dispatch()
        self.c = self.st.create_consumer("workers", "jobs", manual_ack=True, batch_size=256)
        return self

    def consume(self, n):
        got, poll = 0, self.c.poll_batch
        while got < n:
            for m in poll(256, timeout=5):
                m.ack()
                got += 1
        self.c.commit()  # durable: consumerOffset.json fsynced and renamed
        return got

    def check(self, n):
        assert self.c.committed("jobs", 0) == n

    def close(self):
        self.c.close()
        self.st.close()


class PersistQueueAck:
    name = "persistqueue.SQLiteAckQueue"

    def open(self, d, bodies):
        import persistqueue

        self.q = persistqueue.SQLiteAckQueue(str(d), auto_commit=True, multithreading=False)
        for b in bodies:
            self.q.put(b)
        return self

    def consume(self, n):
        get, ack = self.q.get, self.q.ack
        for _ in range(n):
            ack(get(block=False))
        return n

    def check(self, n):
        assert self.q.acked_count() == n

    def close(self):
        self.q.close() if hasattr(self.q, "close") else None


class DiskcacheAck:
    name = "diskcache ack queue"

    def open(self, d, bodies):
        import diskcache

        self.c = diskcache.Cache(str(d))
        for b in bodies:
            self.c.push(b, prefix="q")
        return self

    def consume(self, n):
        c = self.c
        for _ in range(n):
            key, body = c.pull(prefix="q")
            c.set(("inflight", key), body)  # redelivered by a sweeper if the worker dies before the ack
            c.delete(("inflight", key))  # the ack
        return n

    def check(self, n):
        assert len(self.c) == 0

    def close(self):
        self.c.close()


IMPLS = {cls.name: cls for cls in (LocalMQAck, PersistQueueAck, DiskcacheAck)}


@pytest.mark.parametrize("impl", list(IMPLS))
def test_ack_consume(benchmark, request, tmp_path, impl):
    if impl != "localmq":
        pytest.importorskip({"persistqueue.SQLiteAckQueue": "persistqueue", "diskcache ack queue": "diskcache"}[impl])
    n = ACK_MESSAGES[impl]
    bodies = _bodies(n)
    state = {"round": 0}

    def setup():
        state["round"] += 1
        d = tmp_path / f"r{state['round']}"
        d.mkdir()
        state["dir"] = d
        return (IMPLS[impl]().open(d, bodies),), {}

    def teardown(store):
        try:
            store.check(n)
        finally:
            store.close()
            shutil.rmtree(state["dir"])

    def timed(store):
        assert store.consume(n) == n

    benchmark.pedantic(timed, setup=setup, teardown=teardown, rounds=ROUNDS, warmup_rounds=0)
    info = benchmark.extra_info
    info.update(scenario="consume_ack_each", body_size=BODY, implementation=impl, messages=n, body_bytes=n * BODY)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        request.config.stash[ROWS].append(report.row_from_extra_info(info, stats.stats.median))


def test_retry_round_trip(benchmark, tmp_path):
    """nack -> the same message again from the retry topic, with a 1 s level: the latency beyond the 1 s."""
    st = localmq.open(tmp_path / "s", message_delay_level="1s", **SMALL)
    try:
        p = st.create_producer(queue_id=0)
        for i in range(RETRY_MESSAGES):
            p.send("jobs", b"%d" % i)
        c = st.create_consumer("workers", "jobs", manual_ack=True)
        nacked = {}
        extra = []

        def run():
            first = []
            while len(first) < RETRY_MESSAGES:
                first += c.poll_batch(64, timeout=5)
            for m in first:
                nacked[m.body] = time.monotonic()
                m.nack(delay_level=1)
            got = 0
            while got < RETRY_MESSAGES:
                for m in c.poll_batch(64, timeout=5):
                    extra.append((time.monotonic() - nacked[m.body] - 1.0) * 1000)
                    m.ack()
                    got += 1

        benchmark.pedantic(run, rounds=1, iterations=1)
        extra.sort()
        p50 = statistics.median(extra)
        p99 = extra[min(len(extra) - 1, int(len(extra) * 0.99))]
        benchmark.extra_info.update(retry_extra_ms_p50=p50, retry_extra_ms_p99=p99, messages=RETRY_MESSAGES)
        print(
            f"\nretry round trip beyond the 1 s delay level: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
            f"min {extra[0]:.1f} ms ({RETRY_MESSAGES} messages nacked in one burst)"
        )
        assert extra[0] >= -5  # never early (ms clocks truncate separately)
        c.close()
    finally:
        st.close()


def test_schedule_delivery(benchmark, tmp_path):
    """The schedule service drains SCHEDULE_MESSAGES messages that are all due."""
    d = tmp_path / "s"
    st = localmq.open(d, message_delay_level="1h", **SMALL)
    body = _bodies(1)[0]
    p = st.create_producer(queue_id=0, uniq_keys=False)
    for _ in range(SCHEDULE_MESSAGES):
        p.send("late", body, delay_level=1)
    st.close()
    time.sleep(1.1)
    result = {}

    def run():
        s2 = localmq.open(d, message_delay_level="1s", **SMALL)
        try:
            t0 = time.perf_counter()
            before = s2.schedule_service.delivered
            while s2.schedule_service.offsets.get(1, 0) < SCHEDULE_MESSAGES:
                time.sleep(0.01)
            dt = time.perf_counter() - t0
            result["rate"] = (SCHEDULE_MESSAGES - before) / dt
            s2.wait_for_dispatch()
            assert s2.max_offset("late", 0) == SCHEDULE_MESSAGES
        finally:
            s2.close()

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(delivered_per_s=result["rate"], messages=SCHEDULE_MESSAGES)
    print(
        f"\nschedule service: {result['rate']:,.0f} delayed messages delivered per second "
        f"({SCHEDULE_MESSAGES:,} due at once)"
    )
    shutil.rmtree(d)
    assert not os.path.exists(d)
