"""asyncio front end: ``await producer.send(...)`` and ``async for m in consumer``, waking without busy polling.

One watcher thread per open store (not one per waiter) sleeps in the store's ``wait_for_new_messages`` (the
dispatcher's condition, or the shared futex when processes share the store) while any coroutine waits, and wakes
every waiting coroutine through its event loop (``call_soon_threadsafe``) when messages become readable. Puts
take microseconds and run on the loop's thread; a SYNC_FLUSH put waits for the disk, so it runs in the loop's
default executor. Opening (recovery) and closing run in the executor too.

    async with await localmq.aio.open(path) as st:
        p = st.create_producer()
        await p.send("orders", b"...")
        async with st.create_consumer("billing", "orders") as c:
            async for m in c:
                ...
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, List, Optional, Set, Tuple

import localmq
from localmq.config import FlushDiskType
from localmq.errors import StoreClosedError

__all__ = ["open", "AsyncStore", "AsyncProducer", "AsyncConsumer"]


class _Watcher:
    """Wakes the coroutines waiting for new messages of one store; its thread runs only while some wait."""

    def __init__(self, mq: Any) -> None:
        self.mq = mq
        self._lock = threading.Condition()
        self._waiting: Set[Tuple[asyncio.AbstractEventLoop, "asyncio.Future[int]", int]] = set()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self.wakeups = 0  # rounds that woke coroutines (tests and stats)

    async def wait(self, since: int, timeout: Optional[float]) -> int:
        """Until ``mq.progress`` moves past ``since`` or ``timeout`` s pass; returns the progress seen."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[int]" = loop.create_future()
        entry = (loop, fut, since)
        with self._lock:
            if self._stopped:
                raise StoreClosedError("the store is closed")
            self._waiting.add(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="localmq-aio-watcher", daemon=True)
                self._thread.start()
            self._lock.notify_all()
        try:
            if self.mq.progress != since:  # moved before we registered: no wake-up would come
                return int(self.mq.progress)
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return int(self.mq.progress)
        finally:
            with self._lock:
                self._waiting.discard(entry)

    def _run(self) -> None:
        mq = self.mq
        while True:
            with self._lock:
                while not self._waiting and not self._stopped:
                    self._lock.wait()
                if self._stopped:
                    return
                since = min(e[2] for e in self._waiting)
            try:
                # one thread sleeps in the store's own long-poll; bounded so that new waiters with an older
                # ``since`` and stop() are seen
                now = mq.wait_for_new_messages(0.5, since=since)
                err: Optional[BaseException] = None
            except BaseException as e:  # closed store or a stopped dispatcher: every waiter gets the error
                now, err = since, e
            with self._lock:
                ready = [e for e in self._waiting if err is not None or now != e[2]]
                if err is not None:
                    self._stopped = True
            for loop, fut, _ in ready:
                try:
                    loop.call_soon_threadsafe(_resolve, fut, now, err)
                except RuntimeError:
                    pass  # that loop is closed: nobody waits there any more
            if ready:
                self.wakeups += 1
            if err is not None:
                return

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        try:
            self.mq.wake_waiters()
        except StoreClosedError:
            pass
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(5)


def _resolve(fut: "asyncio.Future[int]", value: int, err: Optional[BaseException]) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err if isinstance(err, StoreClosedError) else StoreClosedError(str(err)))
    else:
        fut.set_result(value)


class AsyncProducer:
    """``await send(...)`` / ``await send_batch(...)`` of a Producer (same arguments, results and SendError)."""

    def __init__(self, producer: Any, blocking: bool) -> None:
        self.producer = producer
        self._blocking = blocking  # SYNC_FLUSH: a put waits for the disk, so it leaves the loop's thread

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._blocking:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: fn(*args, **kwargs))

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self.producer.send, *args, **kwargs)

    async def send_batch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self.producer.send_batch, *args, **kwargs)

    def close(self) -> None:
        self.producer.close()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class AsyncConsumer:
    """A Consumer whose waits are awaited: ``await poll_batch(n, timeout)``, ``await poll(timeout)`` and
    ``async for m in consumer`` (ends when the consumer or the store is closed)."""

    def __init__(self, consumer: Any, watcher: _Watcher) -> None:
        self.consumer = consumer
        self._watcher = watcher
        self._buffer: List[Any] = []

    async def poll_batch(self, max_messages: int = 32, timeout: Optional[float] = None) -> List[Any]:
        """Up to ``max_messages`` messages; [] when ``timeout`` seconds pass first. Raises as Consumer.poll."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        mq = self.consumer._mq
        while True:
            token = mq.progress
            out = self.consumer.poll_batch(max_messages, timeout=0)
            if out:
                return list(out)
            if self.consumer.closed:
                return []
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return []
            # the consumer re-checks its queues (rebalance, retention) at least every half second
            await self._watcher.wait(token, 0.5 if left is None else min(left, 0.5))

    async def poll(self, timeout: Optional[float] = None) -> Optional[Any]:
        if self._buffer:
            return self._buffer.pop(0)
        out = await self.poll_batch(1, timeout)
        return out[0] if out else None

    def __aiter__(self) -> "AsyncConsumer":
        return self

    async def __anext__(self) -> Any:
        while not self._buffer:
            if self.consumer.closed:
                raise StopAsyncIteration
            try:
                self._buffer = await self.poll_batch(32, None)
            except StoreClosedError:
                raise StopAsyncIteration from None
        return self._buffer.pop(0)

    async def commit(self, durable: bool = True) -> None:
        """Commit the offsets of what was delivered (a durable commit fsyncs: it runs in the executor)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: self.consumer.commit(durable=durable))

    def close(self) -> None:
        self.consumer.close()

    async def __aenter__(self) -> "AsyncConsumer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class AsyncStore:
    """An open store (any localmq queue) for asyncio code; ``store`` is the synchronous object underneath."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._watcher = _Watcher(store)
        cfg = getattr(store, "config", None)
        self._blocking = getattr(cfg, "flush_disk_type", None) is FlushDiskType.SYNC_FLUSH

    def create_producer(self, **options: Any) -> AsyncProducer:
        return AsyncProducer(self.store.create_producer(**options), self._blocking)

    def create_consumer(self, group: str, topics: Any, **options: Any) -> AsyncConsumer:
        return AsyncConsumer(self.store.create_consumer(group, topics, **options), self._watcher)

    async def wait_for_new_messages(self, timeout: Optional[float] = None, since: Optional[int] = None) -> int:
        """``store.wait_for_new_messages`` without blocking the loop."""
        return await self._watcher.wait(self.store.progress if since is None else since, timeout)

    async def close(self) -> None:
        """Wake and end every waiter, then close the store (in the executor: it flushes)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._watcher.stop)
        await loop.run_in_executor(None, self.store.close)

    async def __aenter__(self) -> "AsyncStore":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        # everything else (get_message, put, stats, ...) is the synchronous store's
        return getattr(self.store, name)


async def open(path: Any, kind: str = "local", **config: Any) -> AsyncStore:  # noqa: A001 - mirrors localmq.open
    """``localmq.open`` for asyncio code: opens (and recovers) the store in the loop's default executor."""
    loop = asyncio.get_running_loop()
    store = await loop.run_in_executor(None, lambda: localmq.open(path, kind, **config))
    return AsyncStore(store)
