"""The three queues behind one interface: MemoryMessageQueue, EmbeddedMessageQueue and LocalMessageQueue.

Import the queues from ``localmq`` (or their modules); this package's ``__init__`` imports only the interface, so
that the store layer can use it without importing the queues built on top of it.
"""

from localmq.queues.base import MessageStore, QueueClientsMixin

__all__ = ["MessageStore", "QueueClientsMixin"]
