# Run with `scripts/up` going, from the checkout root: .venv/bin/python example.py
from dataplane.client.sync import Admin, Consumer, Producer

Admin().create_topic("events", partitions=3, replication_factor=3, exist_ok=True)
with Producer(acks="all") as producer:
    sent = producer.send_and_wait("events", b"hello", key=b"user-1")
    print(sent)
with Consumer() as consumer:
    consumer.assign([(sent.topic, sent.partition)])
    consumer.seek((sent.topic, sent.partition), sent.offset)
    print([r.value for r in consumer.poll(timeout_ms=5000)])
