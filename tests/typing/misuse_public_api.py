"""Misuses localmq's public API; ``mypy --strict`` must report every line marked ``# E:`` (tests/test_typing.py)."""

from __future__ import annotations

import localmq


def misuse(path: str) -> None:
    with localmq.open(path) as mq:
        mq.put("T", "not bytes")  # E: arg-type
        mq.put("T", b"x", queue_id="0")  # E: arg-type
        mq.put_batch("T", [1, 2])  # E: list-item
        r = mq.put("T", b"x")
        offset: str = r.physical_offset  # E: assignment
        mq.put(offset, b"x")
        g = mq.get_message("T", "0", 0)  # E: arg-type
        for m in g.messages:
            m.body.decode("utf-8")  # E: union-attr
            m.topic + 1  # E: operator
        mq.create_consumer("g", ["T"]).poll_batch("16")  # E: arg-type
    localmq.decode_message_id(42)  # E: arg-type
