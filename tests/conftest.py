"""Shared fixtures: the RocketMQ fixture directory and store factories in tmp_path; guards that a test neither hangs
the run nor leaves process-global state changed."""

import faulthandler
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

import localmq
from helpers import require, require_java

# Real RocketMQ files (tests/fixtures/rocketmq/PROVENANCE.md says where each comes from; SHA256SUMS checks them).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rocketmq"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.failed:
        item.stash[_FAILED] = True
    return rep


_FAILED = pytest.StashKey[bool]()


# Signals whose handlers a test (or code it calls, such as localmq.cli.main) must leave as it found them: a forked
# worker inherits them, and a SIGTERM handler that raises made multiprocessing's Pool.terminate() hang (issue 23).
# SIGALRM is pytest-timeout's.
_GUARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGPIPE,
)


@pytest.fixture(autouse=True)
def _process_state_is_left_as_found(request):
    """Fail the test that changes a signal handler, the working directory or the root logger (and put it back), so
    the change cannot leak into later tests and the processes they fork."""
    handlers = {s: signal.getsignal(s) for s in _GUARDED_SIGNALS}
    cwd = os.getcwd()
    root = logging.getLogger()
    log_state = (list(root.handlers), root.level)
    yield
    changed = []
    for s, h in handlers.items():
        if signal.getsignal(s) is not h:
            changed.append(f"the {signal.Signals(s).name} handler")
            signal.signal(s, h)
    if os.getcwd() != cwd:
        changed.append(f"the working directory ({os.getcwd()})")
        os.chdir(cwd)
    if (list(root.handlers), root.level) != log_state:
        changed.append("the root logger's handlers or level")
        root.handlers[:], root.level = log_state[0], log_state[1]
    if changed:
        pytest.fail(f"{request.node.nodeid} left process-global state changed: {', '.join(changed)}", pytrace=False)


# pytest-timeout (``timeout`` in pyproject.toml) fails a stuck test and the run goes on. Its SIGALRM cannot interrupt a
# thread blocked in C that retries on EINTR; then, a minute later, faulthandler prints every thread's stack and ends the
# process, so a hang costs the run at most that minute, never CI's 90.
_HARD_LIMIT_EXTRA_S = 60


@pytest.fixture(autouse=True)
def _hard_time_limit(request):
    limit = request.config.getini("timeout")
    marker = request.node.get_closest_marker("timeout")
    if marker is not None and marker.args:
        limit = marker.args[0]
    limit = float(limit or 0)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + _HARD_LIMIT_EXTRA_S, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _remove_tmp_path_of_passing_test(request):
    """Stores made with the RocketMQ defaults reserve a 1 GiB segment each: a passing test's tmp_path is deleted as
    soon as the test is done (after every other fixture closed its stores), so a run needs the disk of one test at
    a time, not of all of them. A failing test's directory stays for inspection (pytest keeps the last 3 runs)."""
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if path is not None and not request.node.stash.get(_FAILED, False):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _host_disk_does_not_trigger_retention(request, monkeypatch):
    """Stores opened in this process see a 10 %-full disk unless a test injects its own ``disk_usage``: how full
    the host's disk happens to be must not make retention delete segments or refuse puts in unrelated tests
    (seen on a 84 %-full development disk). Retention's own tests inject a fake disk."""
    import localmq.services.clean as clean

    if request.module.__name__.endswith("test_store_retention"):
        return  # those tests inject their disk, and one checks the real statvfs reading
    monkeypatch.setattr(clean, "disk_used_ratio", lambda path: 0.10)


@pytest.fixture(scope="session")
def fixtures_dir():
    d = Path(os.environ.get("LOCALMQ_FIXTURES", FIXTURES))
    if not d.is_dir():
        pytest.fail(f"RocketMQ fixtures not found at {d} (LOCALMQ_FIXTURES names another copy)", pytrace=False)
    return d


@pytest.fixture
def store_factory(tmp_path):
    """open(path=tmp_path/'store', **config); every store opened is closed at teardown."""
    opened = []

    def make(path=None, **config):
        st = localmq.open(path or tmp_path / "store", **config)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


@pytest.fixture
def small_store(store_factory):
    """A store with 64 KiB segments and 10-unit... consume queue files of 200 bytes, so tests roll files."""
    return store_factory(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=200)


def copy_fixture_store(src, dst):
    shutil.copytree(src, dst)
    return dst


def cut_dispatch(path, phys):
    """Zero every ConsumeQueue unit of records at or past commit-log offset ``phys``: the files a dispatcher that
    stopped there leaves behind."""
    import numpy as np

    dtype = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
    for d, _, files in os.walk(os.path.join(path, "consumequeue")):
        for name in files:
            f = os.path.join(d, name)
            units = np.fromfile(f, dtype)
            units[units["offset"] >= phys] = 0
            units.tofile(f)


REPO = Path(__file__).resolve().parents[1]


def pyspark_jars_dir():
    """The jars directory of the installed pyspark wheel (the Spark the JVM reader is compiled against)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


@pytest.fixture(scope="session")
def localmq_spark_jar():
    """spark-jvm/target/localmq-spark.jar, built now with Maven against the pyspark wheel's jars (offline first, as
    .ci/run builds the interop harnesses). A build failure fails every test that needs it, never a skip."""
    require("pyspark")
    mvn = shutil.which("mvn")
    if mvn is None or not shutil.which("javac"):
        pytest.fail(
            "the JVM reader (spark-jvm/) needs a JDK 17 (`javac`) and Maven (`mvn`) on PATH: "
            "apt-get install openjdk-17-jdk-headless maven",
            pytrace=False,
        )
    import subprocess

    pom = REPO / "spark-jvm" / "pom.xml"
    cmd = [mvn, "-q", "-B", "-f", str(pom), f"-Dpyspark.jars={pyspark_jars_dir()}", "package"]
    r = subprocess.run(cmd[:2] + ["-o"] + cmd[2:], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:  # offline needs Maven's plugins in ~/.m2 already: once online
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(
            f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False
        )
    jar = REPO / "spark-jvm" / "target" / "localmq-spark.jar"
    assert jar.is_file(), jar
    return jar


@pytest.fixture(scope="session")
def spark(localmq_spark_jar):
    """One local Spark session (2 cores) for the whole run, with the JVM reader's jar on ``spark.jars`` (one session
    per process: tests read through ``format("localmq-python")``, the Python source, and ``format("localmq-jvm")``;
    with the jar there ``format("localmq")`` is the JVM reader).

    Workers must import this checkout's localmq and its ``pyspark_localmq`` entry, so the repository root goes
    first on their PYTHONPATH.
    """
    require("pyspark")
    require("pyarrow")
    require_java()
    import sys

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("localmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.jars", str(localmq_spark_jar))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
