"""ReputMessageService: the dispatch thread that builds ConsumeQueues from new CommitLog records."""
from __future__ import annotations

from localmq.store.dispatch import ReputCore
from localmq.services.service_thread import ServiceThread


class ReputMessageService(ServiceThread):
    """Runs ``ReputCore.run`` (a Cython loop that drops the GIL while it walks records and writes units).

    A put wakes it through a C event only when it sleeps; otherwise it polls the segment's published write
    position. An invalid record stops it: the error is kept in ``core.error`` and ``wait_for`` raises it.
    """

    def __init__(self, core: ReputCore):
        super().__init__("ReputMessageService")
        self.core = core

    def run(self) -> None:
        self.core.reset_stop()
        self.core.run()

    def on_shutdown(self) -> None:
        self.core.stop()
