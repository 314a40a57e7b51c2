"""ConsumerScheduler: which consumer of a group holds each (topic, queue) in clustering mode."""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

Bucket = Tuple[str, int]


class _Member:
    __slots__ = ("id", "topics", "retention_s", "last_seen", "owned")

    def __init__(self, cid: int, topics: FrozenSet[str], retention_s: float, now: float):
        self.id = cid
        self.topics = topics
        self.retention_s = retention_s
        self.last_seen = now
        self.owned: Dict[Bucket, int] = {}  # bucket -> epoch of the grant


class _Group:
    __slots__ = ("members", "owners", "epoch")

    def __init__(self):
        self.members: Dict[int, _Member] = {}
        self.owners: Dict[Bucket, Tuple[int, int]] = {}  # bucket -> (consumer id, epoch)
        self.epoch = 0


class Assignment:
    """What ``ConsumerScheduler.assign`` decided for one consumer: ``owned`` {bucket: epoch} after the call,
    ``granted`` (new to it), ``lost`` (taken from it while it did not poll: another consumer may own them now)
    and ``to_release`` (it holds more than its share: commit them, then ``release``)."""

    __slots__ = ("owned", "granted", "lost", "to_release")

    def __init__(self, owned, granted, lost, to_release):
        self.owned = owned
        self.granted = granted
        self.lost = lost
        self.to_release = to_release


class ConsumerScheduler:
    """Clustering mode: each (topic, queue) of a group is held by exactly one consumer at a time, so one producer's
    messages are consumed in order (LocalMQ's ConsumerScheduler).

    Membership is per process: every consumer of a group created from the same queue object in this process shares
    this scheduler (the store has one writer process, so there is no other). Heartbeats are polls. A consumer that
    closes releases its queues at once; one that stops polling keeps them for its ``consumer_retention_ms``, after
    which the next ``assign`` of another consumer of the group frees them and they are granted again under a new
    epoch. The old owner learns it at its next call (``lost``) and can no longer deliver from them: consumers check
    ``holds`` under ``lock`` at the moment they hand messages out, and a takeover also happens under ``lock``.

    Queues are balanced among the live consumers that subscribe the same topics: each gets ``n // k`` or
    ``n // k + 1`` of the ``n`` queues; a consumer over its share releases the extra ones at its next poll, after
    committing them (so the next owner resumes where it stopped).

    Thread-safety: every method may be called from any thread; ``lock`` is the one lock (consumers take it around
    delivery; under it a consumer may take its ``_ack_lock``, nothing else: ARCHITECTURE.md, Locks).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.lock = threading.RLock()
        self._groups: Dict[str, _Group] = {}
        self._clock = clock
        self._next_id = 0
        self.takeovers = 0

    def join(self, group: str, topics: Iterable[str], retention_ms: int) -> int:
        """Add a consumer to ``group``; returns its id."""
        with self.lock:
            self._next_id += 1
            cid = self._next_id
            g = self._groups.setdefault(group, _Group())
            g.members[cid] = _Member(cid, frozenset(topics), retention_ms / 1000.0, self._clock())
            return cid

    def leave(self, group: str, cid: int) -> None:
        """Remove a consumer and release every queue it holds (the caller committed what it delivered)."""
        with self.lock:
            g = self._groups.get(group)
            if g is None:
                return
            m = g.members.pop(cid, None)
            if m is not None:
                for b in m.owned:
                    if g.owners.get(b, (None,))[0] == cid:
                        del g.owners[b]
            if not g.members and not g.owners:
                del self._groups[group]

    def heartbeat(self, group: str, cid: int) -> None:
        """Mark the consumer alive now (a poll, or a poll still waiting)."""
        m = self._member(group, cid)
        if m is not None:
            m.last_seen = self._clock()

    def holds(self, group: str, cid: int, bucket: Bucket, epoch: int) -> bool:
        """True when ``cid`` still holds ``bucket`` under the grant ``epoch`` (call under ``lock`` to act on it)."""
        g = self._groups.get(group)
        return g is not None and g.owners.get(bucket) == (cid, epoch)

    def release(self, group: str, cid: int, buckets: Iterable[Bucket]) -> None:
        """Give queues back (after committing them) so that another consumer can take them."""
        with self.lock:
            g = self._groups.get(group)
            if g is None:
                return
            m = g.members.get(cid)
            for b in buckets:
                if g.owners.get(b, (None,))[0] == cid:
                    del g.owners[b]
                if m is not None:
                    m.owned.pop(b, None)

    def owners(self, group: str) -> Dict[Bucket, int]:
        """{bucket: consumer id} of the group now."""
        with self.lock:
            g = self._groups.get(group)
            return {} if g is None else {b: o[0] for b, o in g.owners.items()}

    def _member(self, group: str, cid: int) -> Optional[_Member]:
        g = self._groups.get(group)
        return None if g is None else g.members.get(cid)

    def _expire(self, g: _Group, now: float, me: int) -> None:
        for m in list(g.members.values()):
            if m.id != me and now - m.last_seen > m.retention_s and m.owned:
                # it stopped polling: its queues go to whoever asks next (new epochs). Its ``owned`` stays as it
                # was, so that its next assign reports them lost.
                for b in list(m.owned):
                    if g.owners.get(b, (None,))[0] == m.id:
                        del g.owners[b]
                        self.takeovers += 1

    @staticmethod
    def _held(g: _Group, m: _Member) -> int:
        return sum(1 for b, e in m.owned.items() if g.owners.get(b) == (m.id, e))

    def assign(
        self, group: str, cid: int, buckets: List[Bucket], retention_ms: int, topics: Iterable[str] = ()
    ) -> Assignment:
        """Heartbeat, free the queues of consumers past their retention, and balance ``buckets`` (the queues of
        this consumer's topics that exist now) for ``cid``. A consumer that had been expired is a member again."""
        with self.lock:
            now = self._clock()
            g = self._groups.setdefault(group, _Group())
            me = g.members.get(cid)
            if me is None:
                me = g.members[cid] = _Member(cid, frozenset(topics), retention_ms / 1000.0, now)
            me.last_seen = now
            lost = [b for b, e in me.owned.items() if g.owners.get(b) != (cid, e)]
            for b in lost:
                del me.owned[b]
            self._expire(g, now, cid)
            live = [
                m
                for m in g.members.values()
                if m.topics == me.topics and (m.id == cid or now - m.last_seen <= m.retention_s)
            ]
            k = max(1, len(live))
            n = len(buckets)
            low = n // k
            high = low + (1 if n % k else 0)
            mine = sorted(b for b in buckets if b in me.owned)
            starving = any(self._held(g, m) < low for m in live if m.id != cid)
            keep = low if starving else high
            to_release = mine[keep:] if len(mine) > keep else []
            granted = []
            room = keep - len(mine)
            if room > 0:
                for b in buckets:
                    if room <= 0:
                        break
                    if b not in g.owners:
                        g.epoch += 1
                        g.owners[b] = (cid, g.epoch)
                        me.owned[b] = g.epoch
                        granted.append(b)
                        room -= 1
            return Assignment(dict(me.owned), granted, lost, to_release)
