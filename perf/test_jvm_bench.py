"""JVM peers of localmq's put_one and read_all: RocketMQ 4.9.8's DefaultMessageStore and Chronicle Queue, timed inside
one JVM by interop/bench (JvmBench.java), reported as rows of the same run's "localmq vs peers" table.

The JVM figures are a different language's ceiling on the same machine, not a test: no assert compares speeds.
Needs a JDK 17 and Maven (the first build downloads RocketMQ and Chronicle Queue); without them the tests fail.
"""

import json
import os
import shutil
import subprocess

import pytest

import report
from conftest import QUICK, ROWS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POM = os.path.join(ROOT, "interop", "bench", "pom.xml")
JAR = os.path.join(ROOT, "interop", "bench", "target", "jvm-bench.jar")
# messages per round (LOCALMQ_JVM_BENCH_COUNT overrides); rounds after one untimed warm-up round per scenario
COUNT = 3000 if QUICK else int(os.environ.get("LOCALMQ_JVM_BENCH_COUNT", "1000000"))
ROUNDS = 2 if QUICK else 5
BODY_SIZE = 100
# RocketMQ 4.x unmaps through java.nio internals; the rest is the set Chronicle documents for Java 11+
JVM_FLAGS = [
    "-Xmx512m",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "-Dchronicle.analytics.disable=true",
]
# test scenario -> JvmBench scenarios; the table's scenario names are test_queue_bench.py's
SCENARIOS = {"put_one": ("put", ["put"]), "read_all": ("read", ["read", "read_buffers"])}
NOTES = {
    "put": "N x putMessage, then wait for ConsumeQueue dispatch (RocketMQ); N x writingDocument (Chronicle)",
    "read": "getMessage 32 at a time + MessageDecoder.decode (RocketMQ); tailer readingDocument, body copied "
    "(Chronicle)",
    "read_buffers": "getMessage 32 at a time, records not decoded",
}


@pytest.fixture(scope="session")
def jvm_doc(tmp_path_factory):
    """Builds interop/bench with Maven and runs JvmBench once per session; its JSON document.

    Requested before ``benchmark``, so that a missing JDK or Maven fails the test before pytest-benchmark starts."""
    tmp_dir = tmp_path_factory.mktemp("jvm-bench")
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None or mvn is None:
        pytest.fail(
            f"perf/test_jvm_bench.py needs a JDK 17 (`java`) and Maven (`mvn`) on PATH: java={java!r}, mvn={mvn!r}",
            pytrace=False,
        )
    r = subprocess.run([mvn, "-q", "-B", "-f", POM, "package"], capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not os.path.exists(JAR):
        pytest.fail(
            f"`mvn -q -f {POM} package` failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False
        )
    out = os.path.join(tmp_dir, "jvm-bench.json")
    cmd = [
        java,
        *JVM_FLAGS,
        "-jar",
        JAR,
        "--dir",
        str(tmp_dir),
        "--count",
        str(COUNT),
        "--body",
        str(BODY_SIZE),
        "--rounds",
        str(ROUNDS),
        "--out",
        out,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        pytest.fail(f"JvmBench failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("body_size", [BODY_SIZE], ids=["100B"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_jvm_peers(scenario, body_size, jvm_doc, benchmark, request):
    """RocketMQ's DefaultMessageStore and Chronicle Queue for one scenario, from the session's one JvmBench run.

    pytest-benchmark's own entry for this test times nothing of interest (a no-op); the figures are the JVM's median
    round times, in ``extra_info["peer_rows"]`` and in the "localmq vs peers" table."""
    doc = jvm_doc
    table_scenario, jvm_scenarios = SCENARIOS[scenario]
    rows = []
    for res in doc["results"]:
        if res["scenario"] not in jvm_scenarios:
            continue
        name = f"{res['implementation']} (JVM)"
        if res["scenario"] == "read_buffers":
            name = f"{res['implementation']} (JVM, records not decoded)"
        info = {
            "scenario": table_scenario,
            "body_size": body_size,
            "implementation": name,
            "messages": res["messages"],
            "body_bytes": res["messages"] * body_size,
            "how": NOTES[res["scenario"]],
        }
        rows.append(report.row_from_extra_info(info, res["seconds_median"]))
    assert rows, f"JvmBench reported no {jvm_scenarios} rows: {doc}"
    benchmark.extra_info.update(peer_rows=rows, jvm=doc["java"], rounds=doc["rounds"])
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    request.config.stash[ROWS].extend(rows)
