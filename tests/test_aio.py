"""localmq.aio (issue 14): await producer.send, async for over a consumer, wake-ups without busy polling and
without one thread per waiter, across threads and processes."""

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import localmq
import localmq.aio
from localmq.errors import StoreClosedError

SMALL = dict(mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=4000)


def test_send_and_async_for_in_order(tmp_path):
    async def main():
        async with await localmq.aio.open(tmp_path / "s", **SMALL) as st:
            p = st.create_producer(queue_id=0)
            sent = [b"m%04d" % i for i in range(500)]
            for b in sent[:250]:
                assert (await p.send("orders", b)).ok
            r = await p.send_batch("orders", sent[250:])
            assert r.msg_num == 250
            got = []
            async with st.create_consumer("g", "orders") as c:
                async for m in c:
                    got.append(m.body)
                    if len(got) == len(sent):
                        break
                await c.commit()
                assert c.consumer.committed("orders", 0) == 500
            assert got == sent

    asyncio.run(main())


def test_many_waiters_wake_on_a_put_from_another_thread_with_one_watcher_thread(tmp_path):
    """50 coroutines wait on one store: one watcher thread, not 50; a put from another thread wakes all of them
    within a fraction of a second; a timeout returns []."""

    async def main():
        async with await localmq.aio.open(tmp_path / "s", **SMALL) as st:
            consumers = [st.create_consumer(f"g{i}", "t") for i in range(50)]
            assert await consumers[0].poll_batch(8, timeout=0.2) == []  # nothing yet: a timeout, not an error
            threads_before = threading.active_count()
            loop = asyncio.get_running_loop()
            waits = [asyncio.ensure_future(c.poll_batch(8, timeout=10)) for c in consumers]
            await asyncio.sleep(0.3)
            assert threading.active_count() <= threads_before + 1  # the watcher, at most
            assert not any(w.done() for w in waits)
            t0 = loop.time()
            threading.Thread(target=lambda: st.store.put("t", b"hello")).start()
            results = await asyncio.gather(*waits)
            elapsed = loop.time() - t0
            assert all([m.body for m in r] == [b"hello"] for r in results)
            assert elapsed < 5  # woken, not timed out (10 s)
            for c in consumers:
                c.close()

    asyncio.run(main())


def test_close_ends_waiting_iterators(tmp_path):
    async def main():
        st = await localmq.aio.open(tmp_path / "s", **SMALL)
        c = st.create_consumer("g", "t")

        async def drain():
            return [m async for m in c]

        task = asyncio.ensure_future(drain())
        await asyncio.sleep(0.2)
        c.close()
        assert await asyncio.wait_for(task, 5) == []
        c2 = st.create_consumer("h", "t")
        waiter = asyncio.ensure_future(c2.poll_batch(4, timeout=30))
        await asyncio.sleep(0.2)
        await st.close()
        with pytest.raises(StoreClosedError):
            await asyncio.wait_for(waiter, 5)

    asyncio.run(main())


def test_sync_flush_sends_leave_the_loop_thread(tmp_path):
    """In SYNC_FLUSH a put waits for the disk: send runs off the loop's thread and other coroutines keep running.

    No timing: each send waits (in the producer's own call) for an event that only a coroutine on the loop sets,
    so a send run on the loop's thread would wait out its 5 s and be seen doing so."""

    async def main():
        async with await localmq.aio.open(tmp_path / "s", flush_disk_type="SYNC_FLUSH", **SMALL) as st:
            p = st.create_producer(queue_id=0)
            loop_thread = threading.get_ident()
            released = threading.Event()
            seen = []  # (thread, released in time) of each send
            real_send = p.producer.send

            def send(*args, **kwargs):
                in_time = released.wait(5)
                released.set()  # one late send is enough to fail: the others need not wait out theirs too
                seen.append((threading.get_ident(), in_time))
                return real_send(*args, **kwargs)

            p.producer.send = send
            sends = asyncio.gather(*(p.send("t", b"%d" % i) for i in range(20)))
            await asyncio.sleep(0)  # a coroutine runs while the sends are under way
            released.set()
            rs = await sends
            assert all(r.ok for r in rs) and len(seen) == 20
            assert all(thread != loop_thread and in_time for thread, in_time in seen)
            assert sorted(r.queue_offset for r in rs) == list(range(20))  # executor threads: in any order

    asyncio.run(main())


WRITER = textwrap.dedent("""
    import sys, time
    import localmq
    st = localmq.open(sys.argv[1], shared=True, mapped_file_size_commit_log=256 * 1024,
                      mapped_file_size_consume_queue=4000)
    time.sleep(float(sys.argv[2]))
    st.put("x", b"from another process")
    st.close()
""")


def test_a_put_in_another_process_wakes_an_async_consumer(tmp_path):
    root = tmp_path / "s"

    async def main():
        async with await localmq.aio.open(root, shared=True, **SMALL) as st:
            c = st.create_consumer("g", "x")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root), "0.5"], env=env)
            try:
                t0 = time.monotonic()
                got = await c.poll_batch(4, timeout=20)
                assert [m.body for m in got] == [b"from another process"]
                assert time.monotonic() - t0 < 15
            finally:
                proc.wait(20)
            c.close()

    asyncio.run(main())
