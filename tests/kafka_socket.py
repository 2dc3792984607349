"""A blocking Kafka connection speaking raw frames, for tests of the Kafka port."""
from __future__ import annotations

import socket
import struct
from typing import Any

from dataplane.kafka import messages


class KafkaSocket:
    """A blocking Kafka connection speaking raw frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def header(self, api_key: int, version: int, *, flexible: bool = False) -> bytes:
        self.correlation_id += 1
        header = struct.pack(">hhi", api_key, version, self.correlation_id) + struct.pack(">h", 4) + b"test"
        return header + (b"\0" if flexible else b"")  # v2 headers end with (empty) tagged fields

    def read_frame(self) -> bytes | None:
        """The next answer's payload, None if the broker closed the connection."""
        size = self._read(4)
        if size is None:
            return None
        payload = self._read(struct.unpack(">i", size)[0])
        assert payload is not None, "connection closed inside an answer"
        return payload

    def _read(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        schema = messages.request_schema(api_key, version)
        flexible = ".v2." in schema.__header_schema__.__module__  # request header v2: flexible versions
        self.send_frame(self.header(api_key, version, flexible=flexible) + messages.encode(messages.build(schema, body)))
        payload = self.read_frame()
        assert payload is not None, f"API {api_key} v{version}: the connection was closed"
        response = messages.response_schema(api_key, version)
        header, used = messages.decode(response.__header_schema__, payload)
        assert header.correlation_id == self.correlation_id
        return messages.decode(response, payload, used)[0]

    def closed_by_broker(self) -> bool:
        return self.read_frame() is None
