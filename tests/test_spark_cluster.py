"""The data source on a real Spark standalone cluster: a master, a worker and its executor JVM as processes.

Executors only get partition descriptions and open the store's files by path (the shared-filesystem setup);
their Python workers find ``pyspark_localmq`` on their own. The driver runs in a subprocess, so this run's
in-process local session is not disturbed.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import localmq
from helpers import require, require_java

require("pyspark")
require("pyarrow")

DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession, functions as F
import localmq.spark
master, store, fixture, out, ck, reader = sys.argv[1:7]
builder = (SparkSession.builder.master(master).appName("localmq-cluster-test").config("spark.executor.memory", "1g")
           .config("spark.ui.enabled", "false"))
if reader == "jvm":
    builder = localmq.spark.configure_spark(builder)  # the jar on spark.jars: executors fetch it from the driver
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
df = spark.read.format("localmq").option("mapped_file_size_commit_log", 65536).load(store)
plan = df._jdf.queryExecution().executedPlan().toString()
res = {"jvm_scan": "checkCRC=" in plan and "(Python)" not in plan, "parts": df.rdd.getNumPartitions(),
       "count": df.count(),
       "queues": sorted([r[0], r[1], r[2], r[3]] for r in df.groupBy("topic", "partition").agg(
           F.min("offset"), F.count("*")).collect()),
       "sum": df.select(F.sum(F.col("value").cast("string").substr(6, 6).cast("long"))).first()[0],
       "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size(),  # block managers
       "mapinarrow": localmq.spark.read_commitlog(spark, store, mapped_file_size_commit_log=65536).count(),
       "fixture": spark.read.format("localmq").option("mapped_file_size_commit_log", 8192).load(fixture).count()}
q = (spark.readStream.format("localmq").option("mapped_file_size_commit_log", 65536)
     .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 1000).load(store)
     .writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start())
q.awaitTermination(300)
res["streamed"] = [p["numInputRows"] for p in q.recentProgress]
spark.stop()
print("RESULT " + json.dumps(res))
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_class(spark_home, env, log, *args):
    return subprocess.Popen(
        [os.path.join(spark_home, "bin", "spark-class"), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """spark://127.0.0.1:<port> of a standalone master with one 2-core worker; both stopped at teardown."""
    require_java()
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    d = tmp_path_factory.mktemp("cluster")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_WORKER_DIR=str(d / "work")
    )
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    log = open(d / "cluster.log", "w")
    procs = [
        _spark_class(
            home,
            env,
            log,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(_free_port()),
        )
    ]
    try:
        deadline = time.time() + 120
        while "I have been elected leader" not in (d / "cluster.log").read_text():
            assert time.time() < deadline and procs[0].poll() is None, (d / "cluster.log").read_text()[-3000:]
            time.sleep(0.2)
        procs.append(
            _spark_class(
                home,
                env,
                log,
                "org.apache.spark.deploy.worker.Worker",
                master,
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(d / "work"),
            )
        )
        while "Successfully registered with master" not in (d / "cluster.log").read_text():
            assert time.time() < deadline and procs[1].poll() is None, (d / "cluster.log").read_text()[-3000:]
            time.sleep(0.2)
        yield master, env
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        log.close()


@pytest.mark.parametrize("reader", ["python", "jvm"])
def test_batch_and_streaming_on_a_standalone_cluster(cluster, fixtures_dir, tmp_path, reader):
    """format("localmq") on the cluster: the Python data source, or (``jvm``, a session made by configure_spark)
    the JVM reader, whose jar the executors fetch from the driver. Both give every message, batch and stream."""
    master, env = cluster
    store = tmp_path / "store"
    sent = {}
    with localmq.open(store, mapped_file_size_commit_log=65536) as st:
        for i in range(6000):
            topic, qid = ("orders", "audit")[i % 2], (i // 2) % 3
            st.put(topic, b"body-%06d" % i, queue_id=qid)
            sent[(topic, qid)] = sent.get((topic, qid), 0) + 1
        st.wait_for_dispatch()
    fixture = shutil.copytree(
        fixtures_dir / "EricPanGopher-rocketmq-9835cd5f" / "store" / "unit_test_store", tmp_path / "fixture"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            master,
            str(store),
            str(fixture),
            str(tmp_path / "out"),
            str(tmp_path / "ck"),
            reader,
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-5000:]
    res = json.loads(lines[0][len("RESULT ") :])
    assert res["jvm_scan"] is (reader == "jvm")
    assert res["count"] == 6000 and res["mapinarrow"] == 6000
    assert res["sum"] == sum(range(6000))
    assert res["queues"] == sorted([t, q, 0, n] for (t, q), n in sent.items())
    assert res["parts"] >= 2
    assert res["executors"] >= 2  # the driver and at least one executor JVM
    assert res["fixture"] == 179  # every record of the RocketMQ store, dispatched or not
    assert sum(res["streamed"]) == 6000 and max(res["streamed"]) <= 1000
