"""The JVM reader (spark-jvm/, format "localmq-jvm") against the Python data source (format "localmq") and Parquet,
in one SparkSession over the same 100-byte messages (issue 28).

    python perf/spark_jvm_bench.py [--messages 2000000] [--rounds 3]

Builds the jar (mvn, against the pyspark wheel's jars), writes a store of N messages of 100 B over 4 queues and a
Parquet file of the same bodies (pyarrow) in a temporary directory that is removed afterwards, then times, per
reader, ``scan_noop`` (every row of the value column through Spark's noop sink) and ``scan_agg`` (count(*) and
sum(length(value)); Parquet's vectorised reader answers it from its pages). Prints the median of the rounds
(one warm-up round first), rows/s and the ratio to Parquet.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

PERF = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(PERF)
BODY = 100
QUEUES = 4


def build_jar():
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    pom = os.path.join(REPO, "spark-jvm", "pom.xml")
    subprocess.run(["mvn", "-q", "-B", "-o", "-f", pom, f"-Dpyspark.jars={jars}", "package"], check=True)
    return os.path.join(REPO, "spark-jvm", "target", "localmq-spark.jar")


def bodies(start, stop):
    """Bodies start..stop-1 (as perf/test_spark_bench.py): a big-endian index, then a fixed pseudo-random filler."""
    filler = np.frombuffer(np.random.default_rng(BODY).bytes(BODY), np.uint8)
    out = np.empty((stop - start, BODY), np.uint8)
    out[:] = filler
    out[:, :8] = np.arange(start, stop, dtype=">u8").view(np.uint8).reshape(-1, 8)
    return out


def write_data(root, n):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import localmq

    store = os.path.join(root, "store")
    with localmq.open(store) as st:
        for i in range(0, n, 1000):
            rows = bodies(i, min(n, i + 1000))
            st.put_batch("bench", [r.tobytes() for r in rows], queue_id=(i // 1000) % QUEUES)
        st.wait_for_dispatch()
    offsets = pa.py_buffer(np.arange(0, (n + 1) * BODY, BODY, dtype=np.int32))
    values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(bodies(0, n))])
    pqpath = os.path.join(root, "bodies.parquet")
    pq.write_table(pa.table({"value": values}), pqpath)
    return store, pqpath


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    jar = build_jar()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    root = tempfile.mkdtemp(prefix="localmq-jvm-bench-")
    spark = None
    try:
        n = args.messages
        t = time.perf_counter()
        store, pqpath = write_data(root, n)
        print(f"wrote {n} messages of {BODY} B in {time.perf_counter() - t:.1f} s", flush=True)
        # the same session settings as perf/test_spark_bench.py, plus the jar
        spark = (
            SparkSession.builder.master("local[*]")
            .appName("localmq-jvm-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.python.unix.domain.socket.enabled", "true")
            .config("spark.driver.memory", "4g")
            .config("spark.jars", jar)
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        readers = {
            "parquet": lambda: spark.read.parquet(pqpath),
            "localmq-jvm": lambda: spark.read.format("localmq-jvm").load(store).select("value"),
            "localmq (python)": lambda: spark.read.format("localmq-python").schema("value binary").load(store),
        }

        def noop(make):
            make().write.format("noop").mode("overwrite").save()

        def agg(make):
            row = make().agg(F.count("*"), F.sum(F.length("value"))).first()
            assert (row[0], row[1]) == (n, n * BODY), row

        results = {}
        for scenario, fn in (("scan_noop", noop), ("scan_agg", agg)):
            for name, make in readers.items():
                fn(make)  # warm-up
                times = []
                for _ in range(args.rounds):
                    t = time.perf_counter()
                    fn(make)
                    times.append(time.perf_counter() - t)
                results[(scenario, name)] = statistics.median(times)
                print(
                    f"{scenario:10s} {name:18s} {statistics.median(times):7.3f} s  "
                    f"{n / statistics.median(times) / 1e6:6.2f} M rows/s",
                    flush=True,
                )
        print(f"\n{n} messages of {BODY} B, median of {args.rounds} rounds, local[*] on {os.cpu_count()} cores")
        print("| scenario | reader | s | M rows/s | x Parquet |\n|---|---|---|---|---|")
        for (scenario, name), s in results.items():
            print(f"| {scenario} | {name} | {s:.3f} | {n / s / 1e6:.2f} | {results[(scenario, 'parquet')] / s:.2f} |")
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
