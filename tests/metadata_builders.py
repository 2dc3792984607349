"""Small builders for metadata images in tests (not a test module)."""
from __future__ import annotations

from common.metadata import MetadataImage, Record, RegisterBroker, UnfenceBroker
from common.requests import CreateTopicRequest
from controller.decisions import create_topic


def apply(image: MetadataImage, records: list[Record]) -> MetadataImage:
    """Apply every record; any rejection fails the test."""
    for r in records:
        image.apply(r, image.offset + 1)
    return image


def add_broker(image: MetadataImage, broker_id: int, *, rack: str | None = None,
               priority: int = 0, fenced: bool = False, incarnation: str = "i0") -> None:
    apply(image, [RegisterBroker(broker_id=broker_id, incarnation_id=incarnation,
                                 host="127.0.0.1", port=9000 + broker_id, rack=rack,
                                 priority=priority, at_ms=0)])
    if not fenced:
        apply(image, [UnfenceBroker(broker_id=broker_id, at_ms=0)])


def cluster(n: int, *, racks: list[str] | None = None,
            priorities: dict[int, int] | None = None) -> MetadataImage:
    """Brokers 1..n, unfenced."""
    image = MetadataImage()
    for b in range(1, n + 1):
        add_broker(image, b, rack=racks[b - 1] if racks else None,
                   priority=(priorities or {}).get(b, 0))
    return image


def add_topic(image: MetadataImage, name: str, assignment: list[list[int]],
              now_ms: int = 0, **config) -> None:
    apply(image, create_topic(image, CreateTopicRequest(
        name=name, replica_assignment=assignment, config=config), now_ms))
