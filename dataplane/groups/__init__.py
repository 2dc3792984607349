"""Consumer groups: Kafka's classic group protocol, served by the brokers.

- `events.py`: what goes into the coordinator core and what comes out.
- `records.py`: how group state and committed offsets are stored as keyed records of
  the internal offsets topic (compaction keeps the latest per group and per offset).
- `state.py`: a group and its members, as the core keeps them.
- `coordinator.py`: the pure core: every rule of the protocol (states, generations,
  fencing, static membership, commits, retention); no sockets, clocks or threads.
- `placement.py`: which partition of the offsets topic (and so which broker) a group has.
- `driver.py`: the broker's asyncio driver: one core per offsets partition this broker
  leads, loaded from that partition, its writes produced through the broker's own
  admission path with acks=all, its answers released only once those writes commit.
- `lag.py`: what operators see: the groups' committed offsets copied from the cores, and
  the bounded form the brokers' usage reports carry to the controller (GET /v1/groups).
"""
