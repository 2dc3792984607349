"""Metadata shared by controllers and brokers: records, the image, topic config."""
from common.errors import RecordRejected
from common.metadata.config import TopicConfig, apply_config_changes, make_topic_config, validate_topic_name
from common.metadata.image import BrokerInfo, MetadataImage, PartitionInfo, TopicInfo
from common.metadata.records import (
    NO_CHANGE,
    NO_LEADER,
    AddPartitions,
    AlterBrokerState,
    AlterClusterConfig,
    AlterTopicConfig,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    NoOp,
    PartitionChange,
    PartitionRecord,
    ProducerIdBlock,
    Record,
    RegisterBroker,
    UnfenceBroker,
    UnregisterBroker,
    dump_record,
    parse_record,
)

__all__ = [
    "TopicConfig", "apply_config_changes", "make_topic_config", "validate_topic_name",
    "RecordRejected", "BrokerInfo", "MetadataImage", "PartitionInfo", "TopicInfo",
    "NO_CHANGE", "NO_LEADER", "AddPartitions", "AlterBrokerState", "AlterClusterConfig", "AlterTopicConfig", "ConfigChange", "CreateTopic", "DeleteTopic", "FenceBroker",
    "NoOp", "PartitionChange", "PartitionRecord", "ProducerIdBlock", "Record",
    "RegisterBroker", "UnfenceBroker", "UnregisterBroker", "dump_record", "parse_record",
]
