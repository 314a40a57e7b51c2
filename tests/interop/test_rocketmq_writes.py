"""RocketMQ 4.9.8's DefaultMessageStore writes a varied workload (StoreHarness ``write``); localmq reads every record
through get_message, the readers, the CLI and Spark, answers the index queries as RocketMQ's queryMessage does, and
takes over RocketMQ's delayed deliveries (config/delayOffset.json), retries and dead letters.

The workload: 240 plain messages (IPv6 born hosts on every 7th, IPv6 store hosts on every 11th), 8 batches
(``putMessages`` of a MessageExtBatch built as the broker builds one, two with IPv6 hosts), 4 transactional half
records with 2 commits and 3 op records, 9 delayed messages and 5 retry send-backs (levels "1s 5s": level 1 delivered
by RocketMQ's ScheduleMessageService before it stops, level 2 not), 2 dead-letter send-backs, and the broker's
consumerOffset.json of group ``billing`` on ``orders``.
"""

from __future__ import annotations

import base64
import collections
import functools
import ipaddress
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import localmq
import localmq.cli as localmq_cli
from helpers import queue_messages
from localmq.status import GetStatus

from .test_rocketmq_store import harness, keys_of, run_harness  # noqa: F401 - harness is a fixture

SEG = 64 * 1024
SCHED = "SCHEDULE_TOPIC_XXXX"
LEVELS = "1s 5s"
BLANK_MAGIC = -875286124  # 0xCBD43194, RocketMQ's END_OF_FILE record
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def written(harness: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:  # noqa: F811
    """The store RocketMQ wrote (closed; tests that open it for writing take a copy) and its manifest."""
    root = tmp_path_factory.mktemp("rmq-writes")
    store, manifest = root / "store", root / "manifest.json"
    run_harness(harness, "write", str(store), str(manifest), "16")
    yield store, json.loads(manifest.read_text(encoding="utf-8"))
    shutil.rmtree(root)


def records(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every record of every queue as RocketMQ's getMessage read it (each commit-log record is in one queue)."""
    out = []
    for name, q in manifest["queues"].items():
        assert (q["minOffset"], len(q["messages"])) == (0, q["maxOffset"]), name
        for m in q["messages"]:
            assert m["getStatus"] == "FOUND", (name, m)
            out.append(m)
    return out


def kinds(manifest: dict[str, Any]) -> dict[int, str]:
    """commit-log offset -> the kind of put that wrote it; records RocketMQ's schedule service re-put are
    ``delivered``."""
    by_queue = {(m["topic"], m["queueId"], m["queueOffset"]): m for m in records(manifest)}
    out = {}
    for p in manifest["puts"]:
        assert p["status"] == "PUT_OK", p
        topic, qid = p["topic"], p["queueId"]
        if p["kind"] in ("delayed", "retry"):
            level = min(int(by_queue_delay(by_queue, p)), 2)
            topic, qid = SCHED, level - 1
        for j in range(p["msgNum"]):
            m = by_queue[(topic, qid, p["queueOffset"] + j)]
            assert j or m["commitLogOffset"] == p["commitLogOffset"], p
            out[m["commitLogOffset"]] = p["kind"]
    for m in records(manifest):
        out.setdefault(m["commitLogOffset"], "delivered")
    return out


def pending(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The schedule records RocketMQ's delayOffset.json says are not delivered yet."""
    table = manifest["delayOffset"]["offsetTable"]
    return [
        m
        for q in (0, 1)
        for m in manifest["queues"][f"{SCHED}/{q}"]["messages"]
        if m["queueOffset"] >= table.get(str(q + 1), 0)
    ]


def by_queue_delay(by_queue: dict[Any, Any], put: dict[str, Any]) -> str:
    """The DELAY level of a delayed put, read off the schedule record at its commit-log offset."""
    for m in by_queue.values():
        if m["commitLogOffset"] == put["commitLogOffset"]:
            return str(m["properties"]["DELAY"])
    raise AssertionError(f"no record at {put['commitLogOffset']}")


def host(text: str) -> tuple[Any, int]:
    """("ip" or "[ipv6]", port) text -> (address, port), whatever text form the address has."""
    addr, port = text.rsplit(":", 1)
    return ipaddress.ip_address(addr.strip("[]")), int(port)


def canonical_host(text: str) -> str:
    addr, port = host(text)
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


def check(got: Any, m: dict[str, Any]) -> None:
    """Every field of a localmq message/record against RocketMQ's reading of it."""
    where = (m["topic"], m["queueId"], m["queueOffset"], m["commitLogOffset"])
    assert (got.topic, got.queue_id, got.queue_offset, got.physical_offset, got.store_size) == (
        m["topic"],
        m["queueId"],
        m["queueOffset"],
        m["commitLogOffset"],
        m["storeSize"],
    ), where
    assert (got.flag, got.sys_flag, got.reconsume_times, got.prepared_transaction_offset) == (
        m["flag"],
        m["sysFlag"],
        m["reconsumeTimes"],
        m["preparedTransactionOffset"],
    ), where
    assert (got.born_timestamp, got.store_timestamp) == (m["bornTimestamp"], m["storeTimestamp"]), where
    # localmq writes IPv6 hosts as "[RFC 5952 text]:port", Java as "[uncompressed]:port": the same address
    assert (got.born_host, got.store_host) == (canonical_host(m["bornHost"]), canonical_host(m["storeHost"])), where
    assert bytes(got.body) == base64.b64decode(m["body"]), where
    assert got.body_crc == m["bodyCRC"], where
    assert got.msg_id == m["msgId"], where
    assert got.tags == m["tags"], where
    assert keys_of(got.keys) == keys_of(m["keys"]), where
    assert dict(got.properties) == m["properties"], where


def test_manifest_has_every_kind(written: tuple[Path, dict[str, Any]]) -> None:
    """What the workload must contain for the other tests to prove anything, as RocketMQ reports it."""
    store, manifest = written
    recs, kind = records(manifest), kinds(manifest)
    counts = collections.Counter(kind.values())
    left = pending(manifest)
    assert counts == {
        "plain": 240,
        "batch": sum(p["msgNum"] for p in manifest["puts"] if p["kind"] == "batch"),
        "delayed": 9,
        "retry": 5,
        "dlq": 2,
        "delivered": 14 - len(left),
        "half": 4,
        "commit": 2,
        "op": 3,
    }, counts
    assert counts["batch"] > 8  # batches of several messages
    assert len(recs) == len(kind) == 305 + 8
    # a committed transaction: sysflag COMMIT, prepared transaction offset = its half record's commit-log offset
    halves = {m["commitLogOffset"]: m for m in manifest["queues"]["RMQ_SYS_TRANS_HALF_TOPIC/0"]["messages"]}
    commits = [m for m in recs if kind[m["commitLogOffset"]] == "commit"]
    assert len(commits) == 2
    for m in commits:
        assert m["sysFlag"] & 0xC == 0x8 and m["preparedTransactionOffset"] in halves, m["commitLogOffset"]
        assert m["properties"] == halves[m["preparedTransactionOffset"]]["properties"]
    v6 = [m for m in recs if m["sysFlag"] & 0x30]
    assert {kind[m["commitLogOffset"]] for m in v6} >= {"plain", "batch", "delayed", "delivered", "half", "commit"}
    assert any(m["sysFlag"] & 0x30 == 0x10 for m in v6) and any(m["sysFlag"] & 0x30 == 0x20 for m in v6)
    assert any(m["sysFlag"] & 0x30 == 0x30 for m in v6)
    # level 1 (5 delayed + 3 retries) delivered by RocketMQ and recorded; level 2 (4 + 2, 5 s) left to localmq (all of
    # them unless the harness took over 5 s from those puts to its schedule service's shutdown)
    assert manifest["delayOffset"]["offsetTable"]["1"] == 8
    assert manifest["queues"][f"{SCHED}/0"]["maxOffset"] == 8 and manifest["queues"][f"{SCHED}/1"]["maxOffset"] == 6
    assert left and all(m["queueId"] == 1 for m in left), manifest["delayOffset"]
    # the store clamped DELAY=9 to the largest level
    assert sorted(m["properties"]["DELAY"] for m in manifest["queues"][f"{SCHED}/1"]["messages"]) == ["2"] * 6
    # END_OF_FILE: a record at a segment start whose predecessor ended short of the boundary, a blank record between
    ordered = sorted(recs, key=lambda m: m["commitLogOffset"])
    rolls = [
        (a, b)
        for a, b in zip(ordered, ordered[1:])
        if b["commitLogOffset"] % SEG == 0 and a["commitLogOffset"] + a["storeSize"] < b["commitLogOffset"]
    ]
    assert len(rolls) >= 3, len(rolls)
    for a, b in rolls:
        end = a["commitLogOffset"] + a["storeSize"]
        seg = store / "commitlog" / f"{end // SEG * SEG:020d}"
        with open(seg, "rb") as f:
            f.seek(end % SEG)
            size, magic = struct.unpack(">ii", f.read(8))
        assert (size, magic) == (b["commitLogOffset"] - end, BLANK_MAGIC), (end, size, magic)


def test_rocketmq_writes_localmq_reads(written: tuple[Path, dict[str, Any]]) -> None:
    """read_commitlog, read_consume_queue, get_message and query_message against RocketMQ's reading."""
    store, manifest = written
    recs = records(manifest)
    by_offset = {m["commitLogOffset"]: m for m in recs}
    assert len(by_offset) == len(recs)

    seen = []
    with localmq.read_commitlog(store / "commitlog") as reader:
        for rec in reader:
            check(rec, by_offset[rec.physical_offset])
            seen.append(rec.physical_offset)
    assert seen == sorted(by_offset)

    for name, q in manifest["queues"].items():
        topic, qid = name.rsplit("/", 1)
        units = localmq.read_consume_queue(store / "consumequeue" / topic / qid)
        # offset, size and tags code (the deliver time for SCHEDULE_TOPIC_XXXX) as RocketMQ's ConsumeQueue has them
        assert [[int(u[0]), int(u[1]), int(u[2])] for u in units] == q["units"], name

    ids = {}  # RocketMQ's offset msg ids from its put results (a batch's are comma-separated)
    for p in manifest["puts"]:
        offs = sorted(o for o in by_offset if o >= p["commitLogOffset"])[: p["msgNum"]]
        ids.update(zip(offs, p["msgId"].split(",")))
    st = localmq.open(store, read_only=True)
    try:
        compared = 0
        for name, q in manifest["queues"].items():
            topic, qid = name.rsplit("/", 1)
            assert (st.min_offset(topic, int(qid)), st.max_offset(topic, int(qid))) == (0, q["maxOffset"]), name
            off = 0
            while off < q["maxOffset"]:
                r = st.get_message(topic, int(qid), off, 7)
                assert r.status is GetStatus.FOUND and r.messages, (name, off, r.status)
                for got in r.messages:
                    check(got, q["messages"][got.queue_offset])
                    if got.physical_offset in ids:
                        assert got.msg_id == ids[got.physical_offset], (name, got.queue_offset)
                    compared += 1
                off = r.next_begin_offset
        assert compared == len(recs)
        assert len(manifest["queried"]) > 100
        for name, offsets in manifest["queried"].items():
            topic, key = name.split("/", 1)
            got = sorted(m.physical_offset for m in st.query_message(topic, key, max_num=64))
            assert got == sorted(offsets), (topic, key, got, offsets)
    finally:
        st.close()


def cli(*args: str, capsys: Any = None) -> list[dict[str, Any]]:
    """`localmq ARGS --json`: in a subprocess (`python -m localmq`), or in this process with capsys (faster)."""
    if capsys is not None:
        capsys.readouterr()
        assert localmq_cli.main([*args, "--json"]) == 0, args
        out = capsys.readouterr().out
    else:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        r = subprocess.run(
            [sys.executable, "-m", "localmq", *args, "--json"], capture_output=True, text=True, env=env, timeout=120
        )
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
        out = r.stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def check_json(j: dict[str, Any], m: dict[str, Any]) -> None:
    """A CLI message line against RocketMQ's reading (the fields the CLI prints)."""
    where = (m["topic"], m["queueId"], m["queueOffset"])
    assert (j["topic"], j["queue_id"], j["queue_offset"], j["physical_offset"], j["store_size"]) == (
        m["topic"],
        m["queueId"],
        m["queueOffset"],
        m["commitLogOffset"],
        m["storeSize"],
    ), where
    assert (j["store_timestamp"], j["born_timestamp"], j["msg_id"]) == (
        m["storeTimestamp"],
        m["bornTimestamp"],
        m["msgId"],
    ), where
    assert (j["tags"], keys_of(j["keys"]), j["properties"]) == (m["tags"], keys_of(m["keys"]), m["properties"]), where
    assert base64.b64decode(j["body_base64"]) == base64.b64decode(m["body"]), where


def test_cli_reads_rocketmq_store(written: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m localmq dump --json` (every record), `tail` (every queue of every topic), `dlq` and `query --key`."""
    store, manifest = written
    recs = records(manifest)
    by_offset = {m["commitLogOffset"]: m for m in recs}
    with capsys.disabled():
        dumped = cli("dump", str(store), "--limit", "0")
        tailed = cli("tail", str(store), "batched", "-n", "1000")
    assert [j["physical_offset"] for j in dumped] == sorted(by_offset)
    for j in dumped:
        check_json(j, by_offset[j["physical_offset"]])
    for topic in sorted({m["topic"] for m in recs} - {"batched"}):
        tailed += cli("tail", str(store), topic, "-n", "1000", capsys=capsys)
    assert len(tailed) == len(recs)
    for j in tailed:
        check_json(j, by_offset[j["physical_offset"]])
    dlq = manifest["queues"]["%DLQ%billing/0"]["messages"]
    dead = cli("dlq", str(store), "billing", capsys=capsys)
    assert len(dead) == len(dlq) == 2
    for j, m in zip(dead, dlq):
        check_json(j, m)
        assert j["reconsume_times"] == m["reconsumeTimes"] == 17
    picked = [name for name in manifest["queried"] if name.startswith(("batched/", "%RETRY%", "%DLQ%", "remind/"))]
    picked += [name for name in manifest["queried"] if name.endswith("shared-key")]
    assert len(picked) > 10
    with capsys.disabled():  # one through the entry point
        topic, key = picked[0].split("/", 1)
        assert sorted(j["physical_offset"] for j in cli("query", str(store), "--topic", topic, "--key", key)) == sorted(
            manifest["queried"][picked[0]]
        )
    for name in picked:
        topic, key = name.split("/", 1)
        got = sorted(
            j["physical_offset"] for j in cli("query", str(store), "--topic", topic, "--key", key, capsys=capsys)
        )
        assert got == sorted(manifest["queried"][name]), name


def test_spark_reads_rocketmq_store(spark: Any, written: tuple[Path, dict[str, Any]]) -> None:
    """One Spark read of the whole store: a row per ConsumeQueue unit, with RocketMQ's fields."""
    store, manifest = written
    by_offset = {m["commitLogOffset"]: m for m in records(manifest)}
    rows = (
        spark.read.format("localmq")
        .option("minPartitions", "1")
        .load(str(store))
        .selectExpr(
            "topic",
            "partition",
            "offset",
            "physical_offset",
            "value",
            "reconsume_times",
            "sys_flag",
            "tags",
            "properties",
            "msg_id",
            "CAST(unix_micros(timestamp) / 1000 AS BIGINT) AS store_ms",
            "CAST(unix_micros(born_timestamp) / 1000 AS BIGINT) AS born_ms",
        )
        .collect()
    )
    assert len(rows) == len(by_offset)
    for r in rows:
        m = by_offset[r.physical_offset]
        assert (
            r.topic,
            r.partition,
            r.offset,
            bytes(r.value),
            r.store_ms,
            r.born_ms,
            r.reconsume_times,
            r.sys_flag,
            r.tags,
            dict(r.properties),
            r.msg_id,
        ) == (
            m["topic"],
            m["queueId"],
            m["queueOffset"],
            base64.b64decode(m["body"]),
            m["storeTimestamp"],
            m["bornTimestamp"],
            m["reconsumeTimes"],
            m["sysFlag"],
            m["tags"],
            m["properties"],
            m["msgId"],
        ), r.physical_offset


_queue = functools.partial(queue_messages, wait=False)


@pytest.fixture(scope="module")
def taken_over(
    written: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """A copy of RocketMQ's store opened by localmq with the same levels until its schedule service has delivered
    what RocketMQ's delayOffset.json leaves (then 1.5 s more: a second delivery of anything would show), closed;
    and the records localmq delivered, as (record, the schedule record it came from) field dicts."""
    src, manifest = written
    root = tmp_path_factory.mktemp("rmq-takeover")
    store = root / "store"
    shutil.copytree(src, store)
    sched = [m for q in (0, 1) for m in manifest["queues"][f"{SCHED}/{q}"]["messages"]]
    expect = collections.Counter((m["properties"]["REAL_TOPIC"], int(m["properties"]["REAL_QID"])) for m in sched)
    before = {t: manifest["queues"].get(f"{t[0]}/{t[1]}", {"maxOffset": 0})["maxOffset"] for t in expect}
    left = {base64.b64decode(m["body"]): m for m in pending(manifest)}
    delivered = []
    with localmq.open(store, message_delay_level=LEVELS) as st:
        deadline = time.monotonic() + 30
        while sum(st.max_offset(*t) for t in expect) < sum(expect.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        for t, n in expect.items():
            msgs = _queue(st, *t)
            assert len(msgs) == n, (t, len(msgs), n, before[t])  # nothing lost, nothing delivered twice
            for got in msgs[before[t] :]:
                body = bytes(got.body)
                assert body in left, (t, got.queue_offset)  # none RocketMQ delivered is delivered again
                delivered.append(
                    {
                        "topic": got.topic,
                        "queueId": got.queue_id,
                        "body": body,
                        "flag": got.flag,
                        "sysFlag": got.sys_flag,
                        "bornTimestamp": got.born_timestamp,
                        "bornHost": got.born_host,
                        "storeHost": got.store_host,
                        "reconsumeTimes": got.reconsume_times,
                        "properties": dict(got.properties),
                        "from": left[body],
                    }
                )
    assert sorted(d["body"] for d in delivered) == sorted(left)
    yield store, delivered
    shutil.rmtree(root)


def test_localmq_delivers_what_rocketmq_left(taken_over: tuple[Path, list[dict[str, Any]]]) -> None:
    """Each level-2 schedule record delivered once, RocketMQ's way: into REAL_TOPIC/REAL_QID with the same body,
    properties string, flag, born fields and reconsume times; delayOffset.json then says so."""
    store, delivered = taken_over
    assert len(delivered) >= 1
    for d in delivered:
        m = d["from"]
        assert (d["topic"], d["queueId"]) == (m["properties"]["REAL_TOPIC"], int(m["properties"]["REAL_QID"]))
        assert d["properties"] == m["properties"]
        assert (d["flag"], d["sysFlag"] & ~0x20, d["bornTimestamp"], d["reconsumeTimes"], d["bornHost"]) == (
            m["flag"],
            m["sysFlag"] & ~0x20,
            m["bornTimestamp"],
            m["reconsumeTimes"],
            canonical_host(m["bornHost"]),
        )
    offsets = localmq.read_config_json(store / "config" / "delayOffset.json")["offsetTable"]
    assert {int(k): v for k, v in offsets.items()} == {1: 8, 2: 6}


def test_localmq_delivery_keeps_store_host(taken_over: tuple[Path, list[dict[str, Any]]]) -> None:
    """RocketMQ's delivered records (in the manifest: level 1) keep the schedule record's store host and its
    STOREHOST_V6 bit; localmq's do too (PutExtra.store_host)."""
    _, delivered = taken_over
    got = [(d["storeHost"], d["sysFlag"]) for d in delivered]
    want = [(canonical_host(d["from"]["storeHost"]), d["from"]["sysFlag"]) for d in delivered]
    assert got == want, (got, want)


def test_localmq_consumer_reads_rocketmq_retries_and_dead_letters(
    written: tuple[Path, dict[str, Any]], taken_over: tuple[Path, Any]
) -> None:
    """Group billing (committed at the end of orders in RocketMQ's consumerOffset.json) gets its 5 retries (3
    delivered by RocketMQ, 2 by localmq) under orders with reconsume times 1; dead_letters lists the DLQ records."""
    _, manifest = written
    store, _ = taken_over
    retries = [
        m
        for q in (0, 1)
        for m in manifest["queues"][f"{SCHED}/{q}"]["messages"]
        if m["properties"]["REAL_TOPIC"] == "%RETRY%billing"
    ]
    assert len(retries) == 5
    got_retries = []
    with localmq.open(store, message_delay_level=LEVELS) as st:
        # RocketMQ's consumerOffset.json as localmq's ConsumerOffsetManager reads it: orders committed to its end
        offsets = st.consumer_offsets
        assert {q: offsets.query("billing", "orders", q) for q in range(4)} == {
            q: manifest["queues"][f"orders/{q}"]["maxOffset"] for q in range(4)
        }
        assert offsets.query("billing", "%RETRY%billing", 0) is None
        with st.create_consumer("billing", "orders", manual_ack=True) as c:
            deadline = time.monotonic() + 20
            while len(got_retries) < len(retries) and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None:
                    got_retries.append((bytes(m.body), m.topic, m.reconsume_times, m.properties["ORIGIN_MESSAGE_ID"]))
                    m.ack()
            assert c.poll(0.5) is None  # nothing more: orders itself is committed to its end
        assert sorted(got_retries) == sorted(
            (base64.b64decode(m["body"]), "orders", 1, m["properties"]["ORIGIN_MESSAGE_ID"]) for m in retries
        )
        dlq = manifest["queues"]["%DLQ%billing/0"]["messages"]
        dead = st.dead_letters("billing")
        assert len(dead) == len(dlq) == 2
        for got, m in zip(dead, dlq):
            check(got, m)
            assert (got.reconsume_times, got.properties["RETRY_TOPIC"], got.properties["DELAY"]) == (17, "orders", "0")


def test_localmq_send_back_keeps_store_host(written: tuple[Path, dict[str, Any]], taken_over: tuple[Path, Any]) -> None:
    """A localmq consumer fails a message RocketMQ wrote (store host 192.168.1.7:10911 or an IPv6 one): the
    send-back record in SCHEDULE_TOPIC_XXXX keeps that store host, as a 4.9.8 broker's does."""
    _, manifest = written
    store, _ = taken_over
    with localmq.open(store, message_delay_level=LEVELS) as st:
        before = st.max_offset(SCHED, 0)
        with st.create_consumer("auditors", "orders", manual_ack=True) as c:
            m = None
            deadline = time.monotonic() + 10
            while m is None and time.monotonic() < deadline:
                m = c.poll(0.2)
            assert m is not None
            failed = m.physical_offset
            m.nack(delay_level=1)
        st.wait_for_dispatch(10)
        back = st.get_message(SCHED, 0, before, 1).messages
        assert len(back) == 1
        original = {r["commitLogOffset"]: r for r in records(manifest)}[failed]
        assert (back[0].store_host, back[0].sys_flag) == (canonical_host(original["storeHost"]), original["sysFlag"])
