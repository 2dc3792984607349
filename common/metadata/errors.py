"""Kept so older imports work: the metadata layer's and the decisions' errors live in
common/errors.py, with every other error."""
from common.errors import (
    IneligibleReplicaError as IneligibleReplicaError,
    InvalidConfigError as InvalidConfigError,
    InvalidFieldError as InvalidFieldError,
    InvalidPartitionsError as InvalidPartitionsError,
    InvalidReplicationFactorError as InvalidReplicationFactorError,
    InvalidTopicError as InvalidTopicError,
    NotLeaderError as NotLeaderError,
    RecordRejected as RecordRejected,
    StaleBrokerError as StaleBrokerError,
    StaleEpochError as StaleEpochError,
    TopicExistsError as TopicExistsError,
    UnknownBrokerError as UnknownBrokerError,
    UnknownTopicOrPartitionError as UnknownTopicOrPartitionError,
)
