"""ConsumerOffsetManager: committed offsets per group / topic / queue, persisted as RocketMQ's consumerOffset.json."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Optional, Tuple

from localmq.services.service_thread import ServiceThread
from localmq.store.config_json import read_offset_table, write_config_json

log = logging.getLogger("localmq.client.offsets")

Bucket = Tuple[str, int]


class ConsumerOffsetManager:
    """Committed offsets: ``{"topic@group": {queue_id: next offset to consume}}``, RocketMQ's offsetTable.

    With a ``path`` (``<root>/config/consumerOffset.json``) the table is loaded at creation and written back in
    RocketMQ's format (unquoted int keys; temp file + fsync + rename, the previous file kept as ``.bak``): by
    ``persist()`` (``commit(durable=True)`` of a consumer calls it), by a service thread every
    ``flush_interval_ms`` when something changed, and by ``close()``. Entries of groups this process never touches
    are kept as they were. Retention (localmq.services.clean) reads the same file to protect unconsumed messages.

    ``before_write`` (the store's ``flush_before_offsets``) is called before each write of the file: it makes every
    message a consumer may have read durable first, so that after a power cut a committed offset never points past
    the messages that survived (else, once new puts reuse the lost offsets, the group would skip them).

    Thread-safety: every method may be called from any thread. Lock order: ARCHITECTURE.md, Locks.
    Concurrent ``persist()`` calls share one write (a caller whose change another write already covered returns
    at once), as RocketMQ's group commit does for messages.
    """

    def __init__(
        self, path: Optional[str], flush_interval_ms: int = 5000, *, before_write: Optional[Callable[[], None]] = None
    ):
        self.path = path
        self.flush_interval_ms = flush_interval_ms
        self.before_write = before_write
        self._lock = threading.Lock()  # the table and the version counters
        self._persist_lock = threading.Lock()  # one writer of the file at a time
        self._table: Dict[str, Dict[int, int]] = {}
        self._extra: Dict[str, object] = {}
        self._version = 0
        self._persisted = 0
        self.persists = 0
        self.persist_errors = 0
        if path is not None:
            self._table, self._extra = read_offset_table(path)
        self._service: Optional[_PersistService] = None

    def start(self) -> None:
        """Start the periodic persist thread (nothing to do without a path)."""
        if self.path is not None and self._service is None:
            self._service = _PersistService(self)
            self._service.start()

    # -- table --------------------------------------------------------------------------------------------------

    def commit(self, group: str, offsets: Dict[Bucket, int]) -> int:
        """Record ``{(topic, queue id): next offset}`` for ``group``; returns the table version that holds them
        (pass it to ``persist`` to make exactly these durable)."""
        with self._lock:
            changed = False
            for (topic, qid), off in offsets.items():
                row = self._table.setdefault(f"{topic}@{group}", {})
                if row.get(qid) != off:
                    row[qid] = off
                    changed = True
            if changed:
                self._version += 1
            return self._version

    def query(self, group: str, topic: str, queue_id: int) -> Optional[int]:
        """The committed offset, or None when the group never committed that queue."""
        row = self._table.get(f"{topic}@{group}")
        return None if row is None else row.get(queue_id)

    def group_offsets(self, group: str) -> Dict[Bucket, int]:
        """Every committed offset of ``group``: {(topic, queue id): offset}."""
        out = {}
        suffix = "@" + group
        with self._lock:
            for key, row in self._table.items():
                if key.endswith(suffix) and key.count("@") == 1:
                    topic = key[: -len(suffix)]
                    for qid, off in row.items():
                        out[(topic, qid)] = off
        return out

    def table(self) -> Dict[str, Dict[int, int]]:
        """A copy of the whole offsetTable."""
        with self._lock:
            return {k: dict(v) for k, v in self._table.items()}

    @property
    def dirty(self) -> bool:
        return self._version != self._persisted

    # -- persistence --------------------------------------------------------------------------------------------

    def persist(self, version: Optional[int] = None) -> bool:
        """Write the table durably if it changed since the last write (or if ``version`` is not yet written).

        Returns True when this call wrote the file. Raises OSError when the write (or ``before_write``) fails (the
        table stays dirty).
        """
        if self.path is None:
            return False
        target = self._version if version is None else version
        with self._persist_lock:
            if self._persisted >= target:
                return False
            with self._lock:
                v = self._version
                doc = dict(self._extra)
                doc["offsetTable"] = {k: dict(sorted(row.items())) for k, row in sorted(self._table.items())}
            if self.before_write is not None:
                # after the table was taken: every message its offsets cover was read, so it is in the log now
                self.before_write()
            write_config_json(self.path, doc)
            self._persisted = v
            self.persists += 1
            return True

    def close(self) -> None:
        """Stop the persist thread and write what changed."""
        svc, self._service = self._service, None
        if svc is not None:
            svc.shutdown()
        self.persist()


class _PersistService(ServiceThread):
    """Writes consumerOffset.json every ``flush_interval_ms`` when the table changed (BrokerConfig's
    flushConsumerOffsetInterval)."""

    def __init__(self, manager: ConsumerOffsetManager):
        super().__init__("ConsumerOffsetPersistService")
        self.manager = manager

    def run(self) -> None:
        m = self.manager
        while not self.stopped:
            self.wait_for_running(m.flush_interval_ms)
            if self.stopped:
                break
            try:
                m.persist()
            except OSError as e:
                # kept dirty: the next round (or close) tries again
                self.errors += 1
                self.last_error = e
                m.persist_errors += 1
                log.error("persisting consumer offsets to %s failed: %s", m.path, e)
