"""ServiceThread: one base for every background service (start, wakeup, wait, shutdown with join)."""

from __future__ import annotations

import logging
import os
import threading
import weakref

log = logging.getLogger("localmq.services")

_live: "weakref.WeakSet[ServiceThread]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child inherits the parent's service objects but none of their threads: mark them dead so
    # that nothing waits on a thread that does not exist (the child must reopen the store).
    for s in list(_live):
        s._forked = True
        s._stopped.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ServiceThread:
    """A named daemon thread running ``run()``; ``wakeup()`` shortens the current ``wait_for_running``.

    Errors raised by ``run`` are logged with the service's name and counted (``errors``, ``last_error``),
    never swallowed. ``shutdown()`` always joins. Subclasses implement ``run`` (usually a loop over
    ``while not self.stopped: self.wait_for_running(ms); work()``).
    """

    def __init__(self, name: str):
        self.name = name
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._started = False
        self._forked = False
        self.errors = 0
        self.last_error: BaseException | None = None
        _live.add(self)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._thread = threading.Thread(target=self._main, name=f"localmq-{self.name}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 - logged and counted, then the thread ends
            self.errors += 1
            self.last_error = e
            log.exception("service %s failed", self.name)
        finally:
            self.on_exit()

    def run(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_exit(self) -> None:
        """Called in the service thread when ``run`` returns or raises."""

    def wakeup(self) -> None:
        self._wake.set()

    def wait_for_running(self, interval_ms: float) -> None:
        """Sleep up to ``interval_ms`` unless woken (a pending wakeup returns at once) or shut down."""
        self._wake.wait(interval_ms / 1000.0)
        self._wake.clear()
        self.on_wait_end()

    def on_wait_end(self) -> None:
        """Hook run after each wait (GroupCommitService swaps its request lists here)."""

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop and join the thread (raises TimeoutError if it does not end within ``timeout`` s)."""
        self._stopped.set()
        self._wake.set()
        self.on_shutdown()
        t = self._thread
        if t is not None and t is not threading.current_thread() and not self._forked:
            t.join(timeout)
            if t.is_alive():
                raise TimeoutError(f"service {self.name} did not stop within {timeout} s")

    def on_shutdown(self) -> None:
        """Hook run by shutdown() before joining (wake a loop blocked elsewhere)."""

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
