"""confluent-kafka's AdminClient (librdkafka) against a real cluster's Kafka port: it creates,
describes, alters, grows and deletes topics; each call is forwarded to the controller and
shows in the controller's own view (the admin API), and refusals come back per topic with
Kafka's error codes."""
from __future__ import annotations

import time

import pytest

from cluster_harness import Cluster
from controller_harness import http

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

pytestmark = pytest.mark.slow


def controller_topic(c: Cluster, name: str) -> dict | None:
    r = http("GET", c.api_url + f"/v1/topics/{name}")
    return r.body if r.status == 200 else None


def wait(check, what: str, timeout_s: float = 20):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_admin_client_creates_describes_alters_grows_and_deletes_a_topic(tmp_path):
    with Cluster(tmp_path, brokers=3) as c:
        client = AdminClient({"bootstrap.servers": c.kafka_bootstrap})

        checked = client.create_topics([NewTopic("orders", num_partitions=2, replication_factor=3),
                                        NewTopic("too-wide", num_partitions=1, replication_factor=4)],
                                       validate_only=True)
        checked["orders"].result(20)
        with pytest.raises(confluent_kafka.KafkaException) as too_wide:
            checked["too-wide"].result(20)
        assert too_wide.value.args[0].code() == confluent_kafka.KafkaError.INVALID_REPLICATION_FACTOR
        assert controller_topic(c, "orders") is None   # validate_only created nothing

        futures = client.create_topics([
            NewTopic("orders", num_partitions=2, replication_factor=3,
                     config={"retention.ms": "60000", "biplane.commit.policy": "quorum"}),
            NewTopic("recompressed", num_partitions=1, replication_factor=1, config={"compression.type": "zstd"})],
            operation_timeout=15)
        futures["orders"].result(20)
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            futures["recompressed"].result(20)
        assert refused.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG
        assert "never recompress" in refused.value.args[0].str()
        topic = controller_topic(c, "orders")
        assert topic is not None and len(topic["partitions"]) == 2
        assert topic["config"]["retention_ms"] == 60000 and topic["config"]["commit_policy"] == "quorum"
        assert controller_topic(c, "recompressed") is None

        with pytest.raises(confluent_kafka.KafkaException) as exists:
            client.create_topics([NewTopic("orders", 1, 1)])["orders"].result(20)
        assert exists.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS

        def described() -> dict:
            resource = ConfigResource(ConfigResource.Type.TOPIC, "orders")
            try:
                return client.describe_configs([resource])[resource].result(20)
            except confluent_kafka.KafkaException:
                return {}   # the broker's metadata may not have the topic yet
        configs = wait(described, "the broker describes the new topic")
        assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
        assert configs["cleanup.policy"].value == "delete" and configs["segment.ms"].is_default
        assert configs["biplane.commit.policy"].value == "quorum"

        resource = ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[
            ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
        client.incremental_alter_configs([resource])[resource].result(20)
        assert controller_topic(c, "orders")["config"]["retention_ms"] == 120000

        bad = ConfigResource(ConfigResource.Type.TOPIC, "orders", set_config={"min.insync.replicas": "9"})
        with pytest.raises(confluent_kafka.KafkaException) as invalid:
            client.alter_configs([bad])[bad].result(20)
        assert invalid.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG
        assert "min.insync.replicas=9 exceeds" in invalid.value.args[0].str()
        assert controller_topic(c, "orders")["config"]["min_insync_replicas"] == 1

        client.create_partitions([NewPartitions("orders", 4)])["orders"].result(20)
        assert len(controller_topic(c, "orders")["partitions"]) == 4
        c.wait_leader("orders", 3)
        with pytest.raises(confluent_kafka.KafkaException) as shrink:
            client.create_partitions([NewPartitions("orders", 2)])["orders"].result(20)
        assert shrink.value.args[0].code() == confluent_kafka.KafkaError.INVALID_PARTITIONS
        assert "already has 4 partitions" in shrink.value.args[0].str()

        client.delete_topics(["orders"], operation_timeout=15)["orders"].result(20)
        assert controller_topic(c, "orders") is None


def test_auto_create_topics_makes_a_topic_a_client_names_with_the_brokers_defaults(tmp_path):
    """--auto-create-topics (Kafka's auto.create.topics.enable): a Metadata request naming an
    unknown topic creates it with --default-partitions and the default replication factor
    (3 here: three live brokers), answered LEADER_NOT_AVAILABLE until its leaders are known;
    a client that says no (Metadata v4+ allow_auto_topic_creation=false) creates nothing,
    and an invalid name is refused with INVALID_TOPIC."""
    from kafka_socket import KafkaSocket
    with Cluster(tmp_path, brokers=3, broker_args=["--auto-create-topics", "--default-partitions", "2"]) as c:
        port = c.brokers[1].kafka_port
        sock = KafkaSocket(port)
        try:
            refused = sock.call(3, 8, {"topics": [{"name": "not-wanted"}], "allow_auto_topic_creation": False,
                                       "include_cluster_authorized_operations": False,
                                       "include_topic_authorized_operations": False})
            assert [int(t.error_code) for t in refused.topics] == [3]  # UNKNOWN_TOPIC_OR_PARTITION
            bad = sock.call(3, 8, {"topics": [{"name": "x" * 300}], "allow_auto_topic_creation": True,
                                   "include_cluster_authorized_operations": False,
                                   "include_topic_authorized_operations": False})
            assert [int(t.error_code) for t in bad.topics] == [17]  # INVALID_TOPIC
        finally:
            sock.close()
        assert controller_topic(c, "not-wanted") is None

        delivered: list[tuple[int, int]] = []
        producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap, "acks": "all",
                                             "allow.auto.create.topics": True})
        for i in range(10):
            producer.produce("auto", value=b"%d" % i, partition=i % 2,
                             on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset()))
                             if err is None else None)
        assert producer.flush(30) == 0
        assert len(delivered) == 10
        topic = controller_topic(c, "auto")
        assert topic is not None and len(topic["partitions"]) == 2
        assert all(len(p["replicas"]) == 3 for p in topic["partitions"])
        for b in c.brokers.values():
            assert "Traceback" not in b.log_tail(400)


def test_a_client_reads_its_admin_writes_back_from_the_broker_it_wrote_through(tmp_path):
    """An admin write answers once the broker that forwarded it has applied it: a topic created
    through a broker is described by that broker at once, and every config change is read back
    at once, never the value before it (read your writes, as Redpanda's CreateTopics waits for
    its metadata). Raw frames to one broker, so no client retries or picks another broker."""
    from kafka_socket import KafkaSocket
    with Cluster(tmp_path, brokers=3) as c:
        sock = KafkaSocket(c.brokers[2].kafka_port)
        try:
            def describe(name: str) -> tuple[int, str | None]:
                answer = sock.call(32, 1, {"include_synonyms": False, "resources": [
                    {"resource_type": 2, "resource_name": name, "configuration_keys": ["retention.ms"]}]})
                result, = answer.results
                return int(result.error_code), (result.configs[0].value if result.configs else None)

            for i in range(5):
                created = sock.call(19, 4, {"timeout": 5000, "validate_only": False, "topics": [
                    {"name": f"fresh-{i}", "num_partitions": 1, "replication_factor": 3, "assignments": [],
                     "configs": [{"name": "retention.ms", "value": str(60_000 + i)}]}]})
                assert [int(t.error_code) for t in created.topics] == [0]
                assert describe(f"fresh-{i}") == (0, str(60_000 + i))

            for i in range(20):
                value = str(100_000 + i)
                altered = sock.call(44, 0, {"validate_only": False, "resources": [
                    {"resource_type": 2, "resource_name": "fresh-0", "configs": [
                        {"name": "retention.ms", "config_operation": 0, "value": value}]}]})
                assert [int(r.error_code) for r in altered.responses] == [0]
                assert describe("fresh-0") == (0, value), f"change {i}: the broker described an older value"
        finally:
            sock.close()
