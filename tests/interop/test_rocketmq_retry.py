"""Retry, dead-letter and scheduled records written by localmq read by RocketMQ 4.9.8's DefaultMessageStore."""

from __future__ import annotations

import base64
import functools
import json
import time
from pathlib import Path

import localmq
from helpers import queue_messages

from .test_rocketmq_store import SIZES, harness, run_harness  # noqa: F401 - harness is a fixture

SCHED = "SCHEDULE_TOPIC_XXXX"


_all = functools.partial(queue_messages, wait=False)


def test_localmq_retries_read_by_rocketmq(harness: list[str], tmp_path: Path) -> None:  # noqa: F811
    """A consumer fails messages (retry through SCHEDULE_TOPIC_XXXX into %RETRY%g, then %DLQ%g) and a producer sends
    a delayed one; RocketMQ's store reads every queue with the same fields, reconsume times and properties, and its
    index finds the copies of a message under <topic>#<UNIQ_KEY>."""
    store, out = tmp_path / "store", tmp_path / "read.json"
    st = localmq.open(store, **SIZES, message_delay_level="1s 1s 1s 1s")
    try:
        p = st.create_producer(queue_id=0)
        for i in range(4):
            p.send("orders", b"o%d" % i, tags="created", keys=["k%d" % i], properties={"n": str(i)})
        p.send("orders", b"later", delay_level=2)
        with st.create_consumer("g", "orders", manual_ack=True, max_reconsume_times=1) as c:
            deadline = time.monotonic() + 30
            while (c.dead_lettered < 2 or c.acked < 3) and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.body in (b"o1", b"o2"):
                    m.nack(delay_level=1)  # o1, o2: retried once, then dead letters
                elif m.body == b"o3" and m.reconsume_times == 0:
                    m.nack(delay_level=1)  # o3: retried once, then acked
                else:
                    m.ack()
            assert c.dead_lettered == 2 and c.acked == 3, (c.dead_lettered, c.acked, c.retried)
        st.wait_for_dispatch(10)
        queues = {(t, q): _all(st, t, q) for t, qs in st.topics().items() for q in qs}
        uniq_o1 = next(m for m in queues[("orders", 0)] if m.body == b"o1").uniq_key
    finally:
        st.close()
    assert set(queues) == {("%DLQ%g", 0), ("%RETRY%g", 0), ("orders", 0), (SCHED, 0), (SCHED, 1)}
    assert len(queues[(SCHED, 0)]) == 3 and len(queues[("%RETRY%g", 0)]) == 3 and len(queues[("%DLQ%g", 0)]) == 2
    run_harness(harness, "read", str(store), str(out), "%RETRY%g", uniq_o1, "%DLQ%g", uniq_o1)
    read = json.loads(out.read_text(encoding="utf-8"))
    assert sorted(read["queues"]) == sorted(f"{t}/{q}" for t, q in queues)
    compared = 0
    for (topic, qid), msgs in queues.items():
        q = read["queues"][f"{topic}/{qid}"]
        assert (q["minOffset"], q["maxOffset"]) == (0, len(msgs)), (topic, q)
        for m, j in zip(msgs, q["messages"]):
            where = (topic, qid, m.queue_offset)
            assert j["getStatus"] == "FOUND", where
            assert (j["topic"], j["queueId"], j["queueOffset"], j["commitLogOffset"], j["storeSize"]) == (
                topic,
                qid,
                m.queue_offset,
                m.physical_offset,
                m.store_size,
            ), where
            assert (j["flag"], j["sysFlag"], j["reconsumeTimes"], j["preparedTransactionOffset"]) == (
                m.flag,
                m.sys_flag,
                m.reconsume_times,
                m.prepared_transaction_offset,
            ), where
            assert (j["bornTimestamp"], j["storeTimestamp"], j["bornHost"], j["storeHost"]) == (
                m.born_timestamp,
                m.store_timestamp,
                m.born_host,
                m.store_host,
            ), where
            assert base64.b64decode(j["body"]) == bytes(m.body) and j["properties"] == m.properties, where
            assert j["tags"] == m.tags, where
            compared += 1
    assert compared == 5 + 3 + 1 + 3 + 2
    dlq = read["queues"]["%DLQ%g/0"]["messages"]
    assert [j["reconsumeTimes"] for j in dlq] == [2, 2]
    assert all(j["properties"]["RETRY_TOPIC"] == "orders" and j["properties"]["DELAY"] == "0" for j in dlq)
    # the index: every copy of o1 is found under its own topic and the UNIQ_KEY it kept
    retry_o1 = [
        j["commitLogOffset"] for j in read["queues"]["%RETRY%g/0"]["messages"] if base64.b64decode(j["body"]) == b"o1"
    ]
    dlq_o1 = [j["commitLogOffset"] for j in dlq if base64.b64decode(j["body"]) == b"o1"]
    assert read["queried"][f"%RETRY%g/{uniq_o1}"] == retry_o1
    assert read["queried"][f"%DLQ%g/{uniq_o1}"] == dlq_o1
