"""Uses localmq's public API with the types a user sees; ``mypy --strict`` must pass on it (tests/test_typing.py).

Never run: it only has to type-check. Every name it binds is checked against a real type (``assert_type``),
so a public name that silently degrades to ``Any`` fails the check.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from typing_extensions import assert_type

import localmq
from localmq import (
    GetResult,
    GetStatus,
    LocalMessageQueue,
    Message,
    PutResult,
    PutStatus,
    StoreConfig,
    decode_message,
    decode_message_id,
    encode_message,
)
from localmq.client import Consumer, Producer


def use_store(path: str) -> None:
    with localmq.open(path, flush_disk_type="SYNC_FLUSH") as mq:
        assert_type(mq, LocalMessageQueue)
        r = mq.put("T", b"hello", queue_id=0, tags="a", keys=["k1", "k2"], properties={"p": "v"})
        assert_type(r, PutResult)
        assert_type(r.status, PutStatus)
        assert_type(r.physical_offset, int)
        assert_type(r.msg_id, Optional[str])
        if r.status is PutStatus.PUT_OK and r.ok:
            pass
        b = mq.put_batch("T", [b"a", bytearray(b"b"), memoryview(b"c")], queue_id=1)
        assert_type(b.msg_num, int)

        g = mq.get_message("T", 0, 0, 32, tags="a || b")
        assert_type(g, GetResult[Message])
        assert_type(g.status, GetStatus)
        assert_type(g.next_begin_offset, int)
        if g.found:
            for m in g:
                assert_type(m, Message)
                assert_type(m.body, "bytes | memoryview")
                assert_type(m.topic, str)
                assert_type(m.queue_offset, int)
                assert_type(m.tags, Optional[str])
                assert_type(m.keys, Tuple[str, ...])
                assert_type(m.properties, "dict[str, str]")
                assert_type(m.msg_id, Optional[str])
        assert_type(mq.max_offset("T", 0), int)
        assert_type(mq.min_offset("T", 0), int)
        assert_type(mq.topics(), "dict[str, List[int]]")

        p = mq.create_producer(queue_id=0)
        assert_type(p, Producer)
        c = mq.create_consumer("group", ["T"])
        assert_type(c, Consumer)
        batch = c.poll_batch(16, timeout=0.1)
        assert_type(batch, List[Message])
        one = c.poll(timeout=0.1)
        assert_type(one, Optional[Message])
        c.commit()
        c.close()
        p.close()


def use_codec() -> None:
    raw = encode_message("T", b"body", queue_id=1, properties={"TAGS": "t"})
    assert_type(raw, bytes)
    m = decode_message(raw)
    assert_type(m, Optional[Message])
    host, offset = decode_message_id("7F0000010000276B0000000000000000")
    assert_type(host, str)
    assert_type(offset, int)


def use_config_and_errors(path: str) -> None:
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20)
    try:
        LocalMessageQueue(path, cfg).close()
    except localmq.StoreLockedError as e:
        assert_type(e, localmq.StoreLockedError)
    except localmq.LocalMQError as e:
        assert_type(str(e), str)


async def use_aio(path: str) -> None:
    import localmq.aio

    st = await localmq.aio.open(path)
    assert_type(st, localmq.aio.AsyncStore)
    p = st.create_producer()
    assert_type(p, localmq.aio.AsyncProducer)
    c = st.create_consumer("group", "T")
    assert_type(c, localmq.aio.AsyncConsumer)
    batch = await c.poll_batch(8, timeout=0.1)
    assert_type(batch, List[Any])
    await st.close()


def use_acks(path: str) -> None:
    with localmq.open(path) as st:
        c = st.create_consumer("group", "T", manual_ack=True, max_reconsume_times=3)
        m = c.poll(0.1)
        if m is not None:
            m.ack()
            m.nack(delay=1.5)
            m.nack(delay_level=-1)
        handled = c.listen(lambda msgs: localmq.ConsumeStatus.CONSUME_SUCCESS, batch_size=4, idle_timeout=0.1)
        assert_type(handled, int)
        assert_type(c.unacked(), int)
        dead = st.dead_letters("group")
        assert_type(dead, List[Message])
        assert_type(st.redrive_dead_letters("group"), int)


def use_filter(properties: Dict[str, str]) -> None:
    from localmq.filter import FilterSyntaxError, Sql92Filter, compile_sql92

    f = compile_sql92("a > 5 AND b = 'x'")
    assert_type(f, Sql92Filter)
    assert_type(f.matches(properties), bool)
    assert_type(f.expression, str)
    assert_type(f.select([properties]), List[Mapping[str, str]])
    try:
        compile_sql92("a >")
    except FilterSyntaxError as e:
        assert_type(e.position, int)
