"""What every ``localmq`` command shares: exit codes, errors, output, progress, opening a store."""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import localmq
from localmq.errors import CorruptStoreError, NotAStoreError, StoreLockedError
from localmq.layout import CONSUMEQUEUE_DIR, is_decimal
from localmq.queues.readonly import _lock_holder  # the read-only view's F_GETLK probe (takes no lock)
from localmq.store.control_view import ControlView
from localmq.store.files import StoreFiles, numbered_files
from localmq.store.settings import read_settings

EXIT_OK, EXIT_FOUND_NOTHING, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3
EXIT_DAMAGE = 1
EXIT_UNKNOWN_FORMAT = 4  # verify: no damage, but records of a format localmq does not know (README, Recovery)
_CHUNK = 16 << 20  # bytes walked between two progress updates


class CliError(Exception):
    """A failure reported as one line on stderr (never a traceback) with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FOUND_NOTHING):
        super().__init__(message)
        self.code = code


# -- argument types (a bad value is a usage error: exit code 2) -------------------------------------------------


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {v}")
        return v

    parse.__name__ = "integer"
    return parse


def _time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 date/time (local time unless it names a zone)."""
    if is_decimal(text):
        return int(text)
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ms since the epoch nor an ISO 8601 time: {text!r}") from None


def _iso(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


# -- output ---------------------------------------------------------------------------------------------------


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=False) + "\n")


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _message_dict(m) -> Dict[str, Any]:
    body = bytes(m.body)
    try:
        text: Optional[str] = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "physical_offset": m.physical_offset,
        "store_size": m.store_size,
        "store_timestamp": m.store_timestamp,
        "born_timestamp": m.born_timestamp,
        "msg_id": m.msg_id,
        "tags": m.tags,
        "keys": list(m.keys),
        "properties": m.properties,
        "body": text,
        "body_base64": base64.b64encode(body).decode("ascii"),
    }


def _message_line(m, body_bytes: int) -> str:
    body = bytes(m.body)
    shown = repr(body[:body_bytes]) + ("..." if len(body) > body_bytes else "")
    return (
        f"{m.physical_offset:>12} {m.topic}/{m.queue_id}@{m.queue_offset} {_iso(m.store_timestamp)} "
        f"size={m.store_size} tags={m.tags!r} keys={list(m.keys)} body={shown}"
    )


def _show_message(args, m) -> None:
    if args.json:
        _emit(_message_dict(m))
    else:
        _say(_message_line(m, args.body_bytes))


class _Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal (and not --json / --no-progress)."""

    def __init__(self, args, label: str, total: int):
        self.on = not args.json and not getattr(args, "no_progress", False) and total > 0 and sys.stderr.isatty()
        self.label, self.total, self.last = label, total, 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.on and now - self.last >= 0.2:
            self.last = now
            frac = min(1.0, done / self.total)
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}%")
            sys.stderr.flush()

    def done(self) -> None:
        if self.on and self.last:
            sys.stderr.write("\r" + " " * (len(self.label) + 40) + "\r")
            sys.stderr.flush()


# -- opening a store ------------------------------------------------------------------------------------------


def _files(path: str) -> StoreFiles:
    try:
        files = StoreFiles(path)
        if not files.segments:
            # no segment to read the size off yet: the size the store was created with is in config/localmq.json
            recorded = read_settings(files.root) or {}
            if recorded.get("mapped_file_size_commit_log"):
                files = StoreFiles(path, recorded["mapped_file_size_commit_log"])
        return files
    except NotAStoreError as e:
        raise CliError(f"{path}: {e.strerror}") from None
    except CorruptStoreError as e:
        raise CliError(f"{path}: {e}", EXIT_DAMAGE) from None


def _cq_file_size(root: str) -> Optional[int]:
    cq_root = os.path.join(root, CONSUMEQUEUE_DIR)
    size = 0
    for t in os.listdir(cq_root) if os.path.isdir(cq_root) else ():
        tdir = os.path.join(cq_root, t)
        for q in os.listdir(tdir) if os.path.isdir(tdir) else ():
            size = max([size] + [f.size for f in numbered_files(os.path.join(tdir, q))])
    return size or None


def _open(path: str):
    """A ReadOnlyMessageQueue of ``path`` with the segment sizes its files have (it locks and writes nothing)."""
    files = _files(path)
    # sizes read off the files; a store without segments yet has them in config/localmq.json (the open reads it)
    sizes: Dict[str, int] = {"mapped_file_size_commit_log": files.segment_size} if files.segments else {}
    cq = _cq_file_size(files.root)
    if cq:
        sizes["mapped_file_size_consume_queue"] = cq
    try:
        return localmq.open(path, read_only=True, **sizes)
    except StoreLockedError:
        raise CliError(
            f"{os.path.abspath(path)} is held by one live process alone (opened with shared=False): "
            "its end is in that process's memory. Open it with shared=True there to look inside while "
            "it runs, or wait until it closes; `dump` and `verify` read the files alone.",
            EXIT_BUSY,
        ) from None
    except (CorruptStoreError, NotAStoreError) as e:
        raise CliError(f"{path}: {e}") from None


def _queue_offsets(mq) -> List[Tuple[str, int, int, int]]:
    """(topic, queue id, min offset, max offset) of every queue."""
    return [(t, q, mq.min_offset(t, q), mq.max_offset(t, q)) for t, qs in mq.topics().items() for q in qs]


def _lock_state(root: str) -> str:
    """ "closed", "shared by live processes" or "held by one live process" (asked without taking a lock)."""
    view = ControlView.open(root)
    if view is not None:
        view.close()
        return "live, shared"
    return "live, held by one process" if _lock_holder(root) == "exclusive" else "closed"
