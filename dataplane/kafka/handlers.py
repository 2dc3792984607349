"""Every Kafka API handler, registered; and the one call the listener makes.

Importing this module imports each handler module, which registers its APIs
(registry.py). A new handler module is added to the import list below.
"""
from __future__ import annotations

from typing import Awaitable

from dataplane.kafka import (  # noqa: F401  (they register)
    admin, fetch, groups, metadata, offsets, produce, producer_ids,
)
from dataplane.kafka.registry import APIS, Answer, Context, Request


def start(request: Request, context: Context) -> Awaitable[Answer]:
    """Begin handling now (produce: the cores have it on return); await the answer."""
    api = APIS[request.api_key]
    # Counted by version too: /metrics then shows which versions the clients in use negotiate.
    context.requests.counters.request(f"Kafka{api.name}v{request.version}")
    return api.handle(request, context)
