"""Producer-id blocks, allocated from the metadata log so no two brokers share an id."""
from __future__ import annotations

from common.errors import UnknownBrokerError
from common.metadata.image import MetadataImage
from common.metadata.records import ProducerIdBlock, Record
from common.requests import AllocateProducerIdsRequest

PRODUCER_ID_BLOCK_SIZE = 1000


def allocate_producer_ids(image: MetadataImage,
                          request: AllocateProducerIdsRequest) -> list[Record]:
    """One block of `request.count` ids starting at the image's next free id."""
    if request.broker_id not in image.brokers:
        raise UnknownBrokerError(request.broker_id)
    return [ProducerIdBlock(broker_id=request.broker_id, first_id=image.producer_id_next,
                            size=request.count)]
