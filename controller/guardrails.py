"""The admin API's guardrails that are not decisions about the metadata: a write rate per
token and the shape of a request body. Pure (time comes in as an argument); the HTTP edge
(`controller/api.py`, `controller/http_edge.py`) applies them.

The partition limits are a decision on the image and live with the topic decisions
(`controller/decisions/limits.py`), so a Kafka client's CreateTopics meets them too.

Write rate: a token bucket per admin token, counted in partition changes, as Kafka's
controller mutation quota (KIP-599) counts them: a write costs one unit per partition it
creates or deletes, and at least one. A write is let in while the bucket is not empty and
is charged after it ran, so one large write may take the bucket below zero; the writes
after it wait until the rate has refilled it. A steady flood of small writes is held to
`rate_per_s` writes a second, and a churn of large topics to `rate_per_s` partitions a
second, which is what a broker has to create or delete.
"""
from __future__ import annotations

import dataclasses
import math
import re

WRITE_RATE_PER_S_DEFAULT = 100.0
WRITE_BURST_DEFAULT = 1000.0         # room for one topic at the default per-topic limit
BODY_BYTES_MAX_DEFAULT = 1024 * 1024
JSON_DEPTH_MAX_DEFAULT = 32          # the deepest request model nests 4 levels


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApiLimits:
    """The admin API's limits (`biplane controller` flags, named in every refusal)."""

    write_rate_per_s: float = WRITE_RATE_PER_S_DEFAULT
    write_burst: float = WRITE_BURST_DEFAULT
    body_bytes_max: int = BODY_BYTES_MAX_DEFAULT
    json_depth_max: int = JSON_DEPTH_MAX_DEFAULT

    def __post_init__(self) -> None:
        if not (self.write_rate_per_s > 0 and math.isfinite(self.write_rate_per_s)):
            raise ValueError(f"write_rate_per_s must be a finite number > 0, got {self.write_rate_per_s}")
        if not (self.write_burst >= 1 and math.isfinite(self.write_burst)):
            raise ValueError(f"write_burst must be a finite number >= 1, got {self.write_burst}")
        if self.body_bytes_max < 2:
            raise ValueError(f"body_bytes_max must be >= 2 (an empty JSON object), got {self.body_bytes_max}")
        if self.json_depth_max < 1:
            raise ValueError(f"json_depth_max must be >= 1, got {self.json_depth_max}")


class WriteBuckets:
    """One token bucket per key (an admin token). `admit` before a write, `charge` after it."""

    KEYS_MAX = 1024   # bounds the memory a stream of distinct keys could take

    def __init__(self, *, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}   # key -> (level, at_s)

    def _level(self, key: str, now_s: float) -> float:
        level, at_s = self._buckets.get(key, (self.burst, now_s))
        return min(self.burst, level + max(0.0, now_s - at_s) * self.rate_per_s)

    def admit(self, key: str, now_s: float) -> float | None:
        """None when a write may go ahead now; otherwise the seconds until it may."""
        level = self._level(key, now_s)
        if level > 0:
            return None
        return (1e-9 - level) / self.rate_per_s

    def charge(self, key: str, units: float, now_s: float) -> None:
        if key not in self._buckets and len(self._buckets) >= self.KEYS_MAX:
            # Forget the fullest bucket: it is the one whose key has written least lately.
            del self._buckets[max(self._buckets, key=lambda k: self._level(k, now_s))]
        self._buckets[key] = (self._level(key, now_s) - units, now_s)


def retry_after_header(seconds: float) -> str:
    """Retry-After takes whole seconds; round up so a client that waits is let in."""
    return str(max(1, math.ceil(seconds)))


# A JSON string (escapes included; an unterminated one runs to the end) or one bracket.
# Brackets inside strings are skipped because the string is matched whole first.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def json_too_deep(raw: bytes, depth_max: int) -> bool:
    """True when `raw` nests objects and arrays more than `depth_max` deep. A scan, not a
    parse, so a body built to exhaust the parser's recursion is refused before it is parsed.
    Malformed JSON is left to the parser."""
    if raw.count(b"[") + raw.count(b"{") <= depth_max:
        return False
    depth = 0
    for match in _TOKEN.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > depth_max:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False
