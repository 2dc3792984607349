"""Which Kafka APIs this listener serves, and the handler of each.

A handler module registers its APIs at import (see the package docstring);
`protocol.decode_request` reads the versions from here, ApiVersions advertises
them, and the listener calls the handler. Nothing here does I/O.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from common.wire.frames import BytesLike

if TYPE_CHECKING:
    from common.control_client import ControlClient
    from dataplane.broker.server import RequestHandler


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any      # the decoded request: a kio entity, or the API's own `read_body` result
    served: bool   # False: a version advertised (or ApiVersions') but not served; answer with an error
    client_host: str = ""   # "/" and the peer's address, as Kafka's DescribeGroups shows a member's host


@dataclasses.dataclass(frozen=True, slots=True)
class TopicDefaults:
    """What a topic gets when a Kafka client leaves it to the broker: CreateTopics' -1 counts,
    and topics created because a client asked for their metadata (Kafka's num.partitions,
    default.replication.factor and auto.create.topics.enable)."""

    partitions: int = 1
    # None: min(3, live brokers), so a topic nobody sized still survives the loss of a broker
    # (Kafka's own default, 1, would not).
    replication_factor: int | None = None
    auto_create: bool = False

    def resolved(self, live_brokers: int) -> tuple[int, int]:
        """(partitions, replication factor) for a cluster of `live_brokers`."""
        rf = self.replication_factor if self.replication_factor is not None else max(1, min(3, live_brokers))
        return self.partitions, rf


@dataclasses.dataclass(frozen=True, slots=True)
class Context:
    """What a handler may use: the broker's own request handler (the admission path, cores
    and error codes of Biplane's protocol) and its controller client (admin calls)."""

    requests: "RequestHandler"
    control: "ControlClient | None"
    broker_id: int
    cluster_id: str
    topic_defaults: TopicDefaults = TopicDefaults()
    # (metadata offset, timeout ms) -> whether this broker applied it in time (admin.SettledPort)
    applied: Callable[[int, int], Awaitable[bool]] | None = None

    def effective_topic_defaults(self) -> TopicDefaults:
        """The broker's flags, overridden by the cluster's dynamic config where it is set
        (auto_create_topics, default_partitions, default_replication_factor), read per request."""
        cluster = self.requests.image().cluster_config
        d = self.topic_defaults
        return TopicDefaults(
            partitions=cluster.default_partitions if cluster.default_partitions is not None else d.partitions,
            replication_factor=(cluster.default_replication_factor if cluster.default_replication_factor is not None
                                else d.replication_factor),
            auto_create=cluster.auto_create_topics if cluster.auto_create_topics is not None else d.auto_create)

    def default_topic_shape(self) -> tuple[int, int]:
        image = self.requests.image()
        return self.effective_topic_defaults().resolved(sum(1 for b in image.brokers.values() if not b.fenced))


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """A response body already encoded, as frame parts (the hot paths' answers, whose
    records go to the socket as the log's own buffers)."""

    parts: list[BytesLike]


@dataclasses.dataclass(frozen=True, slots=True)
class Close:
    """No answer: close the connection once the answers before it are sent (Kafka's way of
    telling an acks=0 producer that a partition refused its records)."""

    reason: str


# A kio response entity, an Encoded body, Close, or None (nothing to send: acks=0 produce).
Answer = Any
Handler = Callable[[Request, Context], Awaitable[Answer]]
# Reads a body by hand (frame, offset of the body, version) instead of kio.
BodyReader = Callable[[bytearray, int, int], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    versions: tuple[int, int]        # (lowest, highest) served
    advertised_from: int              # lowest version ApiVersions names (<= versions[0])
    handle: Handler
    read_body: BodyReader | None      # None: kio decodes the body


APIS: dict[int, Api] = {}


def register(key: int, name: str, versions: tuple[int, int], *, advertised_from: int | None = None,
             read_body: BodyReader | None = None) -> Callable[[Handler], Handler]:
    """Decorator: `handle` answers API `key` at `versions`. It is called as the request is
    read, in arrival order; what it does before returning its awaitable happens in that
    order (produce steps its cores there). An `async def` is fine otherwise."""
    low, high = versions
    if not 0 <= low <= high:
        raise ValueError(f"{name}: versions {versions} must be (lowest, highest) with 0 <= lowest <= highest")
    first = low if advertised_from is None else advertised_from
    if not 0 <= first <= low:
        raise ValueError(f"{name}: advertised_from={first} must be between 0 and the lowest served {low}")

    def add(handle: Handler) -> Handler:
        if key in APIS and APIS[key].handle is not handle:
            raise ValueError(f"API key {key} ({name}) is registered twice: {APIS[key].name} has it")
        APIS[key] = Api(key=key, name=name, versions=(low, high), advertised_from=first, handle=handle,
                        read_body=read_body)
        return handle
    return add
