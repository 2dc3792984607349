"""One partition replica's protocol core: events in, actions out, no I/O.

- `core.Replica` — `step(event) -> Ready`; leader, follower and quorum-election roles.
- `events` / `actions` — frozen keyword-only values going in and coming out.
- `watermark` — pure high-watermark arithmetic (checked against an oracle).
- the one epoch comparison every handler makes first is `common/epochs.py`'s `check_epoch`.
- `state` — the partition state and replication config the core obeys.
- `logview` — the read-only part of the partition log the core may look at.

The seeded simulation that checks it lives in tests/sim/.
"""
