"""The settings record ``<root>/config/localmq.json``: the settings that shape a store's files, kept from its creation.

A store is created with a commit log segment size, a ConsumeQueue file size, an index geometry (and RocketMQ's
ConsumeQueueExt settings); its files only make sense with them. localmq writes them once, when it first opens the
store, and every later open takes them from there: a setting the caller did not pass comes from the record, one
the caller passed with another value raises StoreSettingsError naming both. A store without the record (written
by a RocketMQ broker or an older localmq) has its sizes read off its files (``infer_settings``), and the record is
written by the first open that may write. A record whose segment size contradicts the commit log segments (a
flipped digit still parses) is damaged: the segments win, and the record is written again by that open.

The record is JSON: ``{"version": 1, "settings": {"mapped_file_size_commit_log": 8192, ...}, "commit_log_start":
0}``; names are StoreConfig's. ``commit_log_start`` is where the commit log starts: the first segment's base when the
record was first written, moved by localmq's retention before it deletes segments. A first segment above it was
not deleted by localmq's retention (by hand, or lost): the open reports it (``RecoveryReport.missing_head``). It
is written atomically (a temporary file, fsync, rename, fsync of ``config/``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Collection, Dict, Optional, Tuple

from localmq._native import fdatasync, fsync_dir
from localmq.config import StoreConfig
from localmq.errors import ConfigError, CorruptStoreError, StoreSettingsError, io_operation
from localmq.layout import (
    COMMITLOG_DIR,
    CONFIG_DIR,
    CONSUMEQUEUE_DIR,
    CONSUMEQUEUE_EXT_DIR,
    CQ_UNIT_SIZE,
    INDEX_DIR,
    INDEX_NAME_DIGITS,
    SETTINGS_FILE,
    SETTINGS_VERSION,
    is_decimal,
)
from localmq.store.files import numbered_files
from localmq.store.index import geometry_from_content, index_file_size

log = logging.getLogger("localmq.store")

__all__ = [
    "FILE_SETTINGS",
    "settings_path",
    "read_settings",
    "infer_settings",
    "write_settings",
    "resolve_settings",
    "explicit_settings",
    "read_log_start",
    "write_log_start",
]

# The StoreConfig fields that shape the files (sizes of segments and queue files, the index geometry, RocketMQ's
# ConsumeQueueExt): a store must be opened with the values it was created with.
FILE_SETTINGS = (
    "mapped_file_size_commit_log",
    "mapped_file_size_consume_queue",
    "max_hash_slot_num",
    "max_index_num",
    "enable_consume_queue_ext",
    "mapped_file_size_consume_queue_ext",
    "bit_map_length_consume_queue_ext",
)
_DEFAULTS = StoreConfig()


def settings_path(root: str) -> str:
    """``<root>/config/localmq.json``."""
    return os.path.join(root, CONFIG_DIR, SETTINGS_FILE)


def read_settings(root: str) -> Optional[Dict[str, Any]]:
    """The settings recorded in ``config/localmq.json`` (only names of FILE_SETTINGS), or None without the file.

    Raises CorruptStoreError for a file that is not a record localmq wrote (bad JSON, a later version, a value of
    the wrong type), OSError when it cannot be read.
    """
    path = settings_path(root)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CorruptStoreError(
            f"settings record {path} is not JSON ({e}): restore it or remove it (the sizes are then read off the files)"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("settings"), dict) or type(doc.get("version")) is not int:
        raise CorruptStoreError(f"settings record {path} holds no version and settings")
    if doc["version"] > SETTINGS_VERSION:
        raise CorruptStoreError(
            f"settings record {path} is version {doc['version']}, written by a later localmq "
            f"(this one reads version {SETTINGS_VERSION})"
        )
    out: Dict[str, Any] = {}
    for name in FILE_SETTINGS:
        if name not in doc["settings"]:
            continue
        value = doc["settings"][name]
        if type(value) is not type(getattr(_DEFAULTS, name)):
            raise CorruptStoreError(
                f"settings record {path}: {name} is {value!r}, not a {type(getattr(_DEFAULTS, name)).__name__}"
            )
        out[name] = value
    return out


def _one_size(sizes: Collection[int]) -> Optional[int]:
    distinct = set(sizes)
    return distinct.pop() if len(distinct) == 1 else None


def _segment_size(directory: str) -> Optional[int]:
    """The segment size the commit log files were written with, or None when they do not tell it: every segment
    but the last has it; the last may be shorter (an interrupted creation, a cut tail)."""
    files = numbered_files(directory)
    if not files:
        return None
    size = _one_size([f.size for f in files[:-1]]) if len(files) > 1 else files[-1].size
    if not size or files[-1].size > size:
        return None
    if not 4096 <= size <= (1 << 31) - 8 or size % 8 or any(f.base % size for f in files):
        return None
    return size


def _queue_file_size(root: str) -> Optional[int]:
    """The one size of the non-empty files of every queue under ``root`` (ConsumeQueue or ConsumeQueueExt),
    or None when there are none or they differ."""
    sizes: set[int] = set()
    try:
        topics = os.listdir(root)
    except FileNotFoundError:
        return None
    for topic in topics:
        tdir = os.path.join(root, topic)
        if not os.path.isdir(tdir) or os.path.islink(tdir):
            continue
        for q in os.listdir(tdir):
            sizes.update(f.size for f in numbered_files(os.path.join(tdir, q)) if f.size > 0)
    return _one_size(sizes)


def infer_settings(root: str) -> Dict[str, Any]:
    """Settings read off the files of a store without a record: the commit log segment size (every segment has
    it), the ConsumeQueue file size, and when ConsumeQueueExt files exist, their size (with
    ``enable_consume_queue_ext``), and the index geometry when an index file's content tells it (a file of
    ``40 + 4 * slots + 20 * items`` bytes fits many: ``index.geometry_from_content``). Only what the files tell
    without ambiguity; never the ext bitmap length."""
    out: Dict[str, Any] = {}
    seg = _segment_size(os.path.join(root, COMMITLOG_DIR))
    if seg is not None:
        out["mapped_file_size_commit_log"] = seg
    cq = _queue_file_size(os.path.join(root, CONSUMEQUEUE_DIR))
    if cq is not None and cq % CQ_UNIT_SIZE == 0:
        out["mapped_file_size_consume_queue"] = cq
    ext = _queue_file_size(os.path.join(root, CONSUMEQUEUE_EXT_DIR))
    if ext is not None:
        out["enable_consume_queue_ext"] = True
        out["mapped_file_size_consume_queue_ext"] = ext
    geometry = _index_geometry(os.path.join(root, INDEX_DIR))
    if geometry is not None:
        out["max_hash_slot_num"], out["max_index_num"] = geometry
    return out


def _index_geometry(directory: str) -> Optional[Tuple[int, int]]:
    """The geometry of the newest index file that tells it (``geometry_from_content``): a broker configured with
    another ``maxHashSlotNum`` / ``maxIndexNum`` wrote them, and localmq's new files must have it too (RocketMQ
    maps every file at its configured size). None without such a file."""
    try:
        names = sorted(
            (n for n in os.listdir(directory) if len(n) == INDEX_NAME_DIGITS and is_decimal(n)), reverse=True
        )
    except FileNotFoundError:
        return None
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        if os.path.getsize(path) == index_file_size(_DEFAULTS.max_hash_slot_num, _DEFAULTS.max_index_num):
            return None  # RocketMQ's default geometry, localmq's default too
        geometry = geometry_from_content(path)
        if geometry is not None:
            return geometry
    return None


def read_log_start(root: str) -> Optional[int]:
    """The commit log offset the record says the log starts at (``commit_log_start``: the first segment's base
    when localmq first opened the store, moved by localmq's retention before it deletes segments), or None
    (no record, or one written before this was kept, or an unusable one: the open reports that)."""
    try:
        with open(settings_path(root), "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    value = doc.get("commit_log_start") if isinstance(doc, dict) else None
    return value if type(value) is int and value >= 0 else None


def write_log_start(root: str, offset: int) -> None:
    """Record that the commit log starts at ``offset`` (durably, atomically), keeping the record's settings.
    Retention calls it before it deletes the segments below ``offset``; nothing when the store has no record."""
    path = settings_path(root)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return
    except ValueError as e:
        raise CorruptStoreError(f"settings record {path} is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise CorruptStoreError(f"settings record {path} holds no version and settings")
    doc["commit_log_start"] = int(offset)
    _write_doc(root, doc)


def write_settings(root: str, config: StoreConfig, log_start: Optional[int] = None) -> str:
    """Write the FILE_SETTINGS of ``config`` to ``<root>/config/localmq.json`` atomically (temporary file, fsync,
    rename, fsync of the directory; ``config/`` is created when missing), with ``log_start`` as
    ``commit_log_start`` (None: the one the record has, if any). Returns the path. Raises StoreIOError."""
    doc: Dict[str, Any] = {"version": SETTINGS_VERSION, "settings": {n: getattr(config, n) for n in FILE_SETTINGS}}
    start = log_start if log_start is not None else read_log_start(root)
    if start is not None:
        doc["commit_log_start"] = start
    return _write_doc(root, doc)


def _write_doc(root: str, doc: Dict[str, Any]) -> str:
    cdir = os.path.join(root, CONFIG_DIR)
    if not os.path.isdir(cdir):
        with io_operation("mkdir", cdir):
            os.makedirs(cdir)
        fsync_dir(root)
    path = settings_path(root)
    tmp = path + ".tmp"
    with io_operation("write", tmp), open(tmp, "wb") as f:
        f.write(json.dumps(doc, indent=2).encode() + b"\n")
        f.flush()
        fdatasync(f.fileno(), full=True, path=tmp)
    with io_operation("rename", tmp):
        os.replace(tmp, path)
    fsync_dir(cdir)
    return path


def explicit_settings(config: Optional[StoreConfig], kwargs: Collection[str]) -> frozenset[str]:
    """The FILE_SETTINGS a caller chose: the keyword arguments given to open, or, for a StoreConfig object, its
    fields that differ from the defaults (a field left at its default cannot be told from one set to it)."""
    if config is None:
        return frozenset(n for n in kwargs if n in FILE_SETTINGS)
    return frozenset(n for n in FILE_SETTINGS if getattr(config, n) != getattr(_DEFAULTS, n))


def resolve_settings(root: str, config: StoreConfig, explicit: Collection[str]) -> Tuple[StoreConfig, bool]:
    """The config to open ``root`` with, and whether the record must be written (it is missing or incomplete).

    Settings the caller did not choose (not in ``explicit``) come from the record, else from the files; a chosen
    one that differs raises StoreSettingsError. Reads only: nothing is written here.
    Raises CorruptStoreError for an unusable record, ConfigError when a recorded value is not a valid setting.
    """
    recorded = read_settings(root)
    source = "record" if recorded is not None else "files"
    known = recorded if recorded is not None else infer_settings(root)
    rewrite = False
    if recorded is not None and "mapped_file_size_commit_log" in recorded:
        # the segments are what the data was written with: a record that contradicts them is damaged (a flipped
        # digit still parses). The files win, and the record is written again once the store is open
        seg = _segment_size(os.path.join(root, COMMITLOG_DIR))
        if seg is not None and seg != recorded["mapped_file_size_commit_log"]:
            log.error(
                "settings record %s says mapped_file_size_commit_log=%d, but the commit log segments are %d "
                "bytes: the record is damaged; opening with %d and writing the record again",
                settings_path(root),
                recorded["mapped_file_size_commit_log"],
                seg,
                seg,
            )
            known = {**recorded, "mapped_file_size_commit_log": seg}
            rewrite = True
    for name, value in known.items():
        given = getattr(config, name)
        if name in explicit and given != value:
            where = settings_path(root) if recorded is not None else f"the files of {root}"
            raise StoreSettingsError(
                f"{name}={given!r} was passed, but {where} say{'s' if recorded is not None else ''} the store has "
                f"{name}={value!r}: open it without {name} (or with {name}={value!r})",
                setting=name,
                recorded=value,
                given=given,
                source=source,
            )
    changes = {n: v for n, v in known.items() if getattr(config, n) != v}
    if changes:
        try:
            config = dataclasses.replace(config, **changes)
        except ConfigError as e:
            raise ConfigError(f"the settings of {root} ({source}) are not valid: {e}") from None
    return config, rewrite or recorded is None or any(n not in recorded for n in FILE_SETTINGS)
