"""ClientState: what the producers and consumers of one queue object share (offsets, scheduler, numbering)."""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Dict, Optional, Set, Tuple

from localmq.client.offsets import ConsumerOffsetManager
from localmq.client.scheduler import ConsumerScheduler

log = logging.getLogger("localmq.client")


class ClientState:
    """One per queue object, created on first use by ``QueueClientsMixin``: the ConsumerOffsetManager (offsets in
    ``mq.offset_store_path``), the ConsumerScheduler of its groups, producer numbering and the consumers to close
    with the queue. Thread-safe."""

    def __init__(self, mq, flush_interval_ms: int = 5000):
        self.mq = mq
        backends = getattr(mq, "client_backends", None)
        if backends is not None:
            # a store shared between processes: groups and offsets live in its control file
            self.offsets, self.scheduler = backends(flush_interval_ms)
        else:
            # a store that can lose what it acknowledged (a power cut) makes what consumers read durable before
            # their offsets are written (LocalMessageQueue.flush_before_offsets)
            self.offsets = ConsumerOffsetManager(
                mq.offset_store_path, flush_interval_ms, before_write=getattr(mq, "flush_before_offsets", None)
            )
            self.scheduler = ConsumerScheduler()
        self.offsets.start()
        self._producer_seq = itertools.count()
        self._lock = threading.Lock()
        self._consumers: Set[object] = set()
        self._producers: Set[object] = set()
        self.closed = False

    def next_producer_slot(self) -> int:
        return next(self._producer_seq)

    def register(self, client, consumer: bool) -> None:
        with self._lock:
            if self.closed:
                from localmq.errors import StoreClosedError

                raise StoreClosedError("the queue is closed")
            (self._consumers if consumer else self._producers).add(client)

    def unregister(self, client) -> None:
        with self._lock:
            self._consumers.discard(client)
            self._producers.discard(client)

    def subscriptions(self, group: str) -> Set[str]:
        with self._lock:
            return {t for c in self._consumers if c.group == group for t in c.topics}

    def lag(self, group: str) -> Dict[Tuple[str, int], Optional[int]]:
        mq = self.mq
        committed = self.offsets.group_offsets(group)
        topics = {t for t, _ in committed} | self.subscriptions(group)
        existing = mq.topics()
        out: Dict[Tuple[str, int], Optional[int]] = {}
        for topic in sorted(topics):
            qids = set(existing.get(topic, ())) | {q for t, q in committed if t == topic}
            for qid in sorted(qids):
                c = committed.get((topic, qid))
                if c is None:
                    out[(topic, qid)] = None
                    continue
                mx = mq.max_offset(topic, qid)
                mn = mq.min_offset(topic, qid)
                out[(topic, qid)] = max(0, mx - max(c, mn))
        return out

    def close(self) -> None:
        """Close every consumer and producer (consumers commit as configured), then persist the offsets."""
        with self._lock:
            self.closed = True
            consumers = list(self._consumers)
            producers = list(self._producers)
        for c in consumers:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - the queue still closes; the error is logged
                log.exception("closing consumer %r", c)
        for p in producers:
            p.close()
        self.offsets.close()
