"""How a pip user gets the JVM reader (issue 28): localmq.spark.jar_path() builds the jar with javac + jar into a
cache, configure_spark() puts it on a session, and there format("localmq") is the JVM reader."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from localmq.errors import LocalMQError, MissingToolError
from tests.helpers import require

REPO = Path(__file__).resolve().parent.parent
SERVICES = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"


def run(code, env, timeout):
    """Run ``code`` in a fresh interpreter in its own process group; on a timeout the whole group (a Spark JVM
    included) is killed, so no JVM outlives the test. Returns the CompletedProcess."""
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"timed out after {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def child_env(**extra):
    """This environment with the checkout first on PYTHONPATH (a worktree's localmq, not the installed one)."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


@pytest.fixture(scope="module")
def xdg_cache(tmp_path_factory):
    """An XDG cache directory holding the jar built by jar_path(), by two processes at once: both get the same
    path, one builds while the other waits on the lock, and neither sees a half-written jar."""
    require("pyspark")
    xdg = tmp_path_factory.mktemp("xdg")
    code = "import localmq.spark; print(localmq.spark.jar_path())"
    env = child_env(XDG_CACHE_HOME=str(xdg))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:  # javac is a JVM: none outlives a failed wait (the group holds javac and jar too)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1, paths
    jar = Path(paths.pop())
    assert jar.parent.parent == xdg / "localmq" / "spark" and jar.name == "localmq-spark.jar"
    # the temporary build directories are gone: only the jar and the lock file stay
    assert sorted(p.name for p in jar.parent.iterdir()) == [".lock", "localmq-spark.jar"]
    return xdg, jar


@pytest.mark.timeout(900)
def test_jar_path_builds_the_maven_jar_once(xdg_cache, localmq_spark_jar, monkeypatch):
    """The javac-built jar holds the classes and the service registration Maven's holds; a second call returns the
    cached jar without building (it needs no javac: PATH without one, no JAVA_HOME)."""
    import localmq.spark

    xdg, jar = xdg_cache
    mine, maven = zipfile.ZipFile(jar), zipfile.ZipFile(localmq_spark_jar)
    assert mine.testzip() is None
    classes = sorted(n for n in mine.namelist() if n.endswith(".class"))
    assert classes == sorted(n for n in maven.namelist() if n.endswith(".class"))
    assert "localmq/spark/LocalMQProvider.class" in classes
    assert (
        mine.read(SERVICES)
        == maven.read(SERVICES)
        == b"localmq.spark.LocalMQTableProvider\nlocalmq.spark.LocalMQProvider\n"
    )
    before = jar.stat()
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert localmq.spark.jar_path(xdg / "localmq" / "spark") == str(jar)
    after = jar.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_jar_path_names_what_is_missing(tmp_path, monkeypatch):
    """No javac (a JRE only, or no JDK on PATH): a MissingToolError naming it, before anything is written; no
    pyspark: one naming pyspark."""
    require("pyspark")
    import localmq.spark

    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(MissingToolError, match="needs the JDK's `javac`") as e:
        localmq.spark.jar_path(tmp_path / "cache")
    assert e.value.missing == "javac"
    assert isinstance(e.value, LocalMQError) and isinstance(e.value, FileNotFoundError)
    assert not (tmp_path / "cache").exists()
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ModuleNotFoundError
    with pytest.raises(MissingToolError, match="pip install 'localmq\\[spark\\]'") as e:
        localmq.spark.jar_path(tmp_path / "cache")
    assert e.value.missing == "pyspark"


def test_configure_spark_appends_the_jar_and_keeps_what_is_set(monkeypatch):
    """spark.jars keeps the jars already there (the reader's goes last, once); the workers' Python is this one
    unless a conf or PYSPARK_PYTHON already names one. A builder starts no JVM until getOrCreate()."""
    require("pyspark")
    from pyspark.sql import SparkSession

    import localmq.spark

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    b = SparkSession.Builder().config("spark.jars", "/opt/a.jar")
    assert localmq.spark.configure_spark(b, jar="/c/localmq-spark.jar") is b
    assert b._options["spark.jars"] == "/opt/a.jar,/c/localmq-spark.jar"
    assert b._options["spark.pyspark.python"] == b._options["spark.pyspark.driver.python"] == sys.executable
    localmq.spark.configure_spark(b, jar="/c/localmq-spark.jar")
    assert b._options["spark.jars"] == "/opt/a.jar,/c/localmq-spark.jar"

    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    b = SparkSession.Builder().config("spark.pyspark.driver.python", "/venv/bin/python")
    localmq.spark.configure_spark(b, jar="/c/localmq-spark.jar")
    assert b._options["spark.jars"] == "/c/localmq-spark.jar"
    assert "spark.pyspark.python" not in b._options  # PYSPARK_PYTHON says it
    assert b._options["spark.pyspark.driver.python"] == "/venv/bin/python"


SESSION = textwrap.dedent("""
    import json, os, sys
    import localmq, localmq.spark
    from pyspark.sql import SparkSession

    path = sys.argv[1]
    with localmq.open(path, mapped_file_size_commit_log=65536) as st:
        for i in range(500):
            st.put("t%d" % (i % 3), b"body %d " % i * (i % 40), queue_id=i % 4, tags="x" if i % 2 else None)
    builder = (SparkSession.builder.master("local[2]").appName("localmq-jar-test").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "1g"))
    spark = localmq.spark.configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        conf = spark.sparkContext.getConf()
        lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource
        sql_conf = spark._jsparkSession.sessionState().conf()
        cols = ["topic", "partition", "offset", "value", "tags", "physical_offset", "msg_id"]
        rows = {fmt: sorted(tuple(r) for r in spark.read.format(fmt).option("mapped_file_size_commit_log", 65536)
                            .load(path).select(*cols).collect())
                for fmt in ("localmq", "localmq-jvm", "localmq-python")}
        plans = {fmt: spark.read.format(fmt).load(path)._jdf.queryExecution().executedPlan().toString()
                 for fmt in ("localmq", "localmq-python")}
        stream = spark.readStream.format("localmq").option("mapped_file_size_commit_log", 65536).load(path)
        # the stream through the alias, run to the end of what is there (the JVM reader's MicroBatchStream)
        q = (spark.readStream.format("localmq").option("mapped_file_size_commit_log", 65536)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 120).load(path).select(*cols)
             .writeStream.format("memory").queryName("via_alias").trigger(availableNow=True)
             .option("checkpointLocation", path + "-checkpoint").start())
        q.awaitTermination(300)
        streamed = sorted(tuple(r) for r in spark.sql("select * from via_alias").collect())
        batches = len(q.recentProgress)
        print(json.dumps({
            "jars": conf.get("spark.jars"), "python": conf.get("spark.pyspark.python"),
            "providers": {n: lookup(n, sql_conf).getName() for n in ("localmq", "localmq-jvm")},
            "python_source": spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("localmq-python"),
            "stream": stream.isStreaming,
            # the JVM scan describes itself by its options, the Python one as "(Python)"
            "jvm_scan": {fmt: "checkCRC=" in plan and "(Python)" not in plan for fmt, plan in plans.items()},
            "count": len(rows["localmq"]), "same": rows["localmq"] == rows["localmq-jvm"] == rows["localmq-python"],
            "streamed_same": streamed == rows["localmq-python"], "stream_batches": batches,
        }))
    finally:
        spark.stop()
""")


@pytest.mark.timeout(600)
def test_a_session_configured_by_configure_spark_reads_localmq_with_the_jvm_reader(xdg_cache, tmp_path):
    """A fresh process as a pip user runs it: configure_spark(SparkSession.builder) finds the cached jar, and
    format("localmq") is the JVM reader (Spark resolves a registered JVM source before a Python data source of the
    same name), giving the rows format("localmq-python") gives, in a batch and in a stream run to its end."""
    require("pyspark")
    xdg, jar = xdg_cache
    env = child_env(XDG_CACHE_HOME=str(xdg), SPARK_LOCAL_IP="127.0.0.1")
    for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        env.pop(k, None)
    code = SESSION.replace("path = sys.argv[1]", f"path = {str(tmp_path / 'store')!r}")
    p = run(code, env, timeout=480)
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["jars"] == str(jar) and got["python"] == sys.executable
    assert got["providers"] == {
        "localmq": "localmq.spark.LocalMQProvider",
        "localmq-jvm": "localmq.spark.LocalMQTableProvider",
    }
    assert got["jvm_scan"] == {"localmq": True, "localmq-python": False}
    assert got["python_source"] is True and got["stream"] is True
    assert got["count"] == 500 and got["same"] is True
    # the stream read through format("localmq") gave every row, in more than one micro-batch (120 rows at most each)
    assert got["streamed_same"] is True and got["stream_batches"] >= 5, got
