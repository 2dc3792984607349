"""The broker control RPC of a real single-node controller: sessions, fencing, ISR, metadata, producer ids."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from controller_harness import SECRET, Controller, http, make_specs, wait_leader, wait_until

SESSION_TIMEOUT_MS = 1500
WINDOW = 40


class Brokers:
    """Heartbeats brokers every 150 ms from a thread, reporting the controller's current offset."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.alive: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rpc(self, path: str, body=None, method="POST", secret=SECRET):
        return http(method, self.url + "/rpc/v1/" + path, body, token=None, secret=secret)

    def register(self, broker_id: int, incarnation: str | None = None) -> None:
        r = self.rpc("register", {"broker_id": broker_id, "incarnation_id": incarnation or f"inc-{broker_id}",
                                  "host": "127.0.0.1", "port": 9100 + broker_id})
        assert r.status == 200, r.body
        self.alive.add(broker_id)

    def heartbeat(self, broker_id: int, incarnation: str | None = None, offset: int | None = None):
        if offset is None:
            offset = http("GET", self.url + "/v1/health", token=None).body["metadata_offset"]
        return self.rpc("heartbeat", {"broker_id": broker_id, "incarnation_id": incarnation or f"inc-{broker_id}",
                                      "metadata_offset": offset})

    def _run(self) -> None:
        while not self._stop.is_set():
            for b in list(self.alive):
                try:
                    self.heartbeat(b)
                except OSError:
                    pass
            time.sleep(0.15)

    def start(self) -> "Brokers":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def fenced(self, broker_id: int) -> bool:
        brokers = http("GET", self.url + "/v1/brokers").body["brokers"]
        return next(b["fenced"] for b in brokers if b["broker_id"] == broker_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = make_specs(1)[0]
    c = Controller(spec, [spec], tmp_path_factory.mktemp("rpc"),
                   ["--session-timeout-ms", str(SESSION_TIMEOUT_MS), "--cluster-secret", SECRET,
                    "--metadata-window-records", str(WINDOW)])
    brokers = None
    try:
        c.start()
        wait_leader([c], timeout_s=20)
        brokers = Brokers(spec.api_url).start()
        for b in (1, 2, 3):
            brokers.register(b)
        wait_until(lambda: not any(brokers.fenced(b) for b in (1, 2, 3)), 10, "brokers unfenced")
        yield c, brokers
    finally:
        if brokers is not None:
            brokers.stop()
        c.kill()


def test_rpc_needs_the_cluster_secret(cluster):
    _, brokers = cluster
    for secret in (None, "wrong"):
        r = brokers.rpc("heartbeat", {"broker_id": 1, "incarnation_id": "inc-1", "metadata_offset": 0}, secret=secret)
        assert r.status == 401 and r.error["code"] == "UNAUTHORIZED"


def test_register_again_with_same_incarnation_changes_nothing(cluster):
    _, brokers = cluster
    before = http("GET", brokers.url + "/v1/health", token=None).body["metadata_offset"]
    r = brokers.rpc("register", {"broker_id": 1, "incarnation_id": "inc-1", "host": "127.0.0.1", "port": 9101})
    assert r.status == 200
    assert http("GET", brokers.url + "/v1/health", token=None).body["metadata_offset"] == before


def test_heartbeat_from_unknown_or_stale_broker_is_refused(cluster):
    _, brokers = cluster
    unknown = brokers.heartbeat(77, "inc-77")
    assert unknown.status == 400 and unknown.error["field"] == "broker_id"
    stale = brokers.heartbeat(1, "old-incarnation")
    assert stale.status == 409 and stale.error["code"] == "STALE_BROKER_EPOCH"


@pytest.mark.parametrize("body, field", [
    ({"broker_id": "one", "incarnation_id": "x", "metadata_offset": 0}, "broker_id"),
    ({"broker_id": 1, "incarnation_id": "inc-1", "metadata_offset": 0, "extra": 1}, "extra"),
    ({"broker_id": 1, "incarnation_id": "inc-1"}, "metadata_offset"),
])
def test_malformed_heartbeat_is_400(cluster, body, field):
    _, brokers = cluster
    r = brokers.rpc("heartbeat", body)
    assert r.status == 400 and r.error["field"] == field


def test_broker_that_stops_heartbeating_is_fenced_and_loses_leadership(cluster):
    c, brokers = cluster
    brokers.register(4)
    wait_until(lambda: not brokers.fenced(4), 10, "broker 4 unfenced")
    r = http("POST", c.spec.api_url + "/v1/topics", {"name": "fence-me", "replica_assignment": [[4, 1]]})
    assert r.status == 201, r.body
    assert r.body["partitions"][0]["leader"] == 4
    brokers.alive.discard(4)
    wait_until(lambda: brokers.fenced(4), 10 * SESSION_TIMEOUT_MS / 1000, "broker 4 fenced")
    p = http("GET", c.spec.api_url + "/v1/topics/fence-me/partitions").body["partitions"][0]
    assert p["leader"] == 1 and 4 not in p["isr"]
    # Coming back: heartbeats caught up unfence it again.
    brokers.alive.add(4)
    wait_until(lambda: not brokers.fenced(4), 10, "broker 4 unfenced again")


def test_heartbeat_asking_for_shutdown_is_answered_fenced_with_leaderships_moved(cluster):
    """Controlled shutdown: the heartbeat with want_shutdown is answered only once the fence
    (and the leadership move) has committed, so its answer already says fenced, and the
    metadata up to its offset has the new leader."""
    c, brokers = cluster
    brokers.register(5)
    wait_until(lambda: not brokers.fenced(5), 10, "broker 5 unfenced")
    r = http("POST", c.spec.api_url + "/v1/topics", {"name": "shut-me", "replica_assignment": [[5, 1]]})
    assert r.status == 201 and r.body["partitions"][0]["leader"] == 5, r.body
    brokers.alive.discard(5)
    offset = http("GET", brokers.url + "/v1/health", token=None).body["metadata_offset"]
    answer = brokers.rpc("heartbeat", {"broker_id": 5, "incarnation_id": "inc-5", "metadata_offset": offset,
                                       "want_shutdown": True})
    assert answer.status == 200 and answer.body["fenced"] is True, answer.body
    p = http("GET", c.spec.api_url + "/v1/topics/shut-me/partitions").body["partitions"][0]
    assert p["leader"] == 1 and p["isr"] == [1], p
    assert answer.body["metadata_offset"] > offset
    # Asked once, it stays fenced: a later heartbeat without the flag does not unfence it.
    brokers.heartbeat(5, "inc-5")
    time.sleep(0.3)
    assert brokers.fenced(5)


def test_alter_isr_with_stale_epochs_is_refused_and_current_one_applies(cluster):
    c, brokers = cluster
    r = http("POST", c.spec.api_url + "/v1/topics", {"name": "isr", "replica_assignment": [[1, 2, 3]]})
    assert r.status == 201, r.body
    p = r.body["partitions"][0]
    request = {"broker_id": p["leader"], "topic": "isr", "partition": 0, "leader_epoch": p["leader_epoch"],
               "partition_epoch": p["partition_epoch"], "new_isr": [1, 2]}
    stale = brokers.rpc("alter-isr", {**request, "partition_epoch": p["partition_epoch"] + 5})
    assert stale.status == 409 and stale.error["code"] == "INVALID_UPDATE_VERSION", stale.body
    fenced = brokers.rpc("alter-isr", {**request, "leader_epoch": p["leader_epoch"] + 1})
    assert fenced.status == 409, fenced.body
    ok = brokers.rpc("alter-isr", request)
    assert ok.status == 200, ok.body
    assert ok.body["partition"]["isr"] == [1, 2]
    assert ok.body["partition"]["partition_epoch"] > p["partition_epoch"]
    again = brokers.rpc("alter-isr", request)   # the epoch it names is now stale
    assert again.status == 409


def test_metadata_long_poll_returns_new_records_when_they_commit(cluster):
    c, brokers = cluster
    offset = http("GET", c.spec.api_url + "/v1/health", token=None).body["metadata_offset"]
    result = {}

    def poll():
        result["reply"] = brokers.rpc(f"metadata?after_offset={offset}&max_wait_ms=5000", method="GET")
    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.2)
    assert http("POST", c.spec.api_url + "/v1/topics", {"name": "polled"}).status == 201
    t.join(timeout=10)
    reply = result["reply"]
    assert reply.status == 200, reply.body
    records = reply.body["records"]
    assert records and records[0]["offset"] == offset + 1
    assert [r["offset"] for r in records] == list(range(offset + 1, offset + 1 + len(records)))
    assert any(r["record"]["type"] == "create_topic" and r["record"]["name"] == "polled" for r in records)


def test_metadata_poll_at_the_end_times_out_empty(cluster):
    c, brokers = cluster
    offset = http("GET", c.spec.api_url + "/v1/health", token=None).body["metadata_offset"]
    reply = brokers.rpc(f"metadata?after_offset={offset}&max_wait_ms=100", method="GET")
    assert reply.status == 200 and reply.body["records"] == [] and reply.body["offset"] >= offset


def test_metadata_far_behind_or_ahead_gets_the_whole_image(cluster):
    c, brokers = cluster
    for i in range(3):   # make sure more than the retained window of records exists
        http("POST", c.spec.api_url + "/v1/topics", {"name": f"bulk-{i}", "partitions": WINDOW // 2})
    reply = brokers.rpc("metadata?after_offset=-1&max_wait_ms=0", method="GET")
    assert reply.status == 200 and "image" in reply.body
    image = reply.body["image"]
    assert image["offset"] == reply.body["offset"]
    assert {"bulk-0", "bulk-1", "bulk-2"} <= {t["name"] for t in image["topics"]}
    ahead = brokers.rpc(f"metadata?after_offset={reply.body['offset'] + 1000}&max_wait_ms=0", method="GET")
    assert "image" in ahead.body


@pytest.mark.parametrize("query", ["after_offset=x", "after_offset=-5", "max_wait_ms=999999"])
def test_bad_metadata_queries_are_400(cluster, query):
    _, brokers = cluster
    assert brokers.rpc(f"metadata?{query}", method="GET").status == 400


def test_producer_id_blocks_are_disjoint_and_consecutive(cluster):
    _, brokers = cluster
    a = brokers.rpc("allocate-producer-ids", {"broker_id": 1, "count": 100})
    b = brokers.rpc("allocate-producer-ids", {"broker_id": 2, "count": 50})
    assert a.status == 200 and b.status == 200, (a.body, b.body)
    assert a.body["size"] == 100 and b.body["first_id"] == a.body["first_id"] + 100
    unknown = brokers.rpc("allocate-producer-ids", {"broker_id": 99, "count": 10})
    assert unknown.status == 400 and unknown.error["field"] == "broker_id"
    too_many = brokers.rpc("allocate-producer-ids", {"broker_id": 1, "count": 0})
    assert too_many.status == 400 and too_many.error["field"] == "count"


def test_election_report_for_a_partition_not_in_election_is_not_accepted(cluster):
    _, brokers = cluster
    r = brokers.rpc("election-report", {"broker_id": 1, "topic": "isr", "partition": 0, "fenced_epoch": 0,
                                        "last_epoch": 0, "end_offset": 0})
    assert r.status == 200 and r.body["accepted"] is False and "not waiting" in r.body["reason"]


def test_control_client_speaks_the_rpc_and_raises_the_controllers_codes(cluster):
    c, _ = cluster
    from common.control_client import ControlClient
    from common.errors import BiplaneError
    from common.requests import AllocateProducerIdsRequest, HeartbeatRequest, RegisterBrokerRequest

    async def run():
        async with ControlClient([c.spec.api_url], secret=SECRET) as cc:
            await cc.register(RegisterBrokerRequest(broker_id=9, incarnation_id="inc-9", host="127.0.0.1", port=9109))
            first = await cc.fetch_metadata(after_offset=-1, wait_ms_max=0)
            assert first.image is not None or first.records
            beat = await cc.heartbeat(HeartbeatRequest(broker_id=9, incarnation_id="inc-9",
                                                       metadata_offset=first.offset))
            assert set(beat.model_dump()) >= {"fenced", "metadata_offset"}
            later = await cc.fetch_metadata(after_offset=first.offset, wait_ms_max=50)
            assert all(o > first.offset for o, _ in later.records) and later.offset >= first.offset
            block = await cc.allocate_producer_ids(AllocateProducerIdsRequest(broker_id=9, count=7))
            start, size = block.first_id, block.size
            assert size == 7 and start >= 0
            with pytest.raises(BiplaneError) as info:
                await cc.heartbeat(HeartbeatRequest(broker_id=9, incarnation_id="old", metadata_offset=0))
            assert info.value.code.name == "STALE_BROKER_EPOCH"
        async with ControlClient([c.spec.api_url], secret="wrong", attempts_max=2) as bad:
            with pytest.raises(BiplaneError) as info:
                await bad.allocate_producer_ids(AllocateProducerIdsRequest(broker_id=9, count=1))
            assert info.value.code_name == "UNAUTHORIZED"  # an HTTP-only answer: not an ErrorCode
    asyncio.run(run())


def test_a_forwarded_create_topic_sends_only_the_fields_its_caller_set(cluster):
    """A broker forwards a Kafka client's CreateTopics with a replica assignment and no partition count
    (kafka-topics --replica-assignment): the controller must not see the model's default count of 1,
    which disagrees with the assignment's 2 partitions."""
    c, _ = cluster
    from common.control_client import ControlClient
    from common.requests import CreateTopicRequest

    async def run():
        async with ControlClient([c.spec.api_url], secret=SECRET) as cc:
            await cc.create_topic(CreateTopicRequest(name="forwarded-assignment",
                                                     replica_assignment=((1, 2, 3), (2, 3, 1))))
    asyncio.run(run())
    topic = http("GET", c.spec.api_url + "/v1/topics/forwarded-assignment").body
    assert [p["replicas"] for p in topic["partitions"]] == [[1, 2, 3], [2, 3, 1]]


def test_incremental_usage_reports_merge_on_their_base_and_are_refused_on_any_other(cluster):
    """common/usage.py: a report that carries only what changed is merged onto the report it
    names; on a base this controller does not have (another number, another process of the
    broker) it is refused with usage_resend, and the kept figures stay as they were."""
    c, brokers = cluster

    def register(incarnation):
        r = brokers.rpc("register", {"broker_id": 8, "incarnation_id": incarnation, "host": "127.0.0.1",
                                     "port": 9108})
        assert r.status == 200, r.body

    def replica(partition, size):
        return {"topic": "usage", "partition": partition, "size_bytes": size, "log_start_offset": 0,
                "log_end_offset": size, "high_watermark": size}

    def beat(incarnation, **report):
        usage = {"broker_id": 8, "at_ms": 1, "disk_total_bytes": 10, "disk_used_bytes": 1, "disk_free_bytes": 9,
                 **report}
        offset = http("GET", brokers.url + "/v1/health", token=None).body["metadata_offset"]
        r = brokers.rpc("heartbeat", {"broker_id": 8, "incarnation_id": incarnation, "metadata_offset": offset,
                                      "usage": usage})
        assert r.status == 200, r.body
        return r.body["usage_resend"]

    def sizes():
        parts = http("GET", c.spec.api_url + "/v1/topics/usage/offsets").body["partitions"]
        return [p.get("size_bytes") for p in parts]

    register("inc-8a")
    r = http("POST", c.spec.api_url + "/v1/topics", {"name": "usage", "replica_assignment": [[8], [8]]})
    assert r.status == 201, r.body
    assert beat("inc-8a", replicas=[replica(0, 5), replica(1, 7)], report_seq=1) is False
    wait_until(lambda: sizes() == [5, 7], 10, "the complete report kept")   # once 8 leads (unfenced)
    assert beat("inc-8a", replicas=[replica(1, 9)], report_seq=2, base_seq=1) is False
    assert sizes() == [5, 9]
    assert beat("inc-8a", replicas=[replica(0, 1)], report_seq=4, base_seq=3) is True     # not the kept base
    assert sizes() == [5, 9]
    assert beat("inc-8a", replicas=[], report_seq=3, base_seq=2, replicas_removed=[["usage", 0]]) is False
    assert sizes() == [None, 9]
    register("inc-8b")
    assert beat("inc-8b", replicas=[replica(0, 1)], report_seq=2, base_seq=1) is True     # another process's base
    assert beat("inc-8b", replicas=[replica(1, 2)], report_seq=3) is False             # complete: taken
