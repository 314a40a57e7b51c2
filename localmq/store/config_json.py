"""Read and write RocketMQ's fastjson config files: tab-indented JSON whose integer map keys are unquoted."""

import enum
import json
import logging
import math
import numbers
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn, cast, overload

if TYPE_CHECKING:  # typeshed declares scanstring only in _json, which json.decoder re-exports
    from _json import scanstring
else:
    from json.decoder import scanstring

from localmq._native import fdatasync, fsync_dir
from localmq.errors import CorruptStoreError, NotAStoreError, io_operation

__all__ = ["loads", "dumps", "read_config_json", "write_config_json", "read_offset_table"]

log = logging.getLogger(__name__)

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)")
_LITERALS = (("true", True), ("false", False), ("null", None))
_MISSING = object()


# ---------------------------------------------------------------------------------------------- parsing


class _Parser:
    """Recursive-descent reader of one JSON document that also accepts bare integer object keys.

    Keys are recognised only where a key may start (after ``{`` or ``,`` inside an object), so text inside
    string literals is never mistaken for a key: string literals are consumed whole by ``scanstring``.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, msg: str, pos: int) -> NoReturn:
        raise json.JSONDecodeError(msg, self.text, pos)

    def skip(self, pos: int) -> int:
        return cast(re.Match[str], _WS.match(self.text, pos)).end()  # _WS matches the empty string: never None

    def value(self, pos: int) -> tuple[Any, int]:
        text = self.text
        pos = self.skip(pos)
        if pos >= len(text):
            self.fail("expected a value", pos)
        ch = text[pos]
        if ch == "{":
            return self.obj(pos + 1)
        if ch == "[":
            return self.array(pos + 1)
        if ch == '"':
            return scanstring(text, pos + 1, False)
        for word, val in _LITERALS:
            if text.startswith(word, pos):
                return val, pos + len(word)
        m = _NUMBER.match(text, pos)
        if m is None:
            self.fail("expected a value", pos)
        if m.group(1) or m.group(2):
            return float(m.group()), m.end()
        return int(m.group()), m.end()

    def key(self, pos: int) -> tuple[str | int, int]:
        text = self.text
        if text[pos] == '"':
            return scanstring(text, pos + 1, False)
        m = _INT_KEY.match(text, pos)
        if m is None:
            self.fail("expected a quoted or integer key", pos)
        return int(m.group()), m.end()

    def obj(self, pos: int) -> tuple[dict[str | int, Any], int]:
        text = self.text
        out: dict[str | int, Any] = {}
        pos = self.skip(pos)
        if text.startswith("}", pos):
            return out, pos + 1
        while True:
            pos = self.skip(pos)
            if pos >= len(text):
                self.fail("unterminated object", pos)
            if text[pos] == "}":  # a trailing comma, which fastjson also accepts
                return out, pos + 1
            k, pos = self.key(pos)
            pos = self.skip(pos)
            if not text.startswith(":", pos):
                self.fail("expected ':' after a key", pos)
            out[k], pos = self.value(pos + 1)
            pos = self.skip(pos)
            if text.startswith(",", pos):
                pos += 1
            elif text.startswith("}", pos):
                return out, pos + 1
            else:
                self.fail("expected ',' or '}'", pos)

    def array(self, pos: int) -> tuple[list[Any], int]:
        text = self.text
        out: list[Any] = []
        pos = self.skip(pos)
        if text.startswith("]", pos):
            return out, pos + 1
        while True:
            item, pos = self.value(pos)
            out.append(item)
            pos = self.skip(pos)
            if text.startswith(",", pos):
                pos += 1
            elif text.startswith("]", pos):
                return out, pos + 1
            else:
                self.fail("expected ',' or ']'", pos)


def loads(text: str | bytes | bytearray | memoryview) -> Any:
    """Parse RocketMQ config JSON, accepting unquoted integer map keys such as ``{0:250,1:250}``.

    :param text: the document (str, or UTF-8 bytes).
    :returns: the decoded value; objects become dicts in document order, and bare integer keys become ints
        (quoted keys stay str, so ``{"0":1}`` and ``{0:1}`` stay distinguishable).
    :raises json.JSONDecodeError: (a ValueError) for text that is not such a document.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    if text.startswith("\ufeff"):
        text = text[1:]
    parser = _Parser(text)
    try:
        value, pos = parser.value(0)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    pos = parser.skip(pos)
    if pos != len(text):
        parser.fail("extra data after the document", pos)
    return value


# ---------------------------------------------------------------------------------------------- writing


def _dump(value: object, level: int, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, enum.Enum):
        out.append(json.dumps(value.name, ensure_ascii=False))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, numbers.Integral):
        out.append(str(int(value)))
    elif isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise ValueError(f"cannot write a non-finite number: {f!r}")
        out.append(repr(f))
    elif isinstance(value, Mapping):
        _dump_map(value, level, out)
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = "\n" + "\t" * (level + 1)
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            out.append(inner)
            _dump(item, level + 1, out)
        out.append("\n" + "\t" * level + "]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as config JSON")


def _dump_map(mapping: Mapping[Any, Any], level: int, out: list[str]) -> None:
    # fastjson drops null-valued entries; string keys start a new indented line, while integer keys follow
    # the previous entry on the same line (the `{0:250,1:250\n\t\t}` shape of consumerOffset.json).
    items = [(k, v) for k, v in mapping.items() if v is not None]
    if not items:
        out.append("{}")
        return
    inner = "\n" + "\t" * (level + 1)
    out.append("{")
    for i, (k, v) in enumerate(items):
        if i:
            out.append(",")
        if isinstance(k, str):
            out.append(inner)
            out.append(json.dumps(k, ensure_ascii=False))
        elif isinstance(k, numbers.Integral) and not isinstance(k, bool):
            out.append(str(int(k)))
        elif isinstance(k, enum.Enum):
            out.append(inner)
            out.append(json.dumps(k.name, ensure_ascii=False))
        else:
            raise TypeError(f"config JSON keys must be str or int, not {type(k).__name__}")
        out.append(":")
        _dump(v, level + 1, out)
    out.append("\n" + "\t" * level + "}")


def dumps(obj: object) -> str:
    """Serialise ``obj`` the way RocketMQ's fastjson ``toJSONString(obj, prettyFormat=true)`` lays it out.

    Tabs for indentation, no space after ``:``, no trailing newline, ``{}`` / ``[]`` when empty, int dict keys
    unquoted and kept on the line of the previous entry, entries whose value is None left out, enums written
    as their names. Dict keys are written in the order given: fastjson writes bean fields alphabetically, so
    callers that build a bean (a topic config, a subscription group) must pass its fields sorted by name;
    table maps keep their own order.

    :param obj: dicts (str or int keys), lists / tuples, str, int, float, bool, None, Enum.
    :returns: the text (str).
    :raises TypeError: for a value or key type that config JSON cannot hold.
    :raises ValueError: for NaN or infinity.
    """
    out: list[str] = []
    _dump(obj, 0, out)
    return "".join(out)


# ---------------------------------------------------------------------------------------------- files


def _parse_file(path: str) -> tuple[Any, str | None]:
    """Return (value, None) or (None, reason) for one candidate file; FileNotFoundError propagates."""
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.strip():
        return None, "empty"
    try:
        return loads(raw), None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return None, f"unparsable ({exc})"


def read_config_json(path: str | os.PathLike[str], *, default: Any = _MISSING) -> Any:
    """Load a RocketMQ config file, falling back to ``<path>.bak`` as the broker does.

    The backup is used when the main file is missing, empty or cannot be parsed (a warning is logged).

    :param path: the config file, e.g. ``<root>/config/consumerOffset.json``.
    :param default: returned when neither the file nor its backup exists; without it that case raises.
    :returns: the decoded document (see ``loads``).
    :raises NotAStoreError: (a FileNotFoundError) when neither file exists and no default is given.
    :raises CorruptStoreError: when no existing candidate is usable (empty or unparsable).
    """
    path = os.fspath(path)
    bak = path + ".bak"
    problems: list[tuple[str, str]] = []
    for candidate in (path, bak):
        try:
            value, problem = _parse_file(candidate)
        except FileNotFoundError:
            problems.append((candidate, "missing"))
            continue
        if problem is None:
            if problems:
                log.warning("config %s is %s; loaded the backup %s", path, problems[0][1], bak)
            return value
        problems.append((candidate, problem))
    if all(p == "missing" for _, p in problems):
        if default is not _MISSING:
            return default
        raise NotAStoreError(2, "no config file and no backup", path)
    detail = "; ".join(f"{p}: {why}" for p, why in problems)
    raise CorruptStoreError(f"config {path} and its backup are unusable: {detail}")


def _offset(value: object) -> int | None:
    """An offset of an offsetTable as an int (fastjson writes longs; a float with no fraction is taken), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


@overload
def read_offset_table(
    path: str | os.PathLike[str], *, key_type: type[str] = ...
) -> tuple[dict[str, dict[int, int]], dict[str, Any]]: ...
@overload
def read_offset_table(
    path: str | os.PathLike[str], *, key_type: type[int]
) -> tuple[dict[int, int], dict[str, Any]]: ...
def read_offset_table(
    path: str | os.PathLike[str], *, key_type: type[str] | type[int] = str
) -> tuple[dict[Any, Any], dict[str, Any]]:
    """The ``offsetTable`` of a RocketMQ offsets file (``consumerOffset.json``: ``{"topic@group": {queueId: offset}}``;
    ``delayOffset.json``: ``{level: offset}``, with ``key_type=int``) and the document's other members.

    A missing file (and backup) gives ``({}, {})``. Every queue id and offset must be an integer (fastjson writes
    longs; a RocketMQ broker fails on anything else too).

    :returns: ``(table, extra)``.
    :raises CorruptStoreError: (a ValueError) for a file and backup that do not parse, an ``offsetTable`` that is not
        an object, or an entry that is not an integer (``null``, a string...), naming the file, the entry and what
        is expected.
    """
    doc = read_config_json(path, default=None)
    if doc is None:
        return {}, {}
    if not isinstance(doc, dict):
        raise CorruptStoreError(f"{path}: expected a JSON object with an offsetTable, found {type(doc).__name__}")
    table = doc.get("offsetTable")
    extra = {k: v for k, v in doc.items() if k != "offsetTable"}
    if table is None:
        return {}, extra
    if not isinstance(table, dict):
        raise CorruptStoreError(f"{path}: offsetTable must be an object, not {type(table).__name__}")
    out: dict[Any, Any] = {}
    for key, row in table.items():
        if key_type is int:
            k, v = _offset(key), _offset(row)
            if k is None or v is None:
                raise CorruptStoreError(
                    f"{path}: offsetTable entry {key!r}: {json.dumps(row)} is not an integer "
                    f"level and offset; fix or remove the entry"
                )
            out[k] = v
            continue
        if not isinstance(key, str) or not isinstance(row, dict):
            raise CorruptStoreError(
                f'{path}: offsetTable entry {key!r} must map "topic@group" to an object of '
                f"queue id: offset, not {json.dumps(row)}"
            )
        queues: dict[int, int] = {}
        for q, o in row.items():
            qid, off = _offset(q), _offset(o)
            if qid is None or off is None:
                raise CorruptStoreError(
                    f"{path}: offsetTable[{key!r}][{q!r}] is {json.dumps(o)}, not an integer "
                    f"offset; fix or remove the entry (the group then starts that queue afresh)"
                )
            queues[qid] = off
        out[key] = queues
    return out, extra


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_synced(path: str, data: bytes) -> None:
    with io_operation("open", path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with io_operation("write", path):
            _write_all(fd, data)
        fdatasync(fd, path=path)
    finally:
        os.close(fd)


def write_config_json(path: str | os.PathLike[str], obj: object) -> None:
    """Durably replace a config file, keeping the previous content in ``<path>.bak``.

    Steps: write ``<path>.tmp`` and fsync it; copy the current file (if any) to ``<path>.bak`` and fsync it;
    rename the tmp file over ``path``; fsync the directory. A crash at any point leaves either the old or the
    new document readable through ``read_config_json``. One writer per file at a time: callers serialise
    writes of the same file (RocketMQ's ``persist`` is synchronized too); readers need no lock.

    :param path: the config file; missing parent directories are created.
    :param obj: the document, serialised with ``dumps``.
    :raises TypeError, ValueError: from ``dumps`` (nothing is written then).
    :raises StoreIOError: (an OSError) naming the file when a write, sync or rename fails.
    """
    path = os.fspath(path)
    data = dumps(obj).encode("utf-8")
    parent = os.path.dirname(os.path.abspath(path))
    with io_operation("mkdir", parent):
        os.makedirs(parent, exist_ok=True)
    tmp = path + ".tmp"
    _write_synced(tmp, data)
    try:
        with io_operation("read", path), open(path, "rb") as f:
            previous = f.read()
    except FileNotFoundError:
        previous = None
    if previous is not None:
        _write_synced(path + ".bak", previous)
    with io_operation("rename", tmp):
        os.replace(tmp, path)
    fsync_dir(parent)
