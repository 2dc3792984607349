"""A confluent-kafka group member in a process of its own, for tests that kill it with
kill -9. Usage: kafka_group_member.py BOOTSTRAP GROUP TOPIC SESSION_TIMEOUT_MS

Prints `assigned p,p,...` on every assignment and `record PARTITION OFFSET VALUE` for each
record it processed, before committing that record's offset synchronously: a record
printed is processed, and at most the last one printed per partition is uncommitted.
"""
from __future__ import annotations

import sys

import confluent_kafka


def main() -> None:
    bootstrap, group, topic, session_ms = sys.argv[1:5]
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": int(session_ms),
        "heartbeat.interval.ms": max(100, int(session_ms) // 5)})

    def assigned(c: object, partitions: list) -> None:
        print("assigned " + ",".join(str(p.partition) for p in partitions), flush=True)

    consumer.subscribe([topic], on_assign=assigned)
    while True:
        m = consumer.poll(0.2)
        if m is None or m.error() is not None:
            continue
        print(f"record {m.partition()} {m.offset()} {m.value().decode()}", flush=True)
        consumer.commit(message=m, asynchronous=False)


if __name__ == "__main__":
    main()
