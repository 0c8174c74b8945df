"""The asyncio core of the client: producer, standalone consumer and admin.

Each object owns its own connections and must be used from one event loop.
"""

from tidelog.client.aio.admin import AIOAdmin, ClusterDescription
from tidelog.client.aio.consumer import AIOConsumer
from tidelog.client.aio.producer import AIOProducer

__all__ = ["AIOAdmin", "AIOConsumer", "AIOProducer", "ClusterDescription"]
