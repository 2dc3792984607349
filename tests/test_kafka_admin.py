"""Kafka's admin APIs (dataplane/kafka/admin.py) against a fake admin port: what each
request becomes for the controller, and how an error comes back per topic or resource."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from common.errors import BiplaneError, ErrorCode, TopicExistsError
from common.requests import AddPartitionsRequest, AdminAnswer, AlterConfigRequest, CreateTopicRequest
from dataplane.kafka import admin, messages
from dataplane.kafka.protocol import Request
from metadata_builders import add_topic, cluster


class FakePort:
    def __init__(self, *, refuse: dict[str, BiplaneError] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.validate_only: list[bool] = []
        self.refuse = refuse or {}

    async def _call(self, what: str, name: str, arg: Any, validate_only: bool) -> AdminAnswer:
        self.calls.append((what, arg))
        self.validate_only.append(validate_only)
        if name in self.refuse:
            raise self.refuse[name]
        return AdminAnswer(metadata_offset=7)

    async def create_topic(self, request: CreateTopicRequest, *, validate_only: bool = False) -> AdminAnswer:
        return await self._call("create", request.name, request, validate_only)

    async def delete_topic(self, name: str, *, validate_only: bool = False) -> AdminAnswer:
        return await self._call("delete", name, name, validate_only)

    async def alter_config(self, name: str, change: AlterConfigRequest, *,
                           validate_only: bool = False) -> AdminAnswer:
        return await self._call("alter", name, (name, change), validate_only)

    async def add_partitions(self, name: str, change: AddPartitionsRequest, *,
                             validate_only: bool = False) -> AdminAnswer:
        return await self._call("grow", name, (name, change), validate_only)


def request(api_key: int, version: int, values: dict[str, Any]) -> Request:
    body = messages.build(messages.request_schema(api_key, version), values)
    return Request(api_key, version, 1, "test", body, served=True)


def run(coro):
    return asyncio.run(coro)


def test_create_topics_sends_counts_configs_and_assignments_and_answers_per_topic():
    port = FakePort(refuse={"taken": TopicExistsError("taken")})
    answer = run(admin.create_topics(request(admin.CREATE_TOPICS, 4, {"timeout": 5000, "validate_only": False, "topics": [
        {"name": "a", "num_partitions": 3, "replication_factor": 2, "assignments": [],
         "configs": [{"name": "retention.ms", "value": "1000"}, {"name": "biplane.commit.policy", "value": "isr"}]},
        {"name": "b", "num_partitions": -1, "replication_factor": -1, "assignments": [
            {"partition_index": 1, "broker_ids": [2, 1]}, {"partition_index": 0, "broker_ids": [1, 2]}],
         "configs": []},
        {"name": "taken", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []},
        {"name": "bad", "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": [{"name": "compression.type", "value": "zstd"}]},
    ]}), port))
    created = {r.name: r for _, r in port.calls}
    assert created["a"].partitions == 3 and created["a"].replication_factor == 2
    assert created["a"].config == {"retention_ms": 1000, "commit_policy": "isr"}
    assert created["b"].replica_assignment == ((1, 2), (2, 1))
    assert "bad" not in created   # refused before reaching the controller
    codes = {t.name: (int(t.error_code), t.error_message) for t in answer.topics}
    assert codes["a"] == (0, None) and codes["b"] == (0, None)
    assert codes["taken"][0] == ErrorCode.TOPIC_ALREADY_EXISTS
    assert codes["bad"][0] == ErrorCode.INVALID_CONFIG and "compression.type='zstd'" in codes["bad"][1]


def test_a_count_the_request_model_refuses_gets_kafkas_code_for_it_and_names_it():
    answer = run(admin.create_topics(request(admin.CREATE_TOPICS, 2, {"timeout": 5000, "validate_only": False,
        "topics": [{"name": "z", "num_partitions": 0, "replication_factor": 1, "assignments": [], "configs": []}]}),
        FakePort()))
    (topic,) = answer.topics
    assert int(topic.error_code) == ErrorCode.INVALID_PARTITIONS and "partitions" in topic.error_message
    assert "got 0" in topic.error_message


def test_an_assignment_comes_with_counts_of_minus_one_and_is_forwarded_without_counts():
    """Kafka's rule (kafka-topics --replica-assignment sends -1 and -1): the assignment carries the counts,
    so the controller gets no count of its own to check it against, and a count beside it is refused."""
    port = FakePort()
    assignment = [{"partition_index": 0, "broker_ids": [1, 2, 3]}, {"partition_index": 1, "broker_ids": [2, 3, 1]}]
    answer = run(admin.create_topics(request(admin.CREATE_TOPICS, 4, {"timeout": 5000, "validate_only": False,
        "topics": [{"name": "assigned", "num_partitions": -1, "replication_factor": -1, "assignments": assignment,
                    "configs": []},
                   {"name": "counted", "num_partitions": 2, "replication_factor": -1, "assignments": assignment,
                    "configs": []},
                   {"name": "replicated", "num_partitions": -1, "replication_factor": 3, "assignments": assignment,
                    "configs": []}]}), port))
    (sent,) = [r for _, r in port.calls]
    assert sent.name == "assigned" and sent.replica_assignment == ((1, 2, 3), (2, 3, 1))
    assert not {"partitions", "replication_factor"} & sent.model_fields_set
    codes = {t.name: (int(t.error_code), t.error_message) for t in answer.topics}
    assert codes["assigned"] == (0, None)
    assert codes["counted"][0] == ErrorCode.INVALID_REQUEST and "must be -1, not 2" in codes["counted"][1]
    assert codes["replicated"][0] == ErrorCode.INVALID_REQUEST and "must be -1, not 3" in codes["replicated"][1]


def test_validate_only_goes_to_the_controller_as_such():
    port = FakePort(refuse={"b": TopicExistsError("b")})
    answer = run(admin.create_topics(request(admin.CREATE_TOPICS, 4, {"timeout": 5000, "validate_only": True,
        "topics": [{"name": n, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
                   for n in ("a", "b")]}), port))
    assert port.validate_only == [True, True]
    assert [int(t.error_code) for t in answer.topics] == [0, ErrorCode.TOPIC_ALREADY_EXISTS]
    run(admin.create_partitions(request(admin.CREATE_PARTITIONS, 1, {"timeout": 5000, "validate_only": True,
        "topics": [{"name": "t", "count": 4, "assignments": None}]}), port))
    run(admin.alter_configs(request(admin.ALTER_CONFIGS, 1, {"validate_only": True, "resources": [
        {"resource_type": 2, "resource_name": "t", "configs": []}]}), port))
    run(admin.create_topics(request(admin.CREATE_TOPICS, 4, {"timeout": 5000, "validate_only": False,
        "topics": [{"name": "c", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}]}),
        port))
    assert port.validate_only == [True, True, True, True, False]


def test_delete_topics_answers_each_name():
    port = FakePort(refuse={"gone": BiplaneError("unknown topic 'gone'", code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)})
    answer = run(admin.delete_topics(request(admin.DELETE_TOPICS, 3, {"timeout": 5000, "topic_names": ["a", "gone"]}),
                                     port))
    assert [c for c in port.calls] == [("delete", "a"), ("delete", "gone")]
    assert [(r.name, int(r.error_code)) for r in answer.responses] == [("a", 0), ("gone", 3)]


def test_create_partitions_sends_the_new_total_and_assignment():
    port = FakePort(refuse={"small": BiplaneError("topic 'small' already has 4 partitions",
                                                  code=ErrorCode.INVALID_PARTITIONS)})
    answer = run(admin.create_partitions(request(admin.CREATE_PARTITIONS, 1, {"timeout": 5000, "validate_only": False,
        "topics": [{"name": "t", "count": 4, "assignments": [{"broker_ids": [1, 2]}, {"broker_ids": [2, 3]}]},
                   {"name": "u", "count": 6, "assignments": None},
                   {"name": "small", "count": 2, "assignments": None}]}), port))
    assert port.calls[0] == ("grow", ("t", AddPartitionsRequest(partitions=4, replica_assignment=((1, 2), (2, 3)))))
    assert port.calls[1] == ("grow", ("u", AddPartitionsRequest(partitions=6)))
    assert [(r.name, int(r.error_code)) for r in answer.results] == [("t", 0), ("u", 0), ("small", 37)]
    assert "already has 4" in answer.results[2].error_message


def test_alter_configs_replaces_and_incremental_alter_sets_and_deletes():
    port = FakePort()
    run(admin.alter_configs(request(admin.ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
        {"resource_type": 2, "resource_name": "t", "configs": [{"name": "retention.ms", "value": "5"}]}]}), port))
    (_, (name, change)), = port.calls
    assert name == "t" and change.set == {"retention_ms": 5} and "segment_bytes" in change.reset
    port = FakePort()
    answer = run(admin.incremental_alter_configs(request(admin.INCREMENTAL_ALTER_CONFIGS, 0, {
        "validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": "t", "configs": [
                {"name": "retention.ms", "config_operation": 0, "value": "5"},
                {"name": "segment.ms", "config_operation": 1, "value": None}]},
            {"resource_type": 2, "resource_name": "u", "configs": [
                {"name": "retention.ms", "config_operation": 2, "value": "5"}]},
            {"resource_type": 4, "resource_name": "1", "configs": []}]}), port))
    (_, (name, change)), = port.calls
    assert change == AlterConfigRequest(set={"retention_ms": 5}, reset=["segment_ms"])
    codes = [(r.resource_name, int(r.error_code)) for r in answer.responses]
    assert codes == [("t", 0), ("u", ErrorCode.INVALID_CONFIG), ("1", ErrorCode.INVALID_REQUEST)]
    assert "only topic configs" in answer.responses[2].error_message


def test_describe_configs_reads_the_image():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]], retention_ms=60_000)
    answer = admin.describe_configs(request(admin.DESCRIBE_CONFIGS, 3, {"include_synonyms": False,
        "include_documentation": False, "resources": [
            {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
            {"resource_type": 2, "resource_name": "t", "configuration_keys": ["retention.ms"]},
            {"resource_type": 2, "resource_name": "nope", "configuration_keys": None},
            {"resource_type": 2, "resource_name": "t", "configuration_keys": ["colour"]}]}), image)
    whole, one, missing, unknown = answer.results
    by_name = {c.name: c for c in whole.configs}
    assert by_name["retention.ms"].value == "60000" and by_name["retention.ms"].config_source == 1
    assert by_name["segment.ms"].config_source == 5 and by_name["cleanup.policy"].value == "delete"
    assert [c.name for c in one.configs] == ["retention.ms"]
    assert int(missing.error_code) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and missing.configs == ()
    assert int(unknown.error_code) == ErrorCode.INVALID_CONFIG and "colour" in unknown.error_message


def test_every_answer_encodes_at_every_served_version():
    """The answers fit each version's schema (messages.build drops what a version lacks)."""
    image = cluster(1)
    add_topic(image, "t", [[1]])
    for version in range(1, 4):
        messages.encode(admin.describe_configs(request(admin.DESCRIBE_CONFIGS, version, {"resources": [
            {"resource_type": 2, "resource_name": "t", "configuration_keys": None}]}), image))
    for version in range(2, 5):
        messages.encode(run(admin.create_topics(request(admin.CREATE_TOPICS, version, {"timeout": 1, "topics": [
            {"name": "a", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}]}),
            FakePort())))
    for version in range(1, 4):
        messages.encode(run(admin.delete_topics(request(admin.DELETE_TOPICS, version, {"timeout": 1,
                                                                                        "topic_names": ["a"]}),
                                                FakePort())))
    for version in range(0, 2):
        messages.encode(run(admin.create_partitions(request(admin.CREATE_PARTITIONS, version, {"timeout": 1,
            "topics": [{"name": "a", "count": 2, "assignments": None}]}), FakePort())))
        messages.encode(run(admin.alter_configs(request(admin.ALTER_CONFIGS, version, {"resources": [
            {"resource_type": 2, "resource_name": "t", "configs": []}]}), FakePort())))


def test_a_listener_without_a_controller_says_so():
    answer = run(admin.delete_topics(request(admin.DELETE_TOPICS, 3, {"timeout": 1, "topic_names": ["a"]}),
                                     admin.NoAdminPort()))
    assert int(answer.responses[0].error_code) == ErrorCode.NOT_CONTROLLER


def test_a_metadata_request_never_auto_creates_the_offsets_topic():
    """With auto-create on, `kcat -L -t __consumer_offsets` before any group made the offsets
    topic with a user topic's shape and retention; the brokers make it, compacted, for groups."""
    port = FakePort()
    assert run(admin.auto_create("__consumer_offsets", port, (1, 1))) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert run(admin.auto_create("events", port, (1, 1))) is ErrorCode.LEADER_NOT_AVAILABLE
    assert [(what, arg.name) for what, arg in port.calls] == [("create", "events")]


def test_a_settled_write_answers_after_the_broker_applied_it_or_after_its_bound():
    """SettledPort: the answer waits for the broker's metadata to reach the write's offset, at
    most settle_ms; past it the write (committed) is answered anyway; 0 waits not at all."""
    asked: list[tuple[int, int]] = []

    class Port(FakePort):
        async def _call(self, what: str, name: str, arg: Any, validate_only: bool) -> AdminAnswer:
            await super()._call(what, name, arg, validate_only)
            return AdminAnswer(metadata_offset=None if validate_only else 41)

    def applied_after(ok: bool):
        async def applied(offset: int, timeout_ms: int) -> bool:
            asked.append((offset, timeout_ms))
            return ok
        return applied

    change = AlterConfigRequest(set={"retention_ms": 5})
    assert run(admin.SettledPort(Port(), applied_after(True), 2000).alter_config("t", change)).metadata_offset == 41
    assert run(admin.SettledPort(Port(), applied_after(False), 500).delete_topic("t")).metadata_offset == 41
    run(admin.SettledPort(Port(), applied_after(True), 0).delete_topic("t"))
    run(admin.SettledPort(Port(), applied_after(True), 2000).delete_topic("t", validate_only=True))
    assert asked == [(41, 2000), (41, 500)]
