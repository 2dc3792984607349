"""Biplane's client SDK (asyncio): Producer, Consumer, AdminClient. Blocking versions are in
dataplane.client.sync. With no address given they use the cluster `biplane up` started."""
from dataplane.client.consumer import Consumer
from dataplane.client.errors import (
    AdminError,
    BrokerResponseError,
    BufferFullTimeoutError,
    ClientClosedError,
    ClientError,
    DeliveryTimeoutError,
    NoBrokersError,
    NoClusterError,
    OutcomeUnknownError,
    UnknownTopicError,
)
from dataplane.client.producer import Producer
from dataplane.client.records import ConsumerRecord, RecordMetadata, TopicPartition


def __getattr__(name: str):
    # The admin client pulls in aiohttp and pydantic; load it only when asked.
    if name == "AdminClient":
        from dataplane.client.admin import AdminClient
        return AdminClient
    raise AttributeError(name)


__all__ = ["Producer", "Consumer", "AdminClient", "TopicPartition", "RecordMetadata", "ConsumerRecord",
           "ClientError", "BrokerResponseError", "BufferFullTimeoutError", "ClientClosedError",
           "DeliveryTimeoutError", "NoBrokersError", "NoClusterError", "OutcomeUnknownError",
           "UnknownTopicError", "AdminError"]
