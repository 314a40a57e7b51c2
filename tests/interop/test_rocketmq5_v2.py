"""RocketMQ 5.3.1's own DefaultMessageStore (interop/v5/, Store5Harness.java) and localmq on stores with V2 records:
a 200-character topic, which RocketMQ 5.x stores as V2 records (magic 0xDAA320AB), beside a short topic (V1)."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

import localmq
from localmq.store.readers import read_commitlog

from . import test_rocketmq_index

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "interop" / "v5" / "pom.xml"
JAR = ROOT / "interop" / "v5" / "target" / "store5-harness.jar"
SIZES: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 300,
    "max_hash_slot_num": 5000,
    "max_index_num": 20000,
    "grow_index_files": False,
}
LONG = "Topic" + "L" * 195  # 200 characters
SHORT = "TopicTest"


@pytest.fixture(scope="session")
def harness5() -> list[str]:
    """The command that runs Store5Harness, built once per session with Maven (a failure, never a skip)."""
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None or mvn is None:
        pytest.fail(
            f"tests/interop needs a JDK 17 (`java`) and Maven (`mvn`) on PATH: java={java!r}, mvn={mvn!r}",
            pytrace=False,
        )
    r = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "package"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or not JAR.exists():
        pytest.fail(
            f"`mvn -q -f {POM} package` failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False
        )
    return [java, "-Xmx256m", "-XX:+UseSerialGC", "-jar", str(JAR)]


def run5(cmd: list[str], *args: str) -> list[list[str]]:
    """Runs Store5Harness (args[1]: the store directory, args[2]: its output) and returns the output's rows."""
    jtmp = Path(args[1]).resolve().parent / "java-tmp"
    jtmp.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [cmd[0], f"-Djava.io.tmpdir={jtmp}", *cmd[1:], *args], capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, (
        f"Store5Harness {args[0]} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    )
    with open(args[2], encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f]


def hashes(directory: Path) -> dict[str, str]:
    return {f: hashlib.sha256((directory / f).read_bytes()).hexdigest() for f in sorted(os.listdir(directory))}


def verify_exits_0(store: Path) -> None:
    verify = subprocess.run(
        [sys.executable, "-m", "localmq", "verify", str(store)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def each_put_read_back(st: Any, puts: list[list[str]]) -> Any:
    """(put row, message) for each put RocketMQ reported, read with get_message; topic, offsets, size, body, keys
    and tags checked against the row."""
    for row in puts:
        _, topic, qid, qoff, phys, size, body, keys, tags = row
        (m,) = st.get_message(topic, int(qid), int(qoff), max_messages=1).messages
        assert (m.topic, m.physical_offset, m.store_size) == (topic, int(phys), int(size))
        assert bytes(m.body) == base64.b64decode(body) and m.keys == (keys,) and m.tags == tags
        yield row, m


def test_rocketmq5_v2_store_read_by_localmq_and_back(tmp_path: Path, harness5: list[str]) -> None:
    store = tmp_path / "rmq5"
    puts = run5(harness5, "write", str(store), str(tmp_path / "puts.tsv"), "600", LONG, SHORT)
    assert len(puts) == 600
    seg0 = (store / "commitlog" / f"{0:020d}").read_bytes()
    assert seg0[4:8] == bytes.fromhex("daa320ab"), "RocketMQ 5.3.1 wrote the long topic's first record as V2"
    before = hashes(store / "commitlog")
    verify_exits_0(store)
    # every message, every field RocketMQ reported at put time, through localmq's get path and readers
    with localmq.open(store, **SIZES) as st:
        for _ in each_put_read_back(st, puts):
            pass
        assert st.wait_for_index(60)
        for _, topic, _, _, phys, _, _, keys, _ in puts[::37]:
            assert [m.physical_offset for m in st.query_message(topic, keys)] == [int(phys)]
    msgs = list(read_commitlog(store / "commitlog", mapped_file_size=64 * 1024))
    assert [(m.topic, m.physical_offset) for m in msgs] == [(p[1], int(p[4])) for p in puts]
    # a plain open changed no byte of the commit log
    assert hashes(store / "commitlog") == before
    # and RocketMQ reads every message and finds every key afterwards
    back = run5(harness5, "read", str(store), str(tmp_path / "read.tsv"), LONG, SHORT)
    got = sorted((r[1], int(r[2]), int(r[3]), int(r[4]), r[6]) for r in back if r[0] == "M")
    assert got == sorted((p[1], int(p[2]), int(p[3]), int(p[4]), p[6]) for p in puts)
    queries = [r for r in back if r[0] == "Q"]
    assert len(queries) == 600 and all(r[3] == "1" for r in queries)


def test_localmq_v2_store_read_by_rocketmq5(tmp_path: Path, harness5: list[str]) -> None:
    store = tmp_path / "lmq"
    written = []
    with localmq.open(store, **SIZES) as st:
        for i in range(400):
            topic = LONG if i % 2 else SHORT
            body = f"localmq-{i}-".encode() * (1 + i % 5)
            r = st.put(topic, body, queue_id=i % 3, keys=[f"k{i}"], tags=f"t{i % 3}")
            assert r.ok
            written.append((topic, i % 3, r.queue_offset, r.physical_offset, base64.b64encode(body).decode()))
        st.wait_for_dispatch()
        assert st.wait_for_index(60)
    back = run5(harness5, "read", str(store), str(tmp_path / "read.tsv"), LONG, SHORT)
    got = sorted((r[1], int(r[2]), int(r[3]), int(r[4]), r[6]) for r in back if r[0] == "M")
    assert got == sorted(written)
    queries = [r for r in back if r[0] == "Q"]
    assert len(queries) == 400 and all(r[3] == "1" for r in queries)


# -- the IndexFile with each side's default settings, RocketMQ 5.3.1 (4.9.8: tests/interop/test_rocketmq_index.py) --

DEFAULT_SIZES = test_rocketmq_index.SIZES  # the harness's small commit log and queue files, the index left default
ROCKETMQ_INDEX_FILE = test_rocketmq_index.ROCKETMQ_INDEX_FILE
default_index = test_rocketmq_index.default_index
index_sizes = test_rocketmq_index.index_files


def test_keys_localmq_indexed_with_its_defaults_are_found_by_rocketmq5_with_its_defaults(
    tmp_path: Path, harness5: list[str]
) -> None:
    """V1 and V2 records, localmq's default index geometry: RocketMQ 5.3.1 with its defaults finds every key, keeps
    the file as it is, and localmq still finds every key afterwards."""
    store = tmp_path / "lmq"
    offsets = {}
    with localmq.open(store, **DEFAULT_SIZES) as st:
        for i in range(1200):
            topic = LONG if i % 2 else SHORT
            r = st.put(topic, b"m%d" % i, queue_id=i % 2, keys=[f"k{i}"])
            offsets[(topic, f"k{i}")] = r.physical_offset
        assert st.wait_for_index(60)
    files = index_sizes(store)
    assert list(files.values()) == [ROCKETMQ_INDEX_FILE], files
    back = run5(default_index(harness5), "read", str(store), str(tmp_path / "read.tsv"), LONG, SHORT)
    hits = {(r[1], r[2]): r[3] for r in back if r[0] == "Q"}
    missing = [k for k in offsets if hits.get(k) != "1"]
    assert not missing, f"RocketMQ 5.3.1 found {len(offsets) - len(missing)} of {len(offsets)} keys, {missing[:3]} not"
    assert index_sizes(store) == files
    with localmq.open(store, **DEFAULT_SIZES) as st:
        assert st.wait_for_index(60)
        lost = [k for k, off in offsets.items() if [m.physical_offset for m in st.query_message(*k)] != [off]]
        assert not lost, f"{len(lost)} keys lost after RocketMQ 5.3.1 opened the store, first {lost[:3]}"


def test_keys_rocketmq5_indexed_with_its_defaults_are_found_by_localmq_with_its_defaults(
    tmp_path: Path, harness5: list[str]
) -> None:
    """RocketMQ 5.3.1's default index files: localmq finds every key, appends into them, and RocketMQ then finds the
    keys localmq added as well as its own."""
    store = tmp_path / "rmq5"
    puts = run5(default_index(harness5), "write", str(store), str(tmp_path / "puts.tsv"), "800", LONG, SHORT)
    before = index_sizes(store)
    assert set(before.values()) == {ROCKETMQ_INDEX_FILE}, before
    with localmq.open(store, **DEFAULT_SIZES) as st:
        assert st.wait_for_index(60)
        assert index_sizes(store) == before
        wrong = [(p[1], p[7]) for p in puts if [m.physical_offset for m in st.query_message(p[1], p[7])] != [int(p[4])]]
        assert not wrong, f"{len(wrong)} of {len(puts)} keys not found by localmq, first {wrong[:3]}"
        added = {}
        for i in range(300):
            topic = LONG if i % 2 else SHORT
            added[(topic, f"after{i}")] = st.put(
                topic, b"after %d" % i, queue_id=i % 2, keys=[f"after{i}"]
            ).physical_offset
        assert st.wait_for_index(60)
    assert set(index_sizes(store).values()) == {ROCKETMQ_INDEX_FILE}
    back = run5(default_index(harness5), "read", str(store), str(tmp_path / "read.tsv"), LONG, SHORT)
    hits = {(r[1], r[2]): r[3] for r in back if r[0] == "Q"}
    missing = [k for k in [*added, *((p[1], p[7]) for p in puts)] if hits.get(k) != "1"]
    assert not missing, f"RocketMQ 5.3.1 missed {len(missing)} of {len(added) + len(puts)} keys, first {missing[:3]}"


def test_spark_reads_a_rocketmq5_v2_store(spark: Any, tmp_path: Path, harness5: list[str]) -> None:
    """A real Spark session reads RocketMQ 5.3.1's V1 and V2 records through the data source: one row per put,
    with the topic, queue, offsets, body and tag RocketMQ reported."""
    store = tmp_path / "rmq5"
    puts = run5(harness5, "write", str(store), str(tmp_path / "puts.tsv"), "300", LONG, SHORT)
    rows = (
        spark.read.format("localmq")
        .option("minPartitions", "2")
        .load(str(store))
        .selectExpr("topic", "partition", "offset", "physical_offset", "value", "tags")
        .collect()
    )
    got = sorted((r.topic, r.partition, r.offset, r.physical_offset, bytes(r.value), r.tags) for r in rows)
    assert got == sorted((p[1], int(p[2]), int(p[3]), int(p[4]), base64.b64decode(p[6]), p[8]) for p in puts)
    assert {r.topic for r in rows} == {LONG, SHORT}


def crc_tail(record: bytes) -> bytes:
    """Spec 1.10: the 20-byte ``__CRC32#`` tail RocketMQ 5.x appends with enabledAppendPropCRC: 0x01, then
    ``crc32(record except the tail) & 0x7FFFFFFF`` as 10 decimal digits, least-significant first, then 0x02."""
    crc = zlib.crc32(record[:-20]) & 0x7FFFFFFF
    return b"__CRC32#\x01" + str(crc).zfill(10)[::-1].encode() + b"\x02"


def test_rocketmq5_property_crc_tail_read_by_localmq(tmp_path: Path, harness5: list[str]) -> None:
    """Issue 25, spec 1.10: records RocketMQ 5.3.1 writes with enabledAppendPropCRC=true (a ``__CRC32#`` property
    tail) are read whole by localmq, V1 and V2, the tail in the raw properties; a plain open changes no byte and
    RocketMQ reads every message afterwards."""
    store = tmp_path / "rmq5crc"
    crc_cmd = [harness5[0], "-Dlocalmq.interop5.propCRC=true", *harness5[1:]]
    puts = run5(crc_cmd, "write", str(store), str(tmp_path / "puts.tsv"), "60", LONG, SHORT)
    assert len(puts) == 60
    seg0 = (store / "commitlog" / f"{0:020d}").read_bytes()
    before = hashes(store / "commitlog")
    verify_exits_0(store)
    with localmq.open(store, **SIZES) as st:
        for (_, topic, _, _, phys, size, *_), m in each_put_read_back(st, puts):
            record = seg0[int(phys) : int(phys) + int(size)]
            assert record[4:8] == bytes.fromhex("daa320ab" if len(topic) > 127 else "daa320a7")
            # the tail is the end of the record and of its properties, as the spec lays it out
            assert record.endswith(crc_tail(record)) and m.raw_properties.endswith(crc_tail(record))
            assert m.properties["__CRC32#"] == crc_tail(record)[9:19].decode()
            assert set(m.properties) == {"KEYS", "TAGS", "__CRC32#"}
    assert hashes(store / "commitlog") == before
    back = run5(harness5, "read", str(store), str(tmp_path / "read.tsv"), LONG, SHORT)
    got = sorted((r[1], int(r[2]), int(r[3]), int(r[4])) for r in back if r[0] == "M")
    assert got == sorted((p[1], int(p[2]), int(p[3]), int(p[4])) for p in puts)
