"""Biplane's Kafka API listener: unmodified Kafka clients on a port of their own.

- `listener.py`: connections (the broker's pipelined ones: answers in request order,
  a frame cap, a malformed request closing only its own connection).
- `protocol.py`: frames, request headers v1/v2, response headers v0/v1.
- `registry.py`: which APIs and versions are served, and by which handler.
- `messages.py`: kio (generated from Kafka's JSON schemas) for headers and bodies;
  `hotpath.py`: Produce requests and Fetch responses by hand, so records stay the
  request's and the log's own bytes.
- One module per API family: `produce.py`, `fetch.py`, `offsets.py` (ListOffsets,
  OffsetForLeaderEpoch), `metadata.py` (ApiVersions, Metadata), `producer_ids.py`
  (InitProducerId). They answer through the broker's own `RequestHandler`
  (dataplane/broker/server.py): the same admission path, cores and error codes as
  Biplane's protocol.

Adding an API: in a handler module, register an async function (or a plain one
returning an awaitable, if it must act in arrival order before it returns) taking
the decoded request (`registry.Request`: api key, version, correlation id, client
id, `body` = the kio request entity of that version) and a `registry.Context` (the
broker's request handler, its controller client, broker id, cluster id), and
returning the kio response entity of `request.version` (build it with
`messages.build(messages.response_schema(key, request.version), {...})`: fields a
version lacks are dropped), or `registry.Encoded` frame parts, or None for no answer:

    @register(19, "CreateTopics", (2, 4))
    async def create_topics(request: Request, context: Context) -> Answer: ...

then add the module to the import list in `handlers.py`. ApiVersions advertises it,
and other versions of it close the connection (Kafka's behaviour), except
`advertised_from` versions below the served range, which reach the handler with
`request.served` False so it can answer UNSUPPORTED_VERSION.
"""
