"""EmbeddedMessageQueue: one file queue of mapped partitions per (topic, queue id) (the second LocalMQ queue)."""

from __future__ import annotations

import array
import bisect
import collections
import logging
import os
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from localmq._frame import frame_size, read_frames, walk_frames, write_frame
from localmq._mapped_file import MappedFile, offset_to_file_name
from localmq._native import fsync_dir
from localmq.config import batch_bodies, body_length, check_topic
from localmq.errors import (
    ArgumentRangeError,
    ConfigError,
    CorruptStoreError,
    InvalidQueueIdError,
    MessageSizeError,
    StoreClosedError,
    check_int_range,
)
from localmq.layout import (
    FRAME_BODY_AT,
    FRAME_BODY_LEN,
    FRAME_BODY_LEN_AT,
    FRAME_OVERHEAD,
    FRAME_STORE_TS,
    MAX_QUEUE_ID,
    TOPIC_RE,
    frame_store_ts_at,
    interrupted_creation,
    is_decimal,
)
from localmq.queues.base import (
    ProcessBoundMixin,
    ProgressWaiterMixin,
    QueueClientsMixin,
    build_properties,
    check_queue_id,
    tag_names,
)
from localmq.services.service_thread import ServiceThread
from localmq.status import GetResult, GetStatus, PutStatus, Stop
from localmq.store.durable_names import makedirs_durable
from localmq.store.lock import StoreLock
from localmq.store.put_result import make_put_result
from localmq.store.undo import check_writable_filesystem, missing_ancestor

log = logging.getLogger("localmq.queues.embedded")

MAX_GET_MESSAGES = (1 << 31) - 1  # the largest max_messages of get_message (an int32 in the compiled get path)

_PUT_OK = PutStatus.PUT_OK
_CREATE_FAILED = PutStatus.CREATE_MAPPED_FILE_FAILED
_SCAN_FRAMES = 1024  # frames one filtered get_message looks at, at most
_READ_CAP = 1024 * 1024  # bytes one get_message reads, at most (at least one frame)
_OS_PAGE = 4096


class _Partition:
    """One partition file of a bucket: its byte base (the name), first message index and the end of its data."""

    __slots__ = ("base", "path", "first", "end")

    def __init__(self, base: int, path: str, first: int, end: int):
        self.base = base
        self.path = path
        self.first = first
        self.end = end


class _Bucket:
    """The file queue of one (topic, queue id): ``<root>/buckets/<topic>/<queue id>/<20-digit byte offset>``.

    ``positions[i]`` is the bucket byte offset of message i (offsets are message indexes, so a consumer resumes
    inside a partition). The writer holds ``lock``; readers use ``count``, ``positions`` and the partitions'
    ``end`` without it (the writer publishes ``count`` last).
    """

    def __init__(self, topic: str, queue_id: int, directory: str, partition_size: int):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.partition_size = partition_size
        self.lock = threading.Lock()
        self.partitions: List[_Partition] = []
        self.firsts: List[int] = []
        self.positions = array.array("q")
        self.count = 0
        self.active: Optional[MappedFile] = None
        self.last_ts = 0
        self.closed = False
        self.cut_frames = 0

    # -- recovery -------------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Map the partitions, walk their frames, index every whole frame and cut a torn tail (zeroed, so it is
        never read back). Raises CorruptStoreError for a bad partition size or a damaged frame followed by
        valid data in a later partition."""
        names = sorted(n for n in os.listdir(self.directory) if len(n) == 20 and is_decimal(n))
        size = self.partition_size
        for i, name in enumerate(names):
            path = os.path.join(self.directory, name)
            base = int(name)
            if base % size or (self.partitions and base != self.partitions[-1].base + size):
                raise CorruptStoreError(f"partition {path} does not follow the previous one (size {size})")
            fsize = os.path.getsize(path)
            if fsize != size:
                if interrupted_creation(i, len(names), fsize):
                    os.unlink(path)
                    break
                raise CorruptStoreError(f"partition {path} is {fsize} bytes, expected partition_size {size}")
            mf = MappedFile(path, size, base, create=False)
            try:
                with memoryview(mf) as view:
                    starts, stop, outcome = walk_frames(view, 0, size, True)
                    if starts:
                        hdr = view[starts[-1] : stop]
                        body_len = FRAME_BODY_LEN.unpack_from(hdr, FRAME_BODY_LEN_AT)[0]
                        self.last_ts = FRAME_STORE_TS.unpack_from(hdr, frame_store_ts_at(body_len))[0]
            except BaseException:
                mf.close()
                raise
            if outcome is Stop.TORN:
                later = names[i + 1 :]
                if any(self._has_frames(os.path.join(self.directory, n)) for n in later):
                    mf.close()
                    raise CorruptStoreError(
                        f"partition {path}: damaged frame at {stop} before valid data in later partitions"
                    )
                self.cut_frames += 1
                log.warning(
                    "bucket %s-%d: cutting a torn frame at byte %d of %s", self.topic, self.queue_id, stop, path
                )
                mf.zero_tail(stop)
                for n in later:
                    os.unlink(os.path.join(self.directory, n))
                if later:
                    fsync_dir(self.directory)
                names = names[: i + 1]
            self.partitions.append(_Partition(base, path, self.count, stop))
            self.firsts.append(self.count)
            self.positions.extend(base + s for s in starts)
            self.count += len(starts)
            if i == len(names) - 1:
                mf.set_positions(stop)
                self.active = mf
            else:
                mf.close()

    def _has_frames(self, path: str) -> bool:
        with open(path, "rb") as f:
            head = f.read(FRAME_OVERHEAD + 64)
        return len(head) >= 4 and head[:4] != b"\0\0\0\0"

    # -- write (under lock) ---------------------------------------------------------------------------------

    def roll(self) -> Tuple[MappedFile, Optional[MappedFile]]:
        """Create the next partition; returns (new active, the full one for the flush service)."""
        old = self.active
        base = self.partitions[-1].base + self.partition_size if self.partitions else 0
        if not os.path.isdir(self.directory):
            makedirs_durable(self.directory)
        path = os.path.join(self.directory, offset_to_file_name(base))
        mf = MappedFile(path, self.partition_size, base, create=True, reserve=True)
        fsync_dir(self.directory)
        self.partitions.append(_Partition(base, path, self.count, 0))
        self.firsts.append(self.count)
        self.active = mf
        return mf, old

    def close(self) -> None:
        with self.lock:
            self.closed = True
            mf, self.active = self.active, None
        if mf is not None:
            mf.flush(0)
            mf.close()


class _ReadFiles:
    """Read-only descriptors of partition files for ``os.pread``, at most ``capacity`` kept open (LRU).

    An entry evicted while a reader uses it is closed by that reader's ``release``. Thread-safe.
    """

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: "collections.OrderedDict[str, list]" = collections.OrderedDict()

    def acquire(self, path: str) -> list:
        with self._lock:
            e = self._open.get(path)
            if e is not None:
                self._open.move_to_end(path)
                e[1] += 1
                return e
            e = [os.open(path, os.O_RDONLY | os.O_CLOEXEC), 1, False]
            self._open[path] = e
            while len(self._open) > self.capacity:
                _, old = self._open.popitem(last=False)
                old[2] = True
                if old[1] == 0:
                    os.close(old[0])
            return e

    def release(self, e: list) -> None:
        with self._lock:
            e[1] -= 1
            if e[1] == 0 and e[2]:
                os.close(e[0])

    def close(self) -> None:
        with self._lock:
            for e in self._open.values():
                e[2] = True
                if e[1] == 0:
                    os.close(e[0])
            self._open.clear()


class EmbeddedFlushService(ServiceThread):
    """Flushes every bucket's active partition every ``flush_interval_ms`` (when it has ``flush_least_pages``
    dirty pages, or at every tenth round whatever it has), and flushes then unmaps partitions that filled up."""

    def __init__(self, mq: "EmbeddedMessageQueue"):
        super().__init__("EmbeddedFlushService")
        self.mq = mq
        self.flushes = 0
        self.unmapped = 0
        self.rounds = 0

    def run(self) -> None:
        mq = self.mq
        while not self.stopped:
            self.wait_for_running(mq.flush_interval_ms)
            try:
                self.run_once(thorough=self.rounds % 10 == 0)
            except OSError as e:
                self.errors += 1
                self.last_error = e
                log.error("embedded queue flush failed: %s", e)
            self.rounds += 1

    def run_once(self, thorough: bool = True) -> None:
        mq = self.mq
        with mq._full_lock:
            full, mq._full = mq._full, []
        for mf in full:
            mf.flush(0)
            mf.close()
            self.unmapped += 1
        least = 0 if thorough else mq.flush_least_pages
        for b in list(mq._buckets.values()):
            mf = b.active
            if mf is None:
                continue
            try:
                before = mf.flushed_position
                if mf.flush(least) != before:
                    self.flushes += 1
            except StoreClosedError:
                continue  # closed by close() meanwhile


class EmbeddedMessageQueue(ProcessBoundMixin, ProgressWaiterMixin, QueueClientsMixin):
    """One file queue per (topic, queue id) ("bucket"), each a directory of fixed-size memory-mapped partitions
    holding the simple frame (TOTALSIZE, MAGIC, BODY, HEADERS, PROPERTIES; see localmq._frame).

    Producers write their bucket directly (one lock per bucket); offsets are message indexes within a bucket, kept
    in memory by an index of frame positions that recovery rebuilds by walking the frames (cutting a torn one), so
    a consumer resumes inside a partition. EmbeddedFlushService flushes active partitions every
    ``flush_interval_ms`` and flushes then unmaps partitions that are full; reads go through ``pread``.

    Durability is the Local queue's ASYNC_FLUSH: a put returns when its frame is in the shared mapping (the page
    cache), so kill -9 loses no acknowledged message; a power loss may lose up to one flush interval. A ``lock``
    file refuses a second writer (StoreLockedError). Messages are never deleted (no retention).
    Committed consumer offsets persist in ``<root>/config/consumerOffset.json`` (RocketMQ's format).

    Many buckets mean many files written at once: sequential writes become random ones, which is why LocalMQ
    (and RocketMQ) moved to one CommitLog (see perf/test_queues_bench.py).

    Thread-safety: every method may be called from any thread; puts to one bucket are ordered by its lock.
    """

    def __init__(
        self,
        path,
        *,
        partition_size: int = 16 * 1024 * 1024,
        max_message_size: int = 4 * 1024 * 1024,
        flush_interval_ms: int = 500,
        flush_least_pages: int = 4,
        flush_consumer_offset_interval: int = 5000,
        max_open_read_files: int = 256,
    ):
        if not isinstance(partition_size, int) or partition_size < 4096 or partition_size > (1 << 31) - 1:
            raise ConfigError("partition_size must be an int between 4096 and 2 GiB - 1")
        if max_message_size <= 0:
            raise ConfigError("max_message_size must be positive")
        self.root = os.path.abspath(os.fspath(path))
        self.partition_size = partition_size
        self.max_message_size = max_message_size
        self.flush_interval_ms = flush_interval_ms
        self.flush_least_pages = flush_least_pages
        self.flush_consumer_offset_interval = flush_consumer_offset_interval
        self._closed = True
        self._buckets: Dict[Tuple[str, int], _Bucket] = {}
        self._lock = threading.Lock()  # creating buckets
        self._full_lock = threading.Lock()  # partitions handed to the flush service
        self._full: List[MappedFile] = []
        self._cond = threading.Condition(threading.Lock())
        self._waiters = 0
        self._progress = 0
        self._wakes = 0
        self._props_cache: Dict[Any, bytes] = {}
        self._files = _ReadFiles(max_open_read_files)
        check_writable_filesystem(self.root, missing_ancestor(self.root))
        os.makedirs(self.root, exist_ok=True)
        self._store_lock = StoreLock(self.root)
        self._service: Optional[EmbeddedFlushService] = None
        try:
            self._bucket_root = os.path.join(self.root, "buckets")
            if not os.path.isdir(self._bucket_root):
                makedirs_durable(self._bucket_root)
            self._load()
            self._service = EmbeddedFlushService(self)
            self._service.start()
        except BaseException:
            for b in self._buckets.values():
                b.close()
            self._store_lock.release()
            raise
        self._closed = False
        self._bind_to_process()

    def _consumer_offset_flush_interval_ms(self) -> int:
        return self.flush_consumer_offset_interval

    def _load(self) -> None:
        self.recovered_messages = 0
        self.cut_frames = 0
        for topic in sorted(os.listdir(self._bucket_root)):
            tdir = os.path.join(self._bucket_root, topic)
            if not os.path.isdir(tdir) or TOPIC_RE.match(topic) is None:
                log.warning("ignoring %s: not a topic directory", tdir)
                continue
            for q in sorted(os.listdir(tdir)):
                if not is_decimal(q) or int(q) > MAX_QUEUE_ID:
                    log.warning("ignoring %s: not a queue id", os.path.join(tdir, q))
                    continue
                b = _Bucket(topic, int(q), os.path.join(tdir, q), self.partition_size)
                self._buckets[(topic, int(q))] = b
                b.recover()
                self.recovered_messages += b.count
                self.cut_frames += b.cut_frames

    # -- state ----------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    @property
    def offset_store_path(self) -> str:
        return os.path.join(self.root, "config", "consumerOffset.json")

    def _bucket(self, topic: str, queue_id: int) -> _Bucket:
        key = (topic, queue_id)
        b = self._buckets.get(key)
        if b is None:
            check_topic(topic)
            check_queue_id(queue_id)
            with self._lock:
                b = self._buckets.get(key)
                if b is None:
                    b = _Bucket(
                        topic, queue_id, os.path.join(self._bucket_root, topic, str(queue_id)), self.partition_size
                    )
                    self._buckets[key] = b
        return b

    # -- put ------------------------------------------------------------------------------------------------

    def _props(self, tags, keys, properties) -> bytes:
        ck = (tags, keys) if properties is None and (keys is None or isinstance(keys, (str, tuple))) else None
        if ck is not None:
            p = self._props_cache.get(ck)
            if p is not None:
                return p
        d = build_properties(tags, keys, properties)
        from localmq._record import properties_to_bytes

        p = properties_to_bytes(d)
        if ck is not None and len(self._props_cache) < 1024:
            self._props_cache[ck] = p
        return p

    def _check_size(self, n: int, props_len: int) -> None:
        if n > self.max_message_size:
            raise MessageSizeError(f"body of {n} bytes exceeds max_message_size {self.max_message_size}")
        if frame_size(n, props_len) > self.partition_size:
            raise MessageSizeError(
                f"a frame of {frame_size(n, props_len)} bytes cannot fit a partition of {self.partition_size}"
            )

    def _published(self, n: int) -> None:
        self._progress += n
        if self._waiters:
            with self._cond:
                self._cond.notify_all()

    def _roll(self, b: _Bucket) -> MappedFile:
        """Next partition of ``b`` (caller holds b.lock); the full one goes to the flush service to be unmapped."""
        mf, old = b.roll()
        if old is not None:
            with self._full_lock:
                self._full.append(old)
            if self._service is not None:
                self._service.wakeup()
        return mf

    def _room(self, b: _Bucket, need: int) -> None:
        """Roll first unless ``need`` bytes fit the active partition (so a batch never spans two partitions and
        a failed creation writes nothing)."""
        mf = b.active
        if mf is None or mf.wrote_position + need > self.partition_size:
            self._roll(b)

    def _append(self, b: _Bucket, body, props: bytes, ts: int, now: int, flag: int) -> Tuple[int, int]:
        """Write one frame (caller holds b.lock and made room); returns (bucket byte offset, frame size)."""
        mf = b.active
        pos = mf.wrote_position
        end = write_frame(mf, pos, body, props, ts, now, flag)
        if end < 0:
            mf = self._roll(b)
            pos = 0
            end = write_frame(mf, 0, body, props, ts, now, flag)
        start = mf.file_from_offset + pos
        b.positions.append(start)
        b.partitions[-1].end = end
        return start, end - pos

    def put(
        self,
        topic: str,
        body,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ):
        """Append one message to its bucket. Returns PutResult (``physical_offset`` is the bucket byte offset,
        ``msg_id`` None).

        Status CREATE_MAPPED_FILE_FAILED (nothing written) when a partition cannot be created (ENOSPC...).
        Raises InvalidTopicError, InvalidQueueIdError, MessageSizeError, InvalidPropertyError,
        PropertiesSizeError, StoreClosedError.
        """
        if self._closed:
            raise self._closed_error()
        b = self._bucket(topic, queue_id)
        check_int_range(flag, "flag", -(1 << 31), (1 << 31) - 1)
        props = self._props(tags, keys, properties)
        n = body_length(body)
        self._check_size(n, len(props))
        now = int(time.time() * 1000)
        with b.lock:
            if b.closed:
                raise self._closed_error()
            try:
                self._room(b, frame_size(n, len(props)))
            except OSError as e:
                log.error("bucket %s-%d: cannot create a partition: %s", topic, queue_id, e)
                return make_put_result(_CREATE_FAILED, -1, -1, 0, 0, 0)
            ts = b.last_ts = now if now > b.last_ts else b.last_ts
            start, size = self._append(b, body, props, ts, now, flag)
            off = b.count
            b.count = off + 1
        self._published(1)
        return make_put_result(_PUT_OK, start, off, size, ts, 1)

    def put_batch(
        self,
        topic: str,
        bodies: Iterable,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys=None,
        properties: Optional[Dict[str, str]] = None,
        flag: int = 0,
    ):
        """Append several messages to one bucket under one lock (consecutive offsets, one store time)."""
        if self._closed:
            raise self._closed_error()
        b = self._bucket(topic, queue_id)
        check_int_range(flag, "flag", -(1 << 31), (1 << 31) - 1)
        props = self._props(tags, keys, properties)
        bodies = batch_bodies(bodies)
        total = 0
        need = 0
        for i, body in enumerate(bodies):
            n = body_length(body, f"bodies[{i}]")
            self._check_size(n, len(props))
            need += frame_size(n, len(props))
        now = int(time.time() * 1000)
        with b.lock:
            if b.closed:
                raise self._closed_error()
            try:
                # a batch that fits one partition is never split (larger ones roll between frames)
                self._room(b, need if need <= self.partition_size else frame_size(0, 0))
            except OSError as e:
                log.error("bucket %s-%d: cannot create a partition: %s", topic, queue_id, e)
                return make_put_result(_CREATE_FAILED, -1, -1, 0, 0, 0)
            ts = b.last_ts = now if now > b.last_ts else b.last_ts
            first_off = b.count
            first_start = -1
            for body in bodies:
                start, size = self._append(b, body, props, ts, now, flag)
                if first_start < 0:
                    first_start = start
                total += size
                b.count += 1
        self._published(len(bodies))
        return make_put_result(_PUT_OK, first_start, first_off, total, ts, len(bodies))

    # -- get ------------------------------------------------------------------------------------------------

    def _read(self, part: _Partition, start: int, end: int) -> bytes:
        e = self._files.acquire(part.path)
        try:
            return os.pread(e[0], end - start, start - part.base)
        finally:
            self._files.release(e)

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        *,
        tags: Optional[str] = None,
        zero_copy: bool = False,
    ) -> GetResult:
        """Pull up to ``max_messages`` (from one partition, at most 1 MiB unless one frame is larger) from
        ``offset``; statuses and ``next_begin_offset`` as the Local queue's. ``tags`` "a || b" keeps messages
        whose tag is one of them (a filtered pull looks at most 1024 frames).

        Raises StoreClosedError, InvalidQueueIdError, ValueError (max_messages < 1), ArgumentOverflowError
        (max_messages above MAX_GET_MESSAGES), CorruptFrameError.
        """
        if self._closed:
            raise self._closed_error()
        if max_messages < 1:
            raise ArgumentRangeError("max_messages must be at least 1", "max_messages")
        check_int_range(max_messages, "max_messages", 1, MAX_GET_MESSAGES)  # a C int below (ArgumentOverflowError)
        b = self._buckets.get((topic, queue_id))
        if b is None:
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        mx = b.count  # read first: everything below it is fully indexed
        if mx == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0)
        if offset < 0:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], 0, 0, mx)
        if offset == mx:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, 0, mx)
        if offset > mx:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], mx, 0, mx)
        names = tag_names(tags)
        firsts = b.firsts
        p = bisect.bisect_right(firsts, offset) - 1
        part = b.partitions[p]
        part_stop = firsts[p + 1] if p + 1 < len(firsts) else mx
        if part_stop > mx:
            part_stop = mx
        want = max_messages if names is None else max(max_messages, _SCAN_FRAMES)
        last = min(offset + want, part_stop)
        positions = b.positions
        start = positions[offset]
        if last < part_stop:
            end = positions[last]
        else:
            end = part.base + part.end
        if end - start > _READ_CAP:
            last = max(offset + 1, bisect.bisect_right(positions, start + _READ_CAP, offset + 1, last) - 1)
            end = positions[last] if last < part_stop else part.base + part.end
        data = self._read(part, start, end)
        msgs, scanned = read_frames(data, topic, queue_id, offset, start, max_messages, names, last - offset)
        status = GetStatus.FOUND if msgs else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, msgs, offset + scanned, 0, mx)

    def max_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        b = self._buckets.get((topic, queue_id))
        return b.count if b is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        return 0

    def _store_ts(self, b: _Bucket, idx: int) -> int:
        p = bisect.bisect_right(b.firsts, idx) - 1
        part = b.partitions[p]
        start = b.positions[idx]
        head = self._read(part, start, start + FRAME_BODY_AT)
        body_len = FRAME_BODY_LEN.unpack_from(head, FRAME_BODY_LEN_AT)[0]
        at = start + frame_store_ts_at(body_len)
        return FRAME_STORE_TS.unpack(self._read(part, at, at + FRAME_STORE_TS.size))[0]

    def offset_by_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """Offset of the first message stored at or after ``ts_ms`` (binary search over frame headers)."""
        self._check_open()
        b = self._buckets.get((topic, queue_id))
        if b is None:
            return 0
        lo, hi = 0, b.count
        while lo < hi:
            mid = (lo + hi) // 2
            if self._store_ts(b, mid) < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def topics(self) -> Dict[str, List[int]]:
        self._check_open()
        out: Dict[str, List[int]] = {}
        for (t, q), b in list(self._buckets.items()):
            if b.count or b.partitions:
                out.setdefault(t, []).append(q)
        return {t: sorted(qs) for t, qs in sorted(out.items())}

    # -- flush / close --------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Force every written frame to disk now."""
        self._check_open()
        for b in list(self._buckets.values()):
            mf = b.active
            if mf is not None:
                mf.flush(0)
        if self._service is not None:
            self._service.run_once(True)

    def stats(self) -> Dict[str, Any]:
        svc = self._service
        return {
            "buckets": len(self._buckets),
            "partitions": sum(len(b.partitions) for b in list(self._buckets.values())),
            "mapped_partitions": sum(1 for b in list(self._buckets.values()) if b.active is not None) + len(self._full),
            "messages": sum(b.count for b in list(self._buckets.values())),
            "recovered_messages": self.recovered_messages,
            "cut_frames": self.cut_frames,
            "flushes": svc.flushes if svc else 0,
            "unmapped_partitions": svc.unmapped if svc else 0,
            "service_errors": {svc.name: svc.errors} if svc else {},
        }

    def close(self) -> None:
        """Close consumers and producers, stop the flush service, flush and unmap every partition, release the
        lock. Idempotent."""
        if self._closed:
            return
        self._close_clients()
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        try:
            if self._service is not None:
                self._service.shutdown()
                self._service.run_once(True)
        finally:
            for b in self._buckets.values():
                b.close()
            self._files.close()
            self._store_lock.release()

    def __enter__(self) -> "EmbeddedMessageQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EmbeddedMessageQueue {self.root!r} {'closed' if self._closed else 'open'}>"
