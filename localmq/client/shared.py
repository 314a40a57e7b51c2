"""Consumer groups and committed offsets shared by every process of a shared store (the control file's clients'
table): SharedClientTable, SharedConsumerScheduler, SharedOffsetManager."""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

from localmq._shm import OWNER_DIED, ControlFile
from localmq.client.offsets import Bucket, ConsumerOffsetManager
from localmq.client.scheduler import ConsumerScheduler, _Group, _Member
from localmq.errors import ArgumentRangeError
from localmq.layout import (
    CTL_C_ACTIVE,
    CTL_C_BUF,
    CTL_C_BUF_SIZE,
    CTL_C_LEN,
    CTL_C_VERSION,
    CTL_LOCK_BYTE_OFFSETS,
)
from localmq.store.config_json import write_config_json

log = logging.getLogger("localmq.client.shared")


class SharedClientTable:
    """One JSON document in the control file holding the consumer groups and committed offsets of every process.

    ``with table:`` takes this process's lock, then the control file's group lock (a robust mutex: a holder
    that dies leaves the last published document in force), and gives ``doc``; a change is published at the
    outermost exit by writing the inactive buffer and switching to it. Re-entrant within a thread. The parsed
    document is cached while the version word has not moved.
    """

    def __init__(self, ctl: ControlFile, lock_timeout: float = 10.0) -> None:
        self.ctl = ctl
        self.lock_timeout = lock_timeout
        self._local = threading.RLock()
        self._depth = 0
        self._version = -1
        self.doc: Dict[str, Any] = {}
        self.dirty = False
        self.loaded_hooks: list = []  # called with the document after it was (re)parsed
        self.saving_hooks: list = []  # called with the document before it is published

    def __enter__(self) -> Dict[str, Any]:
        self._local.acquire()
        if self._depth == 0:
            try:
                if self.ctl.group_lock.acquire(self.lock_timeout) == OWNER_DIED:
                    # the previous holder died: its unpublished change is gone, the published document stands
                    self.ctl.group_lock.consistent()
                    self._version = -1
                self._load()
            except BaseException:
                self._local.release()
                raise
        self._depth += 1
        return self.doc

    def __exit__(self, exc_type, exc, tb) -> None:
        self._depth -= 1
        try:
            if self._depth == 0:
                try:
                    if exc_type is None and self.dirty:
                        self._save()
                    elif exc_type is not None:
                        self._version = -1  # drop a half-made change: re-parse next time
                finally:
                    self.dirty = False
                    self.ctl.group_lock.release()
        finally:
            self._local.release()

    def _load(self) -> None:
        ctl = self.ctl
        v = ctl.load(CTL_C_VERSION)
        if v == self._version:
            return
        active = ctl.load(CTL_C_ACTIVE)
        n = ctl.load(CTL_C_LEN + 8 * active)
        doc = json.loads(ctl.read_bytes(CTL_C_BUF + active * CTL_C_BUF_SIZE, n)) if n else {}
        self.doc = doc
        self._version = v
        for hook in self.loaded_hooks:
            hook(doc)

    def _save(self) -> None:
        ctl = self.ctl
        for hook in self.saving_hooks:
            hook(self.doc)
        data = json.dumps(self.doc, separators=(",", ":")).encode()
        if len(data) > CTL_C_BUF_SIZE:
            self._version = -1
            raise ArgumentRangeError(
                f"the consumer groups and offsets of this shared store need {len(data)} bytes, "
                f"more than the control file's {CTL_C_BUF_SIZE}",
                argument="offsets",
            )
        nxt = 1 - ctl.load(CTL_C_ACTIVE)
        ctl.write_bytes(CTL_C_BUF + nxt * CTL_C_BUF_SIZE, data)
        ctl.store(CTL_C_LEN + 8 * nxt, len(data))
        v = ctl.load(CTL_C_VERSION) + 1
        ctl.store(CTL_C_VERSION, v)  # first: a death before the switch re-parses the old document, unchanged
        ctl.store(CTL_C_ACTIVE, nxt)
        self._version = v


class SharedConsumerScheduler(ConsumerScheduler):
    """ConsumerScheduler whose groups live in the clients' table: members of one group in different processes
    share its queues (each held by one member at a time), rebalance as members join and leave, and a member whose
    process died is dropped at once (its process slot is free), one that stopped polling after its retention.

    Same algorithm and interface as ConsumerScheduler; ``lock`` is the table (process lock + group lock). Times
    are CLOCK_MONOTONIC, the same clock in every process of the machine."""

    def __init__(self, table: SharedClientTable) -> None:
        super().__init__(time.monotonic)
        self.clients = table
        self.lock = table  # type: ignore[assignment]
        self._slots: Dict[str, Dict[int, int]] = {}  # group -> member id -> process slot
        table.loaded_hooks.append(self._from_doc)
        table.saving_hooks.append(self._to_doc)

    def _from_doc(self, doc: Dict[str, Any]) -> None:
        groups: Dict[str, _Group] = {}
        slots: Dict[str, Dict[int, int]] = {}
        for name, gd in doc.get("groups", {}).items():
            g = _Group()
            g.epoch = gd["epoch"]
            for cid_s, md in gd["members"].items():
                m = _Member(int(cid_s), frozenset(md["topics"]), md["retention_s"], md["last_seen"])
                m.owned = {(t, q): e for t, q, e in md["owned"]}
                g.members[m.id] = m
            g.owners = {(t, q): (c, e) for t, q, c, e in gd["owners"]}
            groups[name] = g
            slots[name] = {int(k): v for k, v in gd.get("slots", {}).items()}
        self._groups = groups
        self._slots = slots
        self._next_id = doc.get("next_member", 0)

    def _to_doc(self, doc: Dict[str, Any]) -> None:
        out = {}
        for name, g in self._groups.items():
            out[name] = {
                "epoch": g.epoch,
                "members": {
                    str(m.id): {
                        "topics": sorted(m.topics),
                        "retention_s": m.retention_s,
                        "last_seen": m.last_seen,
                        "owned": [[t, q, e] for (t, q), e in m.owned.items()],
                    }
                    for m in g.members.values()
                },
                "owners": [[t, q, c, e] for (t, q), (c, e) in g.owners.items()],
                "slots": {str(k): v for k, v in self._slots.get(name, {}).items() if k in g.members},
            }
        doc["groups"] = out
        doc["next_member"] = self._next_id

    def join(self, group: str, topics, retention_ms: int) -> int:
        with self.clients:
            cid = super().join(group, topics, retention_ms)
            self._slots.setdefault(group, {})[cid] = self.clients.ctl.slots.claim()
            self.clients.dirty = True
            return cid

    def leave(self, group: str, cid: int) -> None:
        with self.clients:
            super().leave(group, cid)
            self._slots.get(group, {}).pop(cid, None)
            self.clients.dirty = True

    def heartbeat(self, group: str, cid: int) -> None:
        with self.clients:
            super().heartbeat(group, cid)
            self.clients.dirty = True

    def holds(self, group: str, cid: int, bucket: Bucket, epoch: int) -> bool:
        with self.clients:
            return super().holds(group, cid, bucket, epoch)

    def release(self, group: str, cid: int, buckets) -> None:
        with self.clients:
            super().release(group, cid, buckets)
            self.clients.dirty = True

    def owners(self, group: str) -> Dict[Bucket, int]:
        with self.clients:
            return super().owners(group)

    def assign(self, group: str, cid: int, buckets, retention_ms: int, topics=()):
        with self.clients:
            a = super().assign(group, cid, buckets, retention_ms, topics)
            self._slots.setdefault(group, {}).setdefault(cid, self.clients.ctl.slots.claim())
            self.clients.dirty = True
            return a

    def _expire(self, g: _Group, now: float, me: int) -> None:
        # members of a process that died (its slot is free: the kernel dropped its lock) leave at once
        slots = self.clients.ctl.slots
        name = next((n for n, x in self._groups.items() if x is g), None)
        member_slots = self._slots.get(name, {}) if name is not None else {}
        for m in list(g.members.values()):
            slot = member_slots.get(m.id)
            if m.id != me and slot is not None and slot != slots.mine() and not slots.alive(slot):
                for b in list(m.owned):
                    if g.owners.get(b, (None,))[0] == m.id:
                        del g.owners[b]
                        self.takeovers += 1
                del g.members[m.id]
                member_slots.pop(m.id, None)
        super()._expire(g, now, me)


class SharedOffsetManager(ConsumerOffsetManager):
    """ConsumerOffsetManager over the clients' table: a commit from any process is seen by every process at once,
    and ``persist`` writes the whole shared table (never one process's view of it) to consumerOffset.json, one
    process at a time (an fcntl lock on a byte of the control file). The first process of a run loads the file
    into the table."""

    def __init__(
        self,
        table: SharedClientTable,
        path: Optional[str],
        flush_interval_ms: int = 5000,
        *,
        before_write: Optional[Callable[[], None]] = None,
    ) -> None:
        # parses the file: the table's first content
        super().__init__(path, flush_interval_ms, before_write=before_write)
        self.clients = table
        with table as doc:
            if "offsets" not in doc:
                doc["offsets"] = {k: {str(q): o for q, o in row.items()} for k, row in self._table.items()}
                doc["offsets_extra"] = self._extra
                table.dirty = True

    def commit(self, group: str, offsets: Dict[Bucket, int]) -> int:
        with self.clients as doc:
            table = doc.setdefault("offsets", {})
            changed = False
            for (topic, qid), off in offsets.items():
                row = table.setdefault(f"{topic}@{group}", {})
                if row.get(str(qid)) != off:
                    row[str(qid)] = off
                    changed = True
            if changed:
                self.clients.dirty = True
                with self._lock:
                    self._version += 1
            return self._version

    def query(self, group: str, topic: str, queue_id: int) -> Optional[int]:
        with self.clients as doc:
            row = doc.get("offsets", {}).get(f"{topic}@{group}")
            return None if row is None else row.get(str(queue_id))

    def group_offsets(self, group: str) -> Dict[Bucket, int]:
        suffix = "@" + group
        out = {}
        with self.clients as doc:
            for key, row in doc.get("offsets", {}).items():
                if key.endswith(suffix) and key.count("@") == 1:
                    for q, off in row.items():
                        out[(key[: -len(suffix)], int(q))] = off
        return out

    def table(self) -> Dict[str, Dict[int, int]]:  # type: ignore[override]
        with self.clients as doc:
            return {k: {int(q): o for q, o in row.items()} for k, row in doc.get("offsets", {}).items()}

    def persist(self, version: Optional[int] = None) -> bool:
        if self.path is None:
            return False
        target = self._version if version is None else version
        with self._persist_lock:
            if self._persisted >= target:
                return False
            v = self._version
            with self.clients as doc:
                table = {
                    k: dict(sorted(((int(q), o) for q, o in row.items())))
                    for k, row in sorted(doc.get("offsets", {}).items())
                }
                out = dict(doc.get("offsets_extra", {}))
            out["offsetTable"] = table
            if self.before_write is not None:
                # after the table was taken (as ConsumerOffsetManager.persist): every message its offsets cover, put
                # by any process, is made durable before the file says it was consumed
                self.before_write()
            ctl = self.clients.ctl
            deadline = time.monotonic() + 30.0
            while not ctl.range_lock(CTL_LOCK_BYTE_OFFSETS, 2):  # one writer of the file among the processes
                if time.monotonic() > deadline:
                    raise OSError(errno.EBUSY, "another process kept writing consumerOffset.json for 30 s", self.path)
                time.sleep(0.001)
            try:
                write_config_json(self.path, out)
            finally:
                ctl.range_lock(CTL_LOCK_BYTE_OFFSETS, 0)
            self._persisted = v
            self.persists += 1
            return True
