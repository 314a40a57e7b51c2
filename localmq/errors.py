"""The localmq exception tree: every error is a LocalMQError and also the builtin that matches its kind."""

from __future__ import annotations

import contextlib
import errno as _errno_module
import os
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Tuple, Union

if TYPE_CHECKING:
    from localmq.status import PutStatus


class LocalMQError(Exception):
    """Root of every error localmq raises on purpose."""


class StoreClosedError(LocalMQError, ValueError):
    """An operation on a store, queue, producer or consumer that was closed (like I/O on a closed file)."""


class StoreLockedError(LocalMQError, BlockingIOError):
    """Another writer (this process or another one, localmq or a RocketMQ broker) holds the store's ``lock`` file.

    ``shared_holders`` is True when the holders are processes sharing the store (``shared=True`` joins them)."""

    shared_holders = False


class InvalidTopicError(LocalMQError, ValueError):
    """A topic name outside ``[%|a-zA-Z0-9_-]{1,255}`` (so never a path component such as ``..``), or one longer
    than a shared store's topic table holds (248 bytes)."""


class InvalidQueueIdError(LocalMQError, ValueError):
    """A queue id outside ``[0, MAX_QUEUE_ID]``."""


class MessageSizeError(LocalMQError, ValueError):
    """A body larger than ``max_message_size`` or a record that cannot fit a segment. ``status`` is MESSAGE_ILLEGAL."""

    def __init__(self, message: str, status: Optional[PutStatus] = None) -> None:
        super().__init__(message)
        if status is None:
            from localmq.status import PutStatus

            status = PutStatus.MESSAGE_ILLEGAL
        self.status = status


class PropertiesSizeError(LocalMQError, ValueError):
    """Encoded properties longer than 32767 bytes (the record stores an int16 length).

    ``status`` is PROPERTIES_SIZE_EXCEEDED."""

    def __init__(self, message: str, status: Optional[PutStatus] = None) -> None:
        super().__init__(message)
        if status is None:
            from localmq.status import PutStatus

            status = PutStatus.PROPERTIES_SIZE_EXCEEDED
        self.status = status


class InvalidPropertyError(LocalMQError, ValueError):
    """A property that could not be read back: an empty name, a name or value containing the 0x01 / 0x02
    separators, one that is not a str, or a bad key (empty, or with a space). An empty value (and an empty tag) is
    stored, as RocketMQ stores it, and reads back as absent."""


class CorruptFrameError(LocalMQError, ValueError):
    """Bytes that are not a valid record where one must be (bad magic, size, CRC or length fields).

    ``offset`` is the absolute offset of the bad frame when known, ``path`` the file.
    """

    def __init__(
        self, message: str, offset: Optional[int] = None, path: Union[str, os.PathLike[str], None] = None
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.path = path


class CorruptMessageError(CorruptFrameError):
    """A ConsumeQueue unit whose message cannot be delivered: the record it points at is not a valid record of
    the unit's size, carries another topic, queue id or queue offset than the unit, or (``check_crc_on_read``)
    its body does not match its CRC.

    ``topic``, ``queue_id``, ``queue_offset`` name the unit, ``offset`` the commit log offset it points at,
    ``reason`` what is wrong, ``next_offset`` the queue offset to read next to skip it (a Consumer does so and
    counts it). Messages before it are returned by the get that reaches it; the get that starts at it raises.
    """

    def __init__(
        self,
        message: str,
        offset: Optional[int] = None,
        path: Optional[str] = None,
        *,
        topic: Optional[str] = None,
        queue_id: Optional[int] = None,
        queue_offset: Optional[int] = None,
        reason: Optional[str] = None,
    ) -> None:
        super().__init__(message, offset=offset, path=path)
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.reason = reason
        self.next_offset = None if queue_offset is None else queue_offset + 1


class CorruptStoreError(LocalMQError, ValueError):
    """A store directory whose files cannot be used as they are (wrong segment sizes, gaps, unreadable files)."""


class DamagedLogError(CorruptStoreError):
    """The CommitLog's segments cannot be trusted as a whole: files in ``commitlog/`` that are not 20-digit
    segment names, a segment missing before or after the others (units point into it), or no segment at all
    while ConsumeQueues hold units. ``names`` lists what is wrong. Open with ``salvage=True`` to keep what can be
    read (the ConsumeQueues are then cut to the log that is there)."""

    def __init__(self, message: str, names: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.names = list(names)


class UnknownRecordFormatError(LocalMQError, ValueError):
    """A CommitLog record of a format localmq does not know (a magic that is none of RocketMQ's V1, V2 or blank
    record, framed as a record: README, Recovery). It is not damage, so localmq never replaces it: opening the
    store for writing raises this and changes no byte; ``read_only=True`` reads the records localmq knows.

    ``offset`` is the record's absolute commit log offset, ``path`` its segment file, ``magic`` the 4 bytes found
    (unsigned), ``size`` its TOTALSIZE field.
    """

    def __init__(
        self,
        message: str,
        offset: Optional[int] = None,
        path: Union[str, os.PathLike[str], None] = None,
        magic: Optional[int] = None,
        size: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.path = path
        self.magic = magic
        self.size = size


class UnsafePathError(LocalMQError, PermissionError):
    """A file or directory of the store that is a symlink or resolves outside the store root: localmq never writes,
    truncates or deletes through it. ``path`` is the offending entry."""

    def __init__(self, message: str, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path


class NotAStoreError(LocalMQError, FileNotFoundError):
    """A path that holds no store or segment files where one was required."""


class StorePathError(LocalMQError, NotADirectoryError):
    """A store path that is (or runs through) something other than a directory, e.g. ``open("/etc/passwd")``."""


class ConfigError(LocalMQError, ValueError):
    """An invalid configuration value."""


class FilterSyntaxError(LocalMQError, ValueError):
    """A filter expression that does not compile (``localmq.filter.compile_sql92``): a syntax error, or what RocketMQ
    refuses when it compiles one (BETWEEN bounds out of order, IN without a property on its left, ``= NULL``...).

    ``expression`` is the text, ``position`` the 0-based index of the offending character (``len(expression)`` for
    an unexpected end), ``reason`` the message without the excerpt. ``str(error)`` shows the expression with a caret
    under the position.
    """

    def __init__(self, reason: str, expression: str = "", position: int = 0) -> None:
        self.reason = reason
        self.expression = expression
        self.position = position
        line_start = expression.rfind("\n", 0, position) + 1
        line_end = expression.find("\n", position)
        line = expression[line_start:] if line_end < 0 else expression[line_start:line_end]
        caret = " " * (position - line_start) + "^"
        super().__init__(f"{reason} at position {position}\n    {line}\n    {caret}")


class InvalidDelayError(LocalMQError, ValueError):
    """A delay level below 1 or not an int, a negative delay, a delay longer than the largest level, or both
    ``delay`` and ``delay_level`` given."""


class DelayNotSupportedError(LocalMQError, RuntimeError):
    """A delayed send to a queue without a ScheduleMessageService (shared, embedded and memory queues)."""


class AckError(LocalMQError, RuntimeError):
    """``ack()`` / ``nack()`` on a message no ``manual_ack`` consumer handed out (one built by the caller, read
    with ``get_message``, or unpickled in another process), or a consumer method that needs ``manual_ack``."""


class TransactionNotSupportedError(LocalMQError, RuntimeError):
    """A transaction producer on a queue without a TransactionalMessageCheckService (shared, embedded, memory and
    read-only queues): only an exclusive LocalMessageQueue can check half messages back."""


class InvalidTransactionError(LocalMQError, ValueError):
    """``end_transaction`` given a record that is not a half message of this producer's group (RocketMQ's
    END_TRANSACTION answers SYSTEM_ERROR)."""


class StoreSettingsError(ConfigError):
    """A setting passed to open that contradicts the store's files: the value recorded in ``config/localmq.json``
    when the store was created or, for a store without that record (a RocketMQ broker's), the value read off its
    files (the segment size, the ConsumeQueue file size).

    ``setting`` names it, ``recorded`` is the store's value, ``given`` the one passed, ``source`` says where the
    recorded value comes from ("record" or "files"). Open without the setting to use the store's value.
    """

    def __init__(
        self, message: str, setting: str = "", recorded: object = None, given: object = None, source: str = "record"
    ) -> None:
        super().__init__(message)
        self.setting = setting
        self.recorded = recorded
        self.given = given
        self.source = source


class DispatchError(LocalMQError, RuntimeError):
    """The dispatch service failed; the error it raised is the ``__cause__``. ``errno`` and ``filename`` are the
    cause's when it has them (a StoreIOError: the file that failed), else None."""

    errno: Optional[int] = None
    filename: Any = None

    @classmethod
    def stopped(
        cls,
        cause: Optional[BaseException],
        what: str = "the dispatch service stopped",
        io_failure: Optional[BaseException] = None,
    ) -> "DispatchError":
        """The error a waiter raises (``raise DispatchError.stopped(cause) from cause``) when the dispatch service
        stopped on ``cause``: its message says why, and the cause's errno and filename are kept. ``io_failure``: a
        failed flush of the commit log before it (the pages it could not write may read back as zeros, which the
        dispatcher finds as damage): named too, and its errno and file kept when the cause has none."""
        text = what if cause is None else f"{what}: {cause}"
        errno, filename = getattr(cause, "errno", None), getattr(cause, "filename", None)
        if io_failure is not None and io_failure is not cause:
            text += f" (after a failed flush of the commit log: {io_failure})"
            if errno is None:
                errno, filename = getattr(io_failure, "errno", None), getattr(io_failure, "filename", None)
        err = cls(text)
        err.errno, err.filename = errno, filename
        return err


class QueueReassignedError(LocalMQError, RuntimeError):
    """A consumer lost queues to another consumer of its group (it did not poll for ``consumer_retention_ms``).

    ``queues`` lists the (topic, queue id) pairs it lost. Messages it had delivered from them but not committed
    are delivered again to the new owner (at-least-once); it never delivers them again itself.
    """

    def __init__(self, message: str, queues: Iterable[Tuple[str, int]] = ()) -> None:
        super().__init__(message)
        self.queues = list(queues)


class ForkedStoreError(LocalMQError, RuntimeError):
    """A store (or embedded queue) used in a process forked after it was opened: os.fork, multiprocessing's fork
    start method, gunicorn --preload. The child shares the parent's files but not its put lock, dispatcher or
    offsets, so a put there could overwrite the parent's messages; every use raises this instead. Open the store
    in the child (with ``shared=True`` in both processes they share it; otherwise after the parent closed it), or
    open it only after forking.
    """


class InvalidMessageIdError(LocalMQError, ValueError):
    """A message id that is not 32 or 56 hex digits (an offset message id or a client UNIQ_KEY)."""


class IndexDisabledError(LocalMQError, RuntimeError):
    """A query by key on a store opened with ``message_index_enable=False``."""


class ArgumentRangeError(LocalMQError, ValueError):
    """An argument outside the range a call accepts: a negative or too large position, size, count or value.

    ``argument`` names the argument (None when the message says it). A ValueError, as Python reports a bad value.
    """

    def __init__(self, message: str, argument: Optional[str] = None) -> None:
        super().__init__(message)
        self.argument = argument


class PositionOutOfRangeError(ArgumentRangeError, IndexError):
    """A position, start, end or row index outside the buffer (or rows) it points into, or a negative one.

    Also an IndexError, which the decoders raised for these before (and a ValueError, as every ArgumentRangeError).
    """


class ArgumentOverflowError(ArgumentRangeError, OverflowError):
    """An integer too large (or too small) for the fixed-width field it goes into (a queue id of 2**70, a flag of
    2**40, ``max_messages`` of 2**31). Also an OverflowError, which Python's int conversion raised for these before."""


class ArgumentTypeError(LocalMQError, TypeError):
    """An argument of the wrong type (``get_message("t", "0", 0)``: a str queue id). ``argument`` names it."""

    def __init__(self, message: str, argument: Optional[str] = None) -> None:
        super().__init__(message)
        self.argument = argument


def check_int_range(
    value: object, argument: str, low: int, high: int, error: type[ArgumentRangeError] = ArgumentOverflowError
) -> int:
    """Raise ``error`` naming ``argument`` unless ``low <= value <= high`` (``value`` any integer).

    A non-integer raises ArgumentTypeError (a TypeError, as the C conversion raised). Returns ``value`` as an int.
    """
    index = getattr(value, "__index__", None)
    if index is None or isinstance(value, bool):
        raise ArgumentTypeError(f"{argument} must be an int, not {type(value).__name__} {value!r}", argument)
    number: int = index()
    if not low <= number <= high:
        raise error(f"{argument} {number} outside {low}..{high}", argument)
    return number


class StoreBusyError(LocalMQError, TimeoutError):
    """A live process held the multi-process writer lock for the whole timeout (it may be stopped: SIGSTOP).

    ``pid`` is the holder's pid as recorded in the control file (0 when unknown; for messages only, never a
    liveness test), ``timeout`` the seconds waited. The lock is never taken from a live holder.
    """

    def __init__(self, message: str, pid: int = 0, timeout: Optional[float] = None) -> None:
        super().__init__(message)
        self.pid = pid
        self.timeout = timeout


class LockNotRecoverableError(LocalMQError, RuntimeError):
    """The multi-process writer lock is unusable: a process took it over from a dead holder and released it
    without marking it consistent. Every process must detach; the next first opener re-initialises it."""


class SlotsFullError(LocalMQError, BlockingIOError):
    """Every participant slot of the control file is held by a live process."""


class ReadOnlyStoreError(LocalMQError, PermissionError):
    """A write (put, a producer, a consumer that commits) through a store opened with ``read_only=True``."""


class ReadOnlyFilesystemError(LocalMQError, OSError):
    """A store opened for writing on a read-only file system (EROFS): ``localmq.open(path, read_only=True)`` reads
    it. Raised before anything is opened or written."""


class TopicTableFullError(LocalMQError, OverflowError):
    """The shared topic table of a store opened by several processes is full (layout.CTL_TOPIC_COUNT: 131,072)."""


class UnsupportedFilesystemError(LocalMQError, OSError):
    """A store shared between processes on a filesystem where its locks cannot hold (NFS, SMB, 9p, FUSE)."""


class SendError(LocalMQError, OSError):
    """A Producer's send or send_batch whose put did not answer PUT_OK (a full disk, a SYNC_FLUSH timeout...).

    ``status``: the PutStatus; ``result``: the PutResult; ``stored``: how many of the messages are in the log (a
    flush timeout stores them without knowing they reached the disk; a batch cut short by a full disk stores its
    first ``stored``); ``results``: for ``send_batch(messages)``, the PutResults of the batches that went before.
    """

    def __init__(
        self,
        message: str,
        status: Any = None,
        result: Any = None,
        stored: int = 0,
        results: Optional[Iterable[Any]] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.result = result
        self.stored = stored
        self.results = list(results or ())


class StoreIOError(LocalMQError, OSError):
    """A file operation on one of the store's files failed: a full disk (ENOSPC, EDQUOT, EFBIG), an I/O error (EIO),
    or any other errno the system call answered.

    An OSError with ``errno``, ``strerror`` and ``filename`` (the file, or the directory of a name operation), and
    ``operation`` (the call: "write", "fdatasync", "msync", "rename", ...). An errno that Python maps to an OSError
    subclass (ENOENT: FileNotFoundError, EEXIST: FileExistsError, EACCES: PermissionError...) gives a subclass of
    both (``store_io_error`` picks it), so ``except FileNotFoundError`` still catches it.
    """

    def __init__(self, *args: Any, operation: Optional[str] = None) -> None:
        super().__init__(*args)
        self.operation = operation

    def __str__(self) -> str:
        if self.errno is None:
            return super().__str__()
        name = _errno_module.errorcode.get(self.errno, str(self.errno))
        where = f" {self.filename}" if self.filename is not None else ""
        return f"{self.operation or 'I/O'}{where}: [Errno {self.errno}] {name} {self.strerror}"

    def __reduce__(self) -> Any:
        args = (self.errno, self.strerror) if self.filename is None else (self.errno, self.strerror, self.filename)
        return (_rebuild_store_io_error, (type(self), args, self.operation), self.__dict__)


def _rebuild_store_io_error(
    cls: "type[StoreIOError]", args: Tuple[Any, ...], operation: Optional[str]
) -> "StoreIOError":
    return cls(*args, operation=operation)


# StoreIOError mixed with the OSError subclass Python gives an errno (OSError(ENOENT, ...) is a FileNotFoundError)
_STORE_IO_SUBCLASSES: "dict[type, type[StoreIOError]]" = {}
for _base in (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    BlockingIOError,
    InterruptedError,
    TimeoutError,
    BrokenPipeError,
):
    _cls = type(
        f"Store{_base.__name__}",
        (StoreIOError, _base),
        {"__module__": __name__, "__doc__": f"A StoreIOError that is also a {_base.__name__}."},
    )
    globals()[_cls.__name__] = _cls
    _STORE_IO_SUBCLASSES[_base] = _cls
del _base, _cls


def store_io_error(error: Union[OSError, int], operation: str, filename: Any = None) -> OSError:
    """The StoreIOError for a failed file operation: ``error`` an OSError (its errno, strerror and, unless
    ``filename`` is given, its filename are kept) or an errno. A LocalMQError is returned as it is (already typed);
    so is an OSError without an errno (nothing to report). Use as ``raise store_io_error(e, "write", path) from e``.
    """
    if isinstance(error, LocalMQError):
        return error
    if isinstance(error, int):
        err, strerror, fname = error, os.strerror(error), None
    else:
        if error.errno is None:
            return error
        err, strerror, fname = error.errno, error.strerror or os.strerror(error.errno), error.filename
    if filename is None:
        filename = fname
    cls = _STORE_IO_SUBCLASSES.get(type(OSError(err, strerror)), StoreIOError)
    out: StoreIOError
    if filename is None:
        out = cls(err, strerror, operation=operation)
    else:
        out = cls(err, strerror, os.fspath(filename), operation=operation)
    return out


@contextlib.contextmanager
def io_operation(operation: str, filename: Any) -> Iterator[None]:
    """``with io_operation("write", path): os.write(fd, data)``: an OSError of the block (that is not already a
    LocalMQError) leaves it as the StoreIOError naming ``filename`` and ``operation`` (``store_io_error``)."""
    try:
        yield
    except LocalMQError:
        raise
    except OSError as e:
        raise store_io_error(e, operation, filename) from e


class ControlFileError(LocalMQError, RuntimeError):
    """A misuse of the control file in this process: opened twice, used after close, closed while holding the
    writer lock (which would keep its death from being detected)."""


class MissingToolError(LocalMQError, FileNotFoundError):
    """A program or package a step needs is not installed: building the JVM reader's jar
    (``localmq.spark.jar_path``) without the JDK's ``javac`` or ``jar``, or without pyspark. ``missing`` names it."""

    def __init__(self, message: str, missing: str = "") -> None:
        super().__init__(message)
        self.missing = missing


class JarBuildError(LocalMQError, RuntimeError):
    """``javac`` or ``jar`` failed building the JVM reader's jar (``localmq.spark.jar_path``); ``output`` is the
    end of what it printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


__all__ = [
    "LocalMQError",
    "StoreClosedError",
    "StoreLockedError",
    "InvalidTopicError",
    "InvalidQueueIdError",
    "MessageSizeError",
    "PropertiesSizeError",
    "InvalidPropertyError",
    "CorruptFrameError",
    "CorruptMessageError",
    "CorruptStoreError",
    "DamagedLogError",
    "UnknownRecordFormatError",
    "UnsafePathError",
    "NotAStoreError",
    "ConfigError",
    "StoreSettingsError",
    "DispatchError",
    "QueueReassignedError",
    "InvalidMessageIdError",
    "IndexDisabledError",
    "ForkedStoreError",
    "ArgumentRangeError",
    "PositionOutOfRangeError",
    "ArgumentOverflowError",
    "check_int_range",
    "StoreBusyError",
    "LockNotRecoverableError",
    "SlotsFullError",
    "ControlFileError",
    "TopicTableFullError",
    "ReadOnlyStoreError",
    "ReadOnlyFilesystemError",
    "UnsupportedFilesystemError",
    "InvalidDelayError",
    "DelayNotSupportedError",
    "TransactionNotSupportedError",
    "InvalidTransactionError",
    "AckError",
    "FilterSyntaxError",
    "StoreIOError",
    "store_io_error",
    "io_operation",
    "MissingToolError",
    "JarBuildError",
]
