"""Scrape a process's /metrics and read it with prometheus_client's own text parser (tests)."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# The sample names a family of each type is written as (a counter `x` is `x_total`, ...).
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
             "unknown": ("",), "stateset": ("",), "gaugehistogram": ("_bucket", "_gcount", "_gsum")}


class Scrape:
    """One scrape: `value(name, **labels)` sums the samples of that exact sample name whose
    labels include the given ones; `names()` is every sample name the families stand for."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, name: str, **labels: str) -> list:
        return [s for f in self.families.values() for s in f.samples
                if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        found = self.samples(name, **labels)
        assert found or self.has(name), f"{name} is not exposed"
        return sum(s.value for s in found)

    def has(self, name: str) -> bool:
        return name in self.names()

    def names(self) -> set[str]:
        return {f.name + suffix for f in self.families.values() for suffix in _SUFFIXES.get(f.type, ("",))}

    def type_of(self, family: str) -> str:
        return self.families[family].type


def scrape(port: int, host: str = "127.0.0.1", *, token: str | None = None, path: str = "/metrics") -> Scrape:
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain"), resp.headers["Content-Type"]
        return Scrape(resp.read().decode())
