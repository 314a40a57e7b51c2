"""A RocketMQ 4.9.7 NameServer and Broker on a store localmq wrote: Java consumers read it, a Java producer appends
to it, and localmq reads the appends (interop/broker/, BrokerHarness)."""

from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

import localmq

from .test_rocketmq_store import PROPS, SIZES, TAGS, keys_of

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "interop" / "broker" / "pom.xml"
JAR = ROOT / "interop" / "broker" / "target" / "broker-harness.jar"
COUNT = 240  # localmq -> Java, per consumer
PRODUCE = 40  # Java -> localmq
# what the Java client adds to a message's properties on the way to the application, not stored
CLIENT_ADDED = {"MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME"}
# what DefaultMQProducer and the Broker store beside the application's properties (MessageConst names)
PRODUCER_ADDED = {"TAGS", "KEYS", "WAIT", "UNIQ_KEY", "CLUSTER"}
SYSFLAG_COMPRESSED = 0x1


@pytest.fixture(scope="session")
def broker_harness() -> list[str]:
    """The command that runs BrokerHarness, built once per session with Maven (a failure, never a skip)."""
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
    return [java, "-Xmx384m", "-XX:+UseSerialGC", "-jar", str(JAR)]


def broker_workload(st: Any, seed: int) -> list[dict[str, Any]]:
    """The store tests' kinds of messages (tags, keys, unusual properties, a 20 KiB body, 3 topics x 4 queues), every
    body at least 1 byte: RocketMQ's Java consumers fail on an empty body (the report in the module's test)."""
    rnd = random.Random(seed)
    topics = ["orders", "audit_log-1", "T%RETRY%x"]
    written = []
    for i in range(COUNT):
        body = rnd.randbytes(20 * 1024 if i == 7 else 1 + rnd.randrange(3000))
        topic, qid = rnd.choice(topics), rnd.randrange(4)
        tags = None if i % 5 == 0 else rnd.choice(TAGS)
        keys = None if i % 3 else ([f"k-{i}"] if i % 6 == 0 else [f"k-{i}", "shared-key"])
        props = {**PROPS, "n": str(i)} if i % 4 == 0 else None
        r = st.put(topic, body, queue_id=qid, tags=tags, keys=keys, properties=props)
        written.append(
            {
                "topic": topic,
                "queueId": qid,
                "queueOffset": r.queue_offset,
                "commitLogOffset": r.physical_offset,
                "body": body,
                "tags": tags,
                "keys": keys,
                "props": props or {},
                "storeTimestamp": r.store_timestamp,
            }
        )
    return written


def run_broker(cmd: list[str], tmp_path: Path, store: Path, out: Path) -> None:
    """Runs BrokerHarness to completion; the JVM is killed if it outlives the timeout or the test fails."""
    home, log, jtmp = tmp_path / "home", tmp_path / "broker.log", tmp_path / "jtmp"
    home.mkdir()
    jtmp.mkdir()
    with open(log, "wb") as f:
        # user.home and java.io.tmpdir: what RocketMQ writes under ~ and its remoting's self-signed TLS certificate
        # (keyutil_*.crt / .key, written to the temp directory by every broker start) stay in tmp_path
        proc = subprocess.Popen(
            [
                cmd[0],
                f"-Duser.home={home}",
                f"-Djava.io.tmpdir={jtmp}",
                *cmd[1:],
                str(store),
                str(tmp_path / "work"),
                str(out),
                str(COUNT),
                str(PRODUCE),
                "29",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait(timeout=150)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    text = log.read_text(encoding="utf-8", errors="replace")
    assert rc == 0, f"BrokerHarness failed ({rc}):\n{text[-6000:]}"


def per_queue_counts(written: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for w in written:
        counts[(w["topic"], w["queueId"])] = counts.get((w["topic"], w["queueId"]), 0) + 1
    return counts


def stored_body(m: Any, sent: bytes) -> bytes:
    """A body as the application sent it: RocketMQ's producer zlib-compresses bodies over 4 KiB and sets sysFlag
    bit 0, and its consumer inflates them; localmq today hands the stored (deflated) bytes back as they are."""
    raw = bytes(m.body)
    return zlib.decompress(raw) if m.sys_flag & SYSFLAG_COMPRESSED and raw != sent else raw


def check_received(name: str, received: dict[str, Any], written: list[dict[str, Any]], ours: dict[Any, Any]) -> None:
    """Every message localmq wrote was received once, each field as localmq wrote and reads it."""
    got = {(m["topic"], m["queueId"], m["queueOffset"]): m for m in received["messages"]}
    assert len(received["messages"]) == len(got) == COUNT, (name, len(received["messages"]), len(got))
    assert sorted(got) == sorted(ours), name
    for w in written:
        key = (w["topic"], w["queueId"], w["queueOffset"])
        m, mine = got[key], ours[key]
        assert base64.b64decode(m["body"]) == w["body"], (name, key)
        assert m["commitLogOffset"] == w["commitLogOffset"], (name, key)
        assert m["storeTimestamp"] == w["storeTimestamp"], (name, key)
        assert m["tags"] == w["tags"], (name, key)
        assert keys_of(m["keys"]) == keys_of(w["keys"]), (name, key)
        assert m["userProperties"] == w["props"], (name, key)
        stored = {k: v for k, v in m["properties"].items() if k not in CLIENT_ADDED}
        assert stored == dict(mine.properties), (name, key)
        assert (m["bornHost"], m["storeHost"]) == (mine.born_host, mine.store_host), (name, key)
        assert (m["bornTimestamp"], m["flag"], m["sysFlag"], m["reconsumeTimes"], m["storeSize"], m["bodyCRC"]) == (
            mine.born_timestamp,
            mine.flag,
            mine.sys_flag,
            mine.reconsume_times,
            mine.store_size,
            mine.body_crc,
        ), (name, key)
        assert m["msgId"] == mine.msg_id, (name, key)


def test_broker_on_a_localmq_store(broker_harness: list[str], tmp_path: Path) -> None:
    """localmq writes 240 messages; RocketMQ's lite pull and push consumers each receive all 240 through a Broker
    whose store root is localmq's directory, and the Broker finds every key localmq wrote in localmq's IndexFiles; a
    Java producer sends 40 more; after the Broker's clean shutdown localmq reads all 280, every field as the consumers
    and the producer report them, and the push consumer's offsets from the Broker's consumerOffset.json."""
    store, out = tmp_path / "store", tmp_path / "out.json"
    st = localmq.open(store, **SIZES)
    try:
        written = broker_workload(st, 23)
    finally:
        st.close()
    st = localmq.open(store)
    try:
        ours = {}
        for w in written:
            got = st.get_message(w["topic"], w["queueId"], w["queueOffset"], 1).messages
            assert len(got) == 1, w
            ours[(w["topic"], w["queueId"], w["queueOffset"])] = got[0]
    finally:
        st.close()

    run_broker(broker_harness, tmp_path, store, out)
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["topics"] == {"T%RETRY%x": 4, "audit_log-1": 4, "orders": 4}
    assert report["pulled"]["queues"] == 12
    check_received("lite pull", report["pulled"], written, ours)
    check_received("push", report["pushed"], written, ours)
    # every key localmq wrote, looked up through the Broker in the IndexFiles localmq wrote
    queried = report["queried"]
    keyed = [(w, key) for w in written for key in keys_of(w["keys"])]
    assert sorted(queried) == sorted({f"{w['topic']}/{key}" for w, key in keyed})
    for w, key in keyed:
        assert w["commitLogOffset"] in queried[f"{w['topic']}/{key}"], (w["topic"], key)
    produced = report["produced"]
    assert len(produced) == PRODUCE
    assert all(s["sendStatus"] == "SEND_OK" for s in produced)
    assert not (store / "abort").exists()  # the Broker shut down cleanly
    assert (store / "config" / "topics.json").exists()
    # the push consumer's offsets, committed to the Broker and written to its consumerOffset.json at shutdown
    table = localmq.read_config_json(store / "config" / "consumerOffset.json")["offsetTable"]
    for (topic, qid), n in sorted(per_queue_counts(written).items()):
        assert int(table[f"{topic}@localmq_interop_push"][qid]) == n, (topic, qid)

    st = localmq.open(store)  # sizes read off the files, as the Broker left them
    try:
        for w in written:  # localmq's own messages, unchanged
            got = st.get_message(w["topic"], w["queueId"], w["queueOffset"], 1).messages
            assert len(got) == 1 and bytes(got[0].body) == w["body"], w
            assert got[0].physical_offset == w["commitLogOffset"], w
        per_queue = per_queue_counts(written)
        appended: dict[tuple[str, int], int] = {}
        for s in produced:
            where = (s["topic"], s["queueId"], s["queueOffset"])
            # the Broker appends after localmq's messages in each queue
            qkey = (s["topic"], s["queueId"])
            assert s["queueOffset"] == per_queue.get(qkey, 0) + appended.get(qkey, 0), where
            appended[qkey] = appended.get(qkey, 0) + 1
            got = st.get_message(s["topic"], s["queueId"], s["queueOffset"], 1).messages
            assert len(got) == 1, where
            m = got[0]
            assert (m.topic, m.queue_id, m.queue_offset) == where
            sent = base64.b64decode(s["body"])
            assert stored_body(m, sent) == sent, where
            assert m.tags == s["tags"], where
            assert keys_of(m.keys) == keys_of(s["keys"]), where
            props = dict(m.properties)
            assert {k: v for k, v in props.items() if k not in PRODUCER_ADDED} == s["userProperties"], where
            assert props["UNIQ_KEY"] == m.uniq_key == s["msgId"], where
            assert props["CLUSTER"] == "localmq", where
            assert m.msg_id == s["offsetMsgId"], where
            assert localmq.decode_message_id(s["offsetMsgId"])[1] == m.physical_offset, where
        assert any(
            m.sys_flag & SYSFLAG_COMPRESSED
            for m in (st.get_message(s["topic"], s["queueId"], s["queueOffset"], 1).messages[0] for s in produced)
        )
        for s in produced:  # the Broker's IndexFile entries, looked up by localmq
            for key in keys_of(s["keys"]):
                found = {g.physical_offset for g in st.query_message(s["topic"], key)}
                assert localmq.decode_message_id(s["offsetMsgId"])[1] in found, (s["topic"], key)
    finally:
        st.close()
    shutil.rmtree(store)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
