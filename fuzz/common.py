"""What every fuzz target shares: the seed corpus from the RocketMQ fixtures, the exception rule, and a plain
mutation driver for machines without atheris.

A target module defines ``TestOneInput(data: bytes)`` and ``seeds()`` (a list of bytes) and ends with
``main(TestOneInput, seeds)``. Run alone it fuzzes with atheris (libFuzzer, coverage-guided) when atheris is
installed, else with the plain driver; ``fuzz/run.py`` runs every target for a bounded time.
"""

import atexit
import logging
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the in-place build of this checkout, as the tests use (PYTHONPATH=$PWD)

try:  # coverage guidance for localmq's Python code (the compiled modules are not instrumented)
    import atheris

    _ATHERIS = "--plain" not in sys.argv
except ImportError:
    _ATHERIS = False
if _ATHERIS:
    with atheris.instrument_imports(include=["localmq"]):
        import localmq  # noqa: F401
        import localmq.store.checkpoint  # noqa: F401
        import localmq.store.config_json  # noqa: F401
        import localmq.store.index  # noqa: F401
        import localmq.store.readers  # noqa: F401

from localmq.errors import CorruptMessageError, LocalMQError  # noqa: E402

logging.disable(logging.CRITICAL)  # the readers log every damaged unit they skip: millions of lines here

FIXTURES = os.environ.get("LOCALMQ_FIXTURES", os.path.join(ROOT, "tests", "fixtures", "rocketmq"))


def fixture_files(predicate):
    """Bytes of every fixture file whose path (relative to the fixture directory) satisfies ``predicate``."""
    out = []
    for d, _, names in os.walk(FIXTURES):
        for name in sorted(names):
            p = os.path.join(d, name)
            rel = os.path.relpath(p, FIXTURES).replace(os.sep, "/")
            if predicate(rel):
                with open(p, "rb") as f:
                    out.append(f.read())
    return out


def v2_segment_seed(limit=4096):
    """A segment start as RocketMQ 5.x writes it: V1 records (short topics) and V2 records (topics over 127 bytes:
    int16 topic length) interleaved, then a record of an unknown format (a later magic) framed by its length."""
    from localmq._record import encode_message

    out = b""
    i = 0
    while len(out) < limit - 600:
        topic = "T" * (130 + i % 100) if i % 2 else "TopicTest"
        out += encode_message(
            topic,
            b"body-%d" % i,
            queue_id=i % 4,
            queue_offset=i // 2,
            physical_offset=len(out),
            properties={"TAGS": "t", "KEYS": "k%d" % i},
        )
        i += 1
    out += (300).to_bytes(4, "big") + bytes.fromhex("daa320af") + bytes([7]) * 292
    return out[:limit]


def commitlog_seeds(limit=4096):
    """Commit log segments of the fixtures, cut to ``limit`` bytes (whole records at their start), and a segment
    with V2 records (no RocketMQ fixture holds one)."""
    return [d[:limit] for d in fixture_files(lambda r: "/commitlog/" in r) if d.strip(b"\0")] + [v2_segment_seed(limit)]


def expected(exc):
    """The rule every target checks: only LocalMQError subclasses may come out (a crash is a failure too)."""
    return isinstance(exc, LocalMQError)


def check(fn, *args, **kwargs):
    """Call ``fn``; an exception other than a LocalMQError propagates (the fuzzer reports it)."""
    try:
        return fn(*args, **kwargs)
    except LocalMQError:
        return None


class Input:
    """Reads fuzzer bytes as the arguments of one call (atheris' FuzzedDataProvider without atheris)."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def int(self, nbytes, signed=True):
        chunk = self.data[self.pos : self.pos + nbytes]
        self.pos += nbytes
        return int.from_bytes(chunk.ljust(nbytes, b"\0"), "little", signed=signed)

    def choice(self, options):
        return options[self.int(1, False) % len(options)]

    def rest(self):
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


def read_queue_to_end(st, topic, qid, allowed):
    """Every body of queue (topic, qid) from its min offset to its end through ``get_message``, a CorruptMessageError
    skipped at its ``next_offset``; AssertionError for a body not in ``allowed`` (damage never turns into wrong
    data) or a read that never ends."""
    off = st.min_offset(topic, qid)
    read = []
    for _ in range(10000):
        try:
            g = st.get_message(topic, qid, off, 64)
        except CorruptMessageError as e:
            off = e.next_offset
            continue
        for m in g.messages:
            if m.body not in allowed:
                raise AssertionError(f"{topic}-{qid} offset {m.queue_offset}: a body never written there")
            read.append(m.body)
        if not g.messages and g.next_begin_offset <= off:
            return read
        off = g.next_begin_offset
    raise AssertionError(f"{topic}-{qid}: reading never ends")


def temp_file(data, name="f"):
    """Write ``data`` to a fresh file in a per-process temporary directory (removed at exit); returns its path."""
    d = os.path.join(tempfile.gettempdir(), f"localmq-fuzz-{os.getpid()}")
    if not os.path.isdir(d):
        os.makedirs(d)
        atexit.register(shutil.rmtree, d, True)
    p = os.path.join(d, name)
    with open(p, "wb") as f:
        f.write(data)
    return p


def mutate(rng, data, corpus):
    """One random mutation of ``data`` (bit flips, byte sets, interesting ints, cuts, splices, inserts)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[rng.randrange(len(b))] = rng.choice((0, 1, 2, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2 and len(b) >= 4:
            i = rng.randrange(len(b) - 3)
            v = rng.choice((0, 1, -1, 0x7FFFFFFF, -0x80000000, 0x7FFF, -0x8000, rng.randrange(-1 << 31, 1 << 31)))
            b[i : i + 4] = (v & 0xFFFFFFFF).to_bytes(4, rng.choice(("big", "little")))
        elif op == 3 and b:
            del b[rng.randrange(len(b)) :]
        elif op == 4 and corpus:
            other = rng.choice(corpus)
            i = rng.randrange(len(b) + 1)
            j = rng.randrange(len(other) + 1)
            b[i:] = other[j : j + rng.randrange(1, 256)]
        elif op == 5:
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        elif op == 6 and len(b) > 1:
            i = rng.randrange(len(b))
            j = rng.randrange(i, min(len(b), i + 64))
            del b[i:j]
    return bytes(b)


def plain_fuzz(test, seeds, seconds=None, runs=None, seed=None, report=True):
    """The fallback driver: seeds first, then random mutations of the corpus, until ``seconds`` or ``runs``.
    Returns the number of inputs run. Inputs that raised nothing new are not kept (no coverage feedback)."""
    rng = random.Random(seed)
    corpus = [bytes(s) for s in seeds] or [b""]
    n = 0
    start = time.monotonic()
    for s in corpus:
        test(s)
        n += 1
    while True:
        if runs is not None and n >= runs:
            break
        if seconds is not None and time.monotonic() - start >= seconds:
            break
        data = mutate(rng, rng.choice(corpus), corpus)
        try:
            test(data)
        except BaseException:
            crash = os.path.abspath(f"crash-plain-{os.getpid()}")
            with open(crash, "wb") as f:
                f.write(data)
            sys.stderr.write(f"input that failed written to {crash}\n")
            raise
        n += 1
        if len(corpus) < 512 and rng.random() < 0.01:
            corpus.append(data)
    if report:
        print(f"Done {n} runs in {time.monotonic() - start:.0f} second(s) (plain driver)", flush=True)
    return n


def main(test, seeds):
    """Entry point of a target file: ``--plain [--seconds N] [--runs N] [--seed N]`` for the plain driver, else
    atheris with libFuzzer's own arguments (``-max_total_time=N``, ``-runs=N``, a corpus directory); without
    atheris the plain driver runs."""
    argv = sys.argv[1:]
    plain = "--plain" in argv
    if not plain:
        try:
            import atheris
        except ImportError:
            plain = True
    if plain:
        seconds = runs = seed = None
        for i, a in enumerate(argv):
            if a == "--seconds":
                seconds = float(argv[i + 1])
            elif a == "--runs":
                runs = int(argv[i + 1])
            elif a == "--seed":
                seed = int(argv[i + 1])
        if seconds is None and runs is None:
            seconds = 10
        plain_fuzz(test, seeds(), seconds, runs, seed)
        return
    corpus_dirs = [a for a in argv if not a.startswith("-")]
    if not corpus_dirs:  # a fresh corpus directory seeded from the fixtures
        d = tempfile.mkdtemp(prefix="localmq-fuzz-corpus-")
        argv.append(d)
        corpus_dirs = [d]
    d = corpus_dirs[0]
    if os.path.isdir(d) and not os.listdir(d):  # an empty corpus directory starts from the seeds
        for i, s in enumerate(seeds()):
            with open(os.path.join(d, f"seed-{i}"), "wb") as f:
                f.write(s)
    # libFuzzer runs argv[0] through the shell for the inner processes of -merge=1 (and -fork, -jobs): the
    # interpreter and the target's path, since a target file is not executable
    atheris.Setup([f"{sys.executable} {os.path.abspath(sys.argv[0])}", *argv], test)
    atheris.Fuzz()
