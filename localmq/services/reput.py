"""ReputMessageService: the dispatch thread that builds ConsumeQueues from new CommitLog records."""

from __future__ import annotations

from typing import Callable, Optional

from localmq.services.service_thread import ServiceThread
from localmq.store.dispatch import ReputCore


class ReputMessageService(ServiceThread):
    """Runs ``ReputCore.run`` (a Cython loop that drops the GIL while it walks records and writes units).

    A put wakes it through a C event only when it sleeps; otherwise it polls the segment's published write
    position. An invalid record stops it: the error is kept in ``core.error`` and ``wait_for`` raises it.
    """

    def __init__(self, core: ReputCore, check_disk: Optional[Callable[[], None]] = None):
        super().__init__("ReputMessageService")
        self.core = core
        # called when the dispatcher stopped on an invalid record (not an OSError): a write-back of the page cache
        # that failed (its pages dropped, read back as the disk has them) shows as damage here before any flush
        # has reported the error; a flush asks the disk, so the error the waiters get names it
        self.check_disk = check_disk

    def run(self) -> None:
        self.core.reset_stop()
        try:
            self.core.run()
        finally:  # the loop raises the error it stopped on (kept in core.error)
            error = self.core.error
            if error is not None and not isinstance(error, OSError) and self.check_disk is not None:
                self.check_disk()

    def on_shutdown(self) -> None:
        self.core.stop()
