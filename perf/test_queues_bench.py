"""The three queues (Memory, Embedded, Local) through their producers and consumers, in one run.

Scenarios: one producer sending, one consumer polling (``poll()`` one message at a time and ``poll_batch``),
4 producers + 4 consumers (threads), 1 / 100 / 1000 topics written round-robin then flushed (the Embedded
queue's file per bucket against the Local queue's one CommitLog), and put -> poll latency to a waiting consumer.
The table at the end names the Local queue ``localmq`` so its ratio column reads Local / other queue.

    python -m pytest perf/test_queues_bench.py --benchmark-only -q -p no:cacheprovider -s
"""

import shutil
import threading
import time

import pytest

import report
from conftest import QUICK, ROWS, make_bodies

localmq = pytest.importorskip("localmq")

KINDS = ["memory", "embedded", "local"]
NAMES = {"memory": "localmq-memory", "embedded": "localmq-embedded", "local": "localmq"}
BODY_SIZES = [100, 1024]
N = {100: 2000, 1024: 1000} if QUICK else {100: 50_000, 1024: 20_000}
ROUNDS = 2 if QUICK else 5
TOPIC_COUNTS = [1, 100, 1000]
TOPIC_MESSAGES = 2000 if QUICK else 20_000
LATENCY_SAMPLES = 100 if QUICK else 2000


def open_queue(kind, d, **extra):
    if kind == "memory":
        return localmq.MemoryMessageQueue()
    if kind == "embedded":
        return localmq.open(d, kind="embedded", **extra.get("embedded", {}))
    return localmq.open(d, **extra.get("local", {}))


class Round:
    """Fresh queue in a fresh directory per round (open, prepare and close untimed)."""

    def __init__(self, benchmark, request, tmp_path, kind, scenario, body_size, count, **extra):
        self.benchmark = benchmark
        self.config = request.config
        self.tmp_path = tmp_path
        self.kind = kind
        self.scenario = scenario
        self.body_size = body_size
        self.count = count
        self.extra = extra
        self.n = 0

    def run(self, target, prepare=None, verify=None, rounds=ROUNDS):
        state = {}

        def setup():
            self.n += 1
            d = self.tmp_path / f"r{self.n}"
            d.mkdir()
            mq = open_queue(self.kind, d, **self.extra)
            ctx = {"mq": mq, "dir": d}
            if prepare is not None:
                prepare(ctx)
            return (ctx,), {}

        def timed(ctx):
            state["result"] = target(ctx)

        def teardown(ctx):
            try:
                if verify is not None:
                    verify(ctx, state["result"])
            finally:
                ctx["mq"].close()
                shutil.rmtree(ctx["dir"])

        info = self.benchmark.extra_info
        info.update(
            scenario=self.scenario,
            body_size=self.body_size,
            implementation=NAMES[self.kind],
            messages=self.count,
            body_bytes=self.count * self.body_size,
        )
        self.benchmark.pedantic(timed, setup=setup, teardown=teardown, rounds=rounds, warmup_rounds=0 if QUICK else 1)
        stats = getattr(self.benchmark, "stats", None)
        if stats is not None:
            self.config.stash[ROWS].append(report.row_from_extra_info(info, stats.stats.median))


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(params=BODY_SIZES, ids=lambda n: f"{n}B")
def size(request):
    return request.param


def fill(ctx, bodies, topic="T"):
    p = ctx["mq"].create_producer(queue_id=0)
    for b in bodies:
        p.send(topic, b)
    if isinstance(ctx["mq"], localmq.LocalMessageQueue):
        ctx["mq"].wait_for_dispatch(60)


def test_send(benchmark, request, tmp_path, kind, size):
    """One producer, ``send`` per message."""
    bodies = make_bodies(N[size], size)

    def target(ctx):
        send = ctx["mq"].create_producer(queue_id=0).send
        for b in bodies:
            send("T", b)

    def verify(ctx, _):
        mq = ctx["mq"]
        if isinstance(mq, localmq.LocalMessageQueue):
            mq.wait_for_dispatch(60)
        assert mq.max_offset("T", 0) == len(bodies)

    Round(benchmark, request, tmp_path, kind, "send", size, len(bodies)).run(target, verify=verify)


def test_send_batch(benchmark, request, tmp_path, kind, size):
    """One producer, ``send_batch`` of 100 bodies."""
    bodies = make_bodies(N[size], size)
    chunks = [bodies[i : i + 100] for i in range(0, len(bodies), 100)]

    def target(ctx):
        send_batch = ctx["mq"].create_producer(queue_id=0).send_batch
        for c in chunks:
            send_batch("T", c)

    Round(benchmark, request, tmp_path, kind, "send_batch_100", size, len(bodies)).run(target)


def _consume_all(ctx, count, batch):
    c = ctx["mq"].create_consumer("g", "T", batch_size=32)
    got = 0
    last = None
    if batch:
        while got < count:
            ms = c.poll_batch(batch, timeout=5)
            if not ms:
                break
            got += len(ms)
            last = ms[-1]
    else:
        poll = c.poll
        while got < count:
            m = poll(5)
            if m is None:
                break
            got += 1
            last = m
    return got, last


@pytest.mark.parametrize("batch", [0, 256], ids=["poll", "poll_batch"])
def test_consume(benchmark, request, tmp_path, kind, size, batch):
    """One consumer reading every message of a filled queue: ``poll()`` per message, or ``poll_batch(256)``."""
    bodies = make_bodies(N[size], size)

    def verify(ctx, result):
        got, last = result
        assert got == len(bodies) and bytes(last.body) == bodies[-1]

    Round(benchmark, request, tmp_path, kind, "poll" if not batch else "poll_batch_256", size, len(bodies)).run(
        lambda ctx: _consume_all(ctx, len(bodies), batch), prepare=lambda ctx: fill(ctx, bodies), verify=verify
    )


def test_4_producers_4_consumers(benchmark, request, tmp_path, kind, size):
    """4 producer threads send N/4 each while 4 consumers of one group (auto_commit, so a queue handed over in a
    rebalance continues where its previous owner stopped) poll_batch until all N came; each message exactly once."""
    bodies = make_bodies(N[size], size)
    quarter = len(bodies) // 4

    def target(ctx):
        mq = ctx["mq"]
        counts = [0] * 4
        stop = threading.Event()
        consumers = [mq.create_consumer("g", "T", rebalance_interval_ms=10, auto_commit=True) for _ in range(4)]

        def produce(i):
            p = mq.create_producer()
            for b in bodies[i * quarter : (i + 1) * quarter]:
                p.send("T", b)

        def consume(j):
            c = consumers[j]
            while not stop.is_set():
                counts[j] += len(c.poll_batch(256, timeout=0.05))

        ts = [threading.Thread(target=consume, args=(j,)) for j in range(4)]
        ts += [threading.Thread(target=produce, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        deadline = time.monotonic() + 120
        while sum(counts) < 4 * quarter and time.monotonic() < deadline:
            time.sleep(0.0002)
        # stopping the threads is not timed (verify joins them)
        ctx["stop"] = (stop, ts, consumers, counts)
        return sum(counts)

    def verify(ctx, got):
        stop, ts, consumers, counts = ctx["stop"]
        stop.set()
        for c in consumers:
            c.close()
        for t in ts:
            t.join()
        assert got == 4 * quarter and sum(counts) == got

    Round(benchmark, request, tmp_path, kind, "4_producers_4_consumers", size, 4 * quarter).run(target, verify=verify)


@pytest.mark.parametrize("topics", TOPIC_COUNTS)
def test_many_topics(benchmark, request, tmp_path, kind, topics):
    """1 KiB messages to 1, 100 or 1000 topics round-robin, then ``flush()`` (timed): per-bucket files against one
    log. Embedded partitions are 1 MiB and Local ConsumeQueue files 80 KiB here so 1000 of them stay small."""
    bodies = make_bodies(TOPIC_MESSAGES, 1024)
    names = [f"T{i}" for i in range(topics)]

    def target(ctx):
        mq = ctx["mq"]
        send = mq.create_producer(queue_id=0).send
        k = len(names)
        for i, b in enumerate(bodies):
            send(names[i % k], b)
        if not isinstance(mq, localmq.MemoryMessageQueue):
            mq.flush()

    Round(
        benchmark,
        request,
        tmp_path,
        kind,
        f"topics_{topics}",
        1024,
        len(bodies),
        embedded={"partition_size": 1 << 20},
        local={"mapped_file_size_consume_queue": 20 * 4096},
    ).run(target, rounds=3)


def test_put_to_poll_latency(benchmark, request, tmp_path, kind):
    """A consumer waits in ``poll``; the producer sends one 100 B message, waits until it was received, repeats.
    Records p50 / p99 / max of send -> poll return (microseconds) in extra_info and prints them."""
    d = tmp_path / "lat"
    d.mkdir()
    mq = open_queue(kind, d)
    try:
        p = mq.create_producer(queue_id=0)
        c = mq.create_consumer("g", "T")
        got = threading.Event()
        lat = []
        sent_at = [0]
        stop = threading.Event()

        def consume():
            while not stop.is_set():
                m = c.poll(0.2)
                if m is not None:
                    lat.append(time.perf_counter_ns() - sent_at[0])
                    got.set()

        t = threading.Thread(target=consume)
        t.start()
        body = b"x" * 100

        def run():
            for _ in range(LATENCY_SAMPLES):
                got.clear()
                time.sleep(0.0005)  # the consumer is waiting again
                sent_at[0] = time.perf_counter_ns()
                p.send("T", body)
                assert got.wait(10)

        benchmark.pedantic(run, rounds=1, warmup_rounds=0)
        stop.set()
        t.join()
    finally:
        mq.close()
    lat.sort()
    us = [x / 1000 for x in lat]
    p50, p99 = us[len(us) // 2], us[int(len(us) * 0.99)]
    benchmark.extra_info.update(
        scenario="latency", implementation=NAMES[kind], p50_us=p50, p99_us=p99, max_us=us[-1], samples=len(us)
    )
    print(
        f"\nput->poll latency {NAMES[kind]}: p50 {p50:.0f} us, p99 {p99:.0f} us, max {us[-1]:.0f} us "
        f"({len(us)} samples)"
    )
