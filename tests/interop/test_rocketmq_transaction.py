"""Transactional records written by localmq (half, copies, commits, op records, discards) read by RocketMQ 4.9.8."""

from __future__ import annotations

import base64
import functools
import json
import time
from pathlib import Path
from typing import Any

import localmq
from helpers import queue_messages
from localmq import LocalTransactionState as S

from .test_rocketmq_store import SIZES, harness, run_harness  # noqa: F401 - harness is a fixture

HALF, OP, DISCARD = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"


_all = functools.partial(queue_messages, wait=False)


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_localmq_transactions_read_by_rocketmq(harness: list[str], tmp_path: Path) -> None:  # noqa: F811
    store, out = tmp_path / "store", tmp_path / "read.json"
    answers = {b"checked-commit": S.COMMIT_MESSAGE, b"stuck": S.UNKNOW}
    st = localmq.open(store, **SIZES, transaction_timeout=100, transaction_check_interval=100, transaction_check_max=2)
    try:
        tp = st.create_transaction_producer("pg", lambda m: answers[m.body], queue_id=1)
        tids = {}
        for body, local in (
            (b"commit", S.COMMIT_MESSAGE),
            (b"rollback", S.ROLLBACK_MESSAGE),
            (b"checked-commit", S.UNKNOW),
            (b"stuck", S.UNKNOW),
        ):
            tids[body] = tp.send_in_transaction(
                "orders", body, lambda m, a, s=local: s, tags="t", properties={"p": "v"}
            ).transaction_id
        st.wait_for_dispatch(10)
        _wait(lambda: st.wait_for_dispatch(10) and len(_all(st, DISCARD, 0)) == 1 and len(_all(st, OP, 0)) == 3)
        ours = {(t, q): _all(st, t, q) for t, q in ((HALF, 0), (OP, 0), ("orders", 1), (DISCARD, 0))}
    finally:
        st.close()
    assert [m.body for m in ours[("orders", 1)]] == [b"commit", b"checked-commit"]
    queries = ["orders", tids[b"commit"], HALF, tids[b"stuck"]]
    run_harness(harness, "read", str(store), str(out), *queries)
    read = json.loads(out.read_text(encoding="utf-8"))
    for (topic, qid), msgs in ours.items():
        q = read["queues"][f"{topic}/{qid}"]
        assert q["maxOffset"] == len(msgs), (topic, q)
        for m, j in zip(msgs, q["messages"]):
            where = (topic, m.queue_offset)
            assert j["getStatus"] == "FOUND", where
            assert (j["commitLogOffset"], j["queueOffset"], j["sysFlag"], j["preparedTransactionOffset"]) == (
                m.physical_offset,
                m.queue_offset,
                m.sys_flag,
                m.prepared_transaction_offset,
            ), where
            assert (j["flag"], j["bornTimestamp"], j["storeTimestamp"], j["bornHost"], j["storeHost"]) == (
                m.flag,
                m.born_timestamp,
                m.store_timestamp,
                m.born_host,
                m.store_host,
            ), where
            assert base64.b64decode(j["body"]) == bytes(m.body) and j["properties"] == m.properties, where
    committed = {base64.b64decode(j["body"]): j for j in read["queues"]["orders/1"]["messages"]}
    assert committed[b"commit"]["sysFlag"] & 0xC == 0x8
    assert committed[b"commit"]["properties"]["TRAN_MSG"] == "true"
    assert read["queues"][f"{OP}/0"]["messages"][0]["tags"] == "d"
    assert read["queried"][f"orders/{tids[b'commit']}"] == [ours[("orders", 1)][0].physical_offset]
    stuck_halves = [m.physical_offset for m in ours[(HALF, 0)] if m.uniq_key == tids[b"stuck"]]
    assert sorted(read["queried"][f"{HALF}/{tids[b'stuck']}"]) == sorted(stuck_halves)
