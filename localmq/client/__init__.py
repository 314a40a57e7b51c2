"""The clients of every queue: Producer, Consumer, ConsumerScheduler and ConsumerOffsetManager."""

from localmq.client.consumer import Consumer
from localmq.client.offsets import ConsumerOffsetManager
from localmq.client.producer import Producer
from localmq.client.scheduler import ConsumerScheduler

__all__ = ["Producer", "Consumer", "ConsumerScheduler", "ConsumerOffsetManager"]
