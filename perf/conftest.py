"""Fixtures for the localmq-vs-peers benchmarks: sizes, bodies, one fresh store per round, and the ratio table."""

import os
import shutil
import struct
import sys

import pytest

import report
from peers import IMPLEMENTATIONS

# LOCALMQ_BENCH_QUICK=1: tiny rounds, to smoke-test the harness itself (the numbers mean nothing).
QUICK = os.environ.get("LOCALMQ_BENCH_QUICK", "") not in ("", "0")
BODY_SIZES = [100, 1024]
# Messages per round; `slow` stores (an fsync, a file rename or a sqlite transaction per message) get
# 1/SLOW_DIVISOR of them.
MESSAGES = {100: 300, 1024: 300} if QUICK else {100: 100_000, 1024: 50_000}
# LOCALMQ_BENCH_MESSAGES=1000000: messages per round of 100 B bodies (1 KiB rounds get half as many)
if os.environ.get("LOCALMQ_BENCH_MESSAGES"):
    _n = int(os.environ["LOCALMQ_BENCH_MESSAGES"])
    MESSAGES = {100: _n, 1024: max(_n // 2, 1)}
SLOW_DIVISOR = 3 if QUICK else 20
ROUNDS = 2 if QUICK else 9  # rounds of the fast stores are 15-60 ms: more of them steady the median
SLOW_ROUNDS = 2 if QUICK else 5
DECODE_ROUNDS = 2 if QUICK else 15
WARMUP_ROUNDS = 0 if QUICK else 1  # one untimed round first (imports, first page faults of the process)
BATCH = 1000

ROWS = pytest.StashKey[list]()


def pytest_configure(config):
    config.stash[ROWS] = []


def pytest_report_header(config):
    mode = "QUICK (LOCALMQ_BENCH_QUICK=1)" if QUICK else "full"
    return (
        f"localmq perf: {mode} mode, messages/round {MESSAGES} (slow stores 1/{SLOW_DIVISOR}), "
        f"rounds {ROUNDS} (slow {SLOW_ROUNDS}, decode {DECODE_ROUNDS}) after {WARMUP_ROUNDS} warm-up"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    shared = sys.modules.get("test_shared_bench")
    if shared is not None and shared.RESULTS:
        terminalreporter.section("many processes, one store (same run)")
        for line in shared.table_lines():
            terminalreporter.write_line(line)
    takeover = sys.modules.get("test_takeover_bench")
    if takeover is not None and takeover.RESULTS:
        terminalreporter.section("takeover after SIGKILL, shared store (same run)")
        for line in takeover.table_lines():
            terminalreporter.write_line(line)
    rows = config.stash.get(ROWS, [])
    if not rows:
        return
    terminalreporter.section("localmq vs peers (same run)")
    for line in report.format_table(rows):
        terminalreporter.write_line(line)


def localmq_missing():
    """Why localmq cannot be benchmarked yet (it is built in place by its owner), or None."""
    try:
        import localmq
    except ImportError as e:
        return f"localmq not importable: {e}"
    if not hasattr(localmq, "open"):
        return "localmq has no attribute 'open' yet"
    return None


@pytest.fixture
def need_localmq():
    """Skips the test (with the reason) until localmq is importable; request it before ``bench``."""
    why = localmq_missing()
    if why:
        pytest.skip(why)


@pytest.fixture(params=BODY_SIZES, ids=lambda n: f"{n}B")
def body_size(request):
    return request.param


@pytest.fixture(params=list(IMPLEMENTATIONS))
def impl(request):
    """The Store class under test; localmq tests skip (with the reason) until the package is importable.

    Tests request it before ``bench``: a skip after the benchmark fixture exists is a warning, hence an error."""
    if request.param == "localmq":
        why = localmq_missing()
        if why:
            pytest.skip(why)
    return IMPLEMENTATIONS[request.param]


_BODIES = {}


def make_bodies(count, size):
    """``count`` distinct bodies of ``size`` bytes: a big-endian index, then a fixed pseudo-random filler."""
    key = (count, size)
    if key not in _BODIES:
        import random

        filler = random.Random(size).randbytes(size)
        pack = struct.Struct(">Q").pack
        _BODIES.clear()  # one size at a time: the 1 KiB list is ~60 MB
        _BODIES[key] = [pack(i) + filler[8:] for i in range(count)]
    return _BODIES[key]


def message_count(cls, body_size):
    n = MESSAGES[body_size]
    return max(n // SLOW_DIVISOR, 10) if cls.slow else n


class Bench:
    """Runs ``benchmark.pedantic`` with a fresh store in a fresh directory under tmp_path for every round."""

    def __init__(self, benchmark, request, tmp_path):
        self.benchmark = benchmark
        self.config = request.config
        self.tmp_path = tmp_path

    def run(
        self,
        *,
        scenario,
        cls,
        body_size,
        count,
        target,
        prepare=None,
        verify=None,
        rounds=None,
        implementation=None,
        note="",
        caveats=(),
    ):
        """Time ``target(store)`` per round; ``prepare(store)`` and ``verify(store, result)`` are untimed.

        ``verify`` runs after every round so a broken store cannot look fast. ``caveats`` (filled while the
        rounds run) are printed under the table.
        """
        state = {"round": 0, "dir": None, "result": None}

        def setup():
            state["round"] += 1
            d = self.tmp_path / f"round{state['round']}"
            d.mkdir()
            state["dir"] = d
            store = cls().open(d, count, body_size)
            if prepare is not None:
                prepare(store)
            return (store,), {}

        def timed(store):
            state["result"] = target(store)

        def teardown(store):
            try:
                if verify is not None:
                    verify(store, state["result"])
            finally:
                store.close()
                shutil.rmtree(state["dir"])

        name = implementation or cls.name
        info = self.benchmark.extra_info
        info.update(
            scenario=scenario, body_size=body_size, implementation=name, messages=count, body_bytes=count * body_size
        )
        if note:
            info["how"] = note
        if rounds is None:
            rounds = SLOW_ROUNDS if cls.slow else ROUNDS
        self.benchmark.pedantic(timed, setup=setup, teardown=teardown, rounds=rounds, warmup_rounds=WARMUP_ROUNDS)
        if caveats:
            info["caveat"] = "; ".join(sorted(caveats))
        stats = getattr(self.benchmark, "stats", None)
        if stats is not None:  # None under --benchmark-disable
            self.config.stash[ROWS].append(report.row_from_extra_info(info, stats.stats.median))


@pytest.fixture
def bench(benchmark, request, tmp_path):
    return Bench(benchmark, request, tmp_path)
