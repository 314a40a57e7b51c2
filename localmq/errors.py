"""The localmq exception tree: every error is a LocalMQError and also the builtin that matches its kind."""


class LocalMQError(Exception):
    """Root of every error localmq raises on purpose."""


class StoreClosedError(LocalMQError, ValueError):
    """An operation on a store, queue, producer or consumer that was closed (like I/O on a closed file)."""


class StoreLockedError(LocalMQError, BlockingIOError):
    """Another writer (this process or another one, localmq or a RocketMQ broker) holds the store's ``lock`` file."""


class InvalidTopicError(LocalMQError, ValueError):
    """A topic name outside ``[%|a-zA-Z0-9_-]{1,127}`` (so never a path component such as ``..``)."""


class InvalidQueueIdError(LocalMQError, ValueError):
    """A queue id outside ``[0, MAX_QUEUE_ID]``."""


class MessageSizeError(LocalMQError, ValueError):
    """A body larger than ``max_message_size`` or a record that cannot fit a segment. ``status`` is MESSAGE_ILLEGAL."""

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is None:
            from localmq.status import PutStatus

            status = PutStatus.MESSAGE_ILLEGAL
        self.status = status


class PropertiesSizeError(LocalMQError, ValueError):
    """Encoded properties longer than 32767 bytes (the record stores an int16 length). ``status`` is PROPERTIES_SIZE_EXCEEDED."""

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is None:
            from localmq.status import PutStatus

            status = PutStatus.PROPERTIES_SIZE_EXCEEDED
        self.status = status


class InvalidPropertyError(LocalMQError, ValueError):
    """A property name or value that is empty or contains the 0x01 / 0x02 separators, so it could not be read back."""


class CorruptFrameError(LocalMQError, ValueError):
    """Bytes that are not a valid record where one must be (bad magic, size, CRC or length fields).

    ``offset`` is the absolute offset of the bad frame when known, ``path`` the file.
    """

    def __init__(self, message, offset=None, path=None):
        super().__init__(message)
        self.offset = offset
        self.path = path


class CorruptStoreError(LocalMQError, ValueError):
    """A store directory whose files cannot be used as they are (wrong segment sizes, gaps, unreadable files)."""


class NotAStoreError(LocalMQError, FileNotFoundError):
    """A path that holds no store or segment files where one was required."""


class ConfigError(LocalMQError, ValueError):
    """An invalid configuration value."""


class DispatchError(LocalMQError, RuntimeError):
    """The dispatch service failed; the error it raised is the ``__cause__``."""


class QueueReassignedError(LocalMQError, RuntimeError):
    """A consumer lost queues to another consumer of its group (it did not poll for ``consumer_retention_ms``).

    ``queues`` lists the (topic, queue id) pairs it lost. Messages it had delivered from them but not committed
    are delivered again to the new owner (at-least-once); it never delivers them again itself.
    """

    def __init__(self, message, queues=()):
        super().__init__(message)
        self.queues = list(queues)


class InvalidMessageIdError(LocalMQError, ValueError):
    """A message id that is not 32 or 56 hex digits (an offset message id or a client UNIQ_KEY)."""


class IndexDisabledError(LocalMQError, RuntimeError):
    """A query by key on a store opened with ``message_index_enable=False``."""


class StoreBusyError(LocalMQError, TimeoutError):
    """A live process held the multi-process writer lock for the whole timeout (it may be stopped: SIGSTOP).

    ``pid`` is the holder's pid as recorded in the control file (0 when unknown; for messages only, never a
    liveness test), ``timeout`` the seconds waited. The lock is never taken from a live holder.
    """

    def __init__(self, message, pid=0, timeout=None):
        super().__init__(message)
        self.pid = pid
        self.timeout = timeout


class LockNotRecoverableError(LocalMQError, RuntimeError):
    """The multi-process writer lock is unusable: a process took it over from a dead holder and released it
    without marking it consistent. Every process must detach; the next first opener re-initialises it."""


class SlotsFullError(LocalMQError, BlockingIOError):
    """Every participant slot of the control file is held by a live process."""


class ControlFileError(LocalMQError, RuntimeError):
    """A misuse of the control file in this process: opened twice, used after close, closed while holding the
    writer lock (which would keep its death from being detected)."""


__all__ = [
    "LocalMQError", "StoreClosedError", "StoreLockedError", "InvalidTopicError", "InvalidQueueIdError",
    "MessageSizeError", "PropertiesSizeError", "InvalidPropertyError", "CorruptFrameError", "CorruptStoreError",
    "NotAStoreError", "ConfigError", "DispatchError", "QueueReassignedError", "InvalidMessageIdError",
    "IndexDisabledError", "StoreBusyError", "LockNotRecoverableError", "SlotsFullError", "ControlFileError",
]
