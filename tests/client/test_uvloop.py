"""The asyncio client on uvloop, the loop servers (and many applications) run: its
transports do not derive from asyncio.Transport, which the client must not require."""

from __future__ import annotations

import uvloop
from client_broker import Broker

from tidelog.client.aio import AIOAdmin, AIOProducer
from tidelog.client.types import NewTopic


def test_admin_and_producer_work_on_uvloop(broker: Broker, topic_name: str) -> None:
    async def main() -> tuple[list[str], int]:
        async with AIOAdmin({"bootstrap.servers": broker.bootstrap}) as admin:
            await admin.create_topics([NewTopic(topic_name, 1, 1)])
            topics = await admin.list_topics()
        producer = AIOProducer({"bootstrap.servers": broker.bootstrap})
        try:
            sent = await producer.send_and_wait(topic_name, b"on uvloop")
        finally:
            await producer.close()
        return topics, sent.offset

    topics, offset = uvloop.run(main())
    assert topic_name in topics
    assert offset == 0
