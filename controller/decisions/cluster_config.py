"""Dynamic cluster config changes: checked as a whole, one record (brokers apply it live)."""
from __future__ import annotations

from common.errors import InvalidConfigError
from common.metadata.cluster_config import apply_cluster_config_changes
from common.metadata.image import MetadataImage
from common.metadata.records import AlterClusterConfig, Record
from common.requests import ClusterConfigRequest


def alter_cluster_config(image: MetadataImage, request: ClusterConfigRequest) -> list[Record]:
    """The record setting and unsetting the keys; nothing when they already are so."""
    both = set(request.set) & set(request.reset)
    if both:
        raise InvalidConfigError(f"cluster config key(s) {sorted(both)} are both set and reset; choose one",
                                 field=sorted(both)[0])
    if not request.set and not request.reset:
        raise InvalidConfigError("nothing to change: give keys to set or to reset", field="set")
    changes: dict[str, object] = {**request.set, **{k: None for k in request.reset}}
    new = apply_cluster_config_changes(image.cluster_config, changes)
    if new == image.cluster_config:
        return []
    # The checked values, in their own types ("1024" given for an int key is stored as 1024).
    return [AlterClusterConfig(changes={k: getattr(new, k) for k in changes})]
