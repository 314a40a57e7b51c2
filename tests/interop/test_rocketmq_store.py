"""Stores written by RocketMQ 4.9.8's DefaultMessageStore read by localmq, and the other way round (interop/)."""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import localmq

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "interop" / "pom.xml"
JAR = ROOT / "interop" / "target" / "store-harness.jar"
# the harness's sizes (StoreHarness.java): localmq writes its store with the same ones
SIZES: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 300,
    "max_hash_slot_num": 5000,
    "max_index_num": 20000,
    "grow_index_files": False,
}
PROPS = {"color": "red", "ünï_ñame": "välue ✓ =:;,\"'{}[] \t end 😀"}
TAGS = ["created", "paid", "tag with space", "ünïcode-✓"]


@pytest.fixture(scope="session")
def harness() -> list[str]:
    """The command that runs StoreHarness, built once per session with Maven (a failure, never a skip)."""
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


def run_harness(cmd: list[str], *args: str) -> None:
    """Runs StoreHarness; args[1] is the store directory: java.io.tmpdir goes next to it (inside the test's tmp_path,
    removed with it), not into /tmp."""
    jtmp = Path(args[1]).resolve().parent / "java-tmp"
    jtmp.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [cmd[0], f"-Djava.io.tmpdir={jtmp}", *cmd[1:], *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"StoreHarness {args[0]} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def user_properties(props: dict[str, str]) -> dict[str, str]:
    """The properties both sides are compared on: everything but the ones a store adds itself (none expected)."""
    return dict(props)


def keys_of(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split(" ")) if value else ()
    return tuple(value)


def localmq_workload(st: Any, seed: int) -> list[dict[str, Any]]:
    """Puts the same kinds of messages as the harness (empty and 20 KiB bodies, tags, keys, unusual properties)."""
    rnd = random.Random(seed)
    topics = ["orders", "audit_log-1", "T%RETRY%x"]
    written = []
    for i in range(240):
        size = 0 if i == 5 else 20 * 1024 if i == 7 else rnd.randrange(3000)
        body = rnd.randbytes(size)
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


def test_localmq_writes_rocketmq_reads(harness: list[str], tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "read.json"
    st = localmq.open(store, **SIZES)
    try:
        written = localmq_workload(st, 17)
    finally:
        st.close()
    st = localmq.open(store)  # what localmq itself reads back, for the fields a put does not return
    try:
        ours = {}
        for w in written:
            got = st.get_message(w["topic"], w["queueId"], w["queueOffset"], 1).messages
            assert len(got) == 1, w
            ours[(w["topic"], w["queueId"], w["queueOffset"])] = got[0]
    finally:
        st.close()
    assert len(list((store / "commitlog").iterdir())) >= 5
    queries = [a for w in written[:30] for a in (w["topic"], *(w["keys"] or ())[:1]) if w["keys"]]
    run_harness(harness, "read", str(store), str(out), *queries)
    read = json.loads(out.read_text(encoding="utf-8"))

    seen = {}
    for name, q in read["queues"].items():
        topic, qid = name.rsplit("/", 1)
        assert q["minOffset"] == 0, name
        assert len(q["messages"]) == q["maxOffset"], (name, q["messages"][-1:])
        for m in q["messages"]:
            assert m["getStatus"] == "FOUND", (name, m)
            seen[(topic, int(qid), m["queueOffset"])] = m
    assert sorted(seen) == sorted(ours)
    for w in written:
        key = (w["topic"], w["queueId"], w["queueOffset"])
        m, got = seen[key], ours[key]
        assert m["commitLogOffset"] == w["commitLogOffset"], key
        assert base64.b64decode(m["body"]) == w["body"], key
        assert m["tags"] == w["tags"], key
        assert keys_of(m["keys"]) == keys_of(w["keys"]), key
        assert m["storeTimestamp"] == w["storeTimestamp"], key
        assert (m["bornHost"], m["storeHost"]) == (got.born_host, got.store_host), key
        assert m["properties"] == dict(got.properties), key
        for name, value in w["props"].items():
            assert m["properties"][name] == value, (key, name)
    for w in written[:30]:
        if w["keys"]:
            found = read["queried"][f"{w['topic']}/{w['keys'][0]}"]
            assert w["commitLogOffset"] in found, (w["topic"], w["keys"][0], found)
    shutil.rmtree(store)


KILLED_WRITER = """
import base64, json, sys, time
sys.path.insert(0, sys.argv[3])
import localmq
from test_rocketmq_store import SIZES, localmq_workload
st = localmq.open(sys.argv[1], **SIZES)
written = localmq_workload(st, 18)
for w in written:
    w["body"] = base64.b64encode(w["body"]).decode()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(written, f)
print("written", flush=True)
sys.stdin.read()  # killed here, the store still open
"""


def test_localmq_killed_rocketmq_recovers(harness: list[str], tmp_path: Path) -> None:
    """A localmq writer SIGKILLed right after its last put (store open, abort file left): RocketMQ's abnormal
    recovery finds every message, with the fields it was put with."""
    store, log, out = tmp_path / "store", tmp_path / "written.json", tmp_path / "read.json"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(store), str(log), str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert (store / "abort").exists()
    written = json.loads(log.read_text(encoding="utf-8"))
    run_harness(harness, "read", str(store), str(out))
    read = json.loads(out.read_text(encoding="utf-8"))
    seen = {}
    for name, q in read["queues"].items():
        topic, qid = name.rsplit("/", 1)
        for m in q["messages"]:
            assert m["getStatus"] == "FOUND", (name, m)
            seen[(topic, int(qid), m["queueOffset"])] = m
    assert sorted(seen) == sorted((w["topic"], w["queueId"], w["queueOffset"]) for w in written)
    for w in written:
        key = (w["topic"], w["queueId"], w["queueOffset"])
        m = seen[key]
        assert m["commitLogOffset"] == w["commitLogOffset"], key
        assert m["body"] == w["body"], key
        assert (m["tags"], keys_of(m["keys"])) == (w["tags"], keys_of(w["keys"])), key
        assert m["storeTimestamp"] == w["storeTimestamp"], key
        for name, value in w["props"].items():
            assert m["properties"][name] == value, (key, name)
    shutil.rmtree(store)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_empty_tag_and_property_values_read_by_rocketmq(harness: list[str], tmp_path: Path) -> None:
    """Issue 25 item 5: localmq stores an empty tag and empty property values as ``name\\x01`` (spec 1.7); RocketMQ's
    reader drops those pairs (no tag, the key absent), as localmq's does, and its ConsumeQueue has tagsCode 0 for
    them, whether it reads localmq's units or dispatches the records itself (consumequeue/ removed)."""
    store = tmp_path / "store"
    puts = [
        ("put", dict(tags="", properties={"a": "", "b": "x"})),
        ("tagged", dict(tags="TAG1", properties={"a": ""})),
        ("only-empty", dict(properties={"TAGS": "", "c": ""})),
        ("plain", dict(tags="z")),
    ]
    with localmq.open(store, **SIZES) as st:
        written = [st.put("empty", name.encode(), queue_id=1, **kw) for name, kw in puts]
        written.append(st.put_batch("empty", [b"b1", b"b2"], queue_id=1, tags="", keys=["bk"], properties={"a": ""}))
        assert st.wait_for_dispatch(10)
        ours = st.get_message("empty", 1, 0, 16).messages
    assert [m.body for m in ours] == [b"put", b"tagged", b"only-empty", b"plain", b"b1", b"b2"]
    assert [(m.tags, m.properties) for m in ours] == [
        (None, {"b": "x"}),
        ("TAG1", {"TAGS": "TAG1"}),
        (None, {}),
        ("z", {"TAGS": "z"}),
        (None, {"KEYS": "bk"}),
        (None, {"KEYS": "bk"}),
    ]
    assert all(
        b"a\x01" in m.raw_properties.split(b"\x02") for m in ours if m.body != b"plain" and m.body != b"only-empty"
    )
    tags_codes = [0, 2567159, 0, localmq.java_hash("z"), 0, 0]  # spec 2.2: "TAG1" -> 2567159; no tag -> 0
    redispatched = tmp_path / "redispatched"
    shutil.copytree(store, redispatched)
    shutil.rmtree(redispatched / "consumequeue")
    shutil.rmtree(redispatched / "index", ignore_errors=True)
    for root in (store, redispatched):
        out = root.parent / f"{root.name}.json"
        run_harness(harness, "read", str(root), str(out))
        q = json.loads(out.read_text(encoding="utf-8"))["queues"]["empty/1"]
        assert [m["getStatus"] for m in q["messages"]] == ["FOUND"] * 6, root.name
        assert [base64.b64decode(m["body"]) for m in q["messages"]] == [m.body for m in ours], root.name
        assert [(m["tags"], m["properties"]) for m in q["messages"]] == [(m.tags, m.properties) for m in ours]
        assert [u[2] for u in q["units"]] == tags_codes, root.name
        assert [(u[0], u[1]) for u in q["units"]] == [(m.physical_offset, m.store_size) for m in ours], root.name
