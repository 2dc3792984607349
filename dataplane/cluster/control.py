"""The control channel of `biplane up`'s supervisor: a small HTTP endpoint on 127.0.0.1 that
`biplane stop|start|restart broker|controller ID` talk to.

    POST /v1/children/{broker|controller}/{id}/{stop|start|restart}   -> {"ok", "message", "pid"}
    GET  /v1/children                                                 -> {"children": [...]}

Every request carries `Authorization: Bearer <admin token>`; the token is in the cluster file,
which only its owner can read. The HTTP thread does not touch a process: it hands the command
to the supervisor's loop through a bounded queue and waits for the loop's answer.
"""
from __future__ import annotations

import hmac
import json
import queue
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

VERBS = ("stop", "start", "restart")
KINDS = ("broker", "controller")
COMMANDS_QUEUED_MAX = 16


@dataclass(frozen=True, kw_only=True)
class Reply:
    ok: bool
    message: str
    pid: int | None = None
    status: int = 200


@dataclass(frozen=True, kw_only=True)
class Command:
    verb: str
    child: str                       # "broker 2", "controller 1"
    reply: "queue.Queue[Reply]" = field(default_factory=lambda: queue.Queue(maxsize=1), compare=False)


class ControlServer:
    """Serves the control channel on a free loopback port until `close()`."""

    def __init__(self, *, token: str, children: Callable[[], list[dict[str, Any]]], reply_wait_s: float) -> None:
        self.commands: "queue.Queue[Command]" = queue.Queue(maxsize=COMMANDS_QUEUED_MAX)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:   # quiet: the supervisor logs commands
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                given = self.headers.get("Authorization", "")
                if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    return True
                self._answer(401, {"ok": False, "message": "a wrong or missing admin token"})
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path.rstrip("/") != "/v1/children":
                    self._answer(404, {"ok": False, "message": f"no such path {self.path}"})
                    return
                self._answer(200, {"ok": True, "children": children()})

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                parts = self.path.strip("/").split("/")
                if len(parts) != 5 or parts[:2] != ["v1", "children"] or parts[2] not in KINDS or parts[4] not in VERBS:
                    self._answer(404, {"ok": False, "message": f"no such path {self.path}; use "
                                       "/v1/children/{broker|controller}/{id}/{stop|start|restart}"})
                    return
                command = Command(verb=parts[4], child=f"{parts[2]} {parts[3]}")
                try:
                    server.commands.put_nowait(command)
                except queue.Full:
                    self._answer(503, {"ok": False, "message": "too many commands waiting; try again"})
                    return
                try:
                    reply = command.reply.get(timeout=reply_wait_s)
                except queue.Empty:
                    self._answer(504, {"ok": False, "message": f"no answer from the supervisor within "
                                       f"{reply_wait_s:.0f} s; see its log"})
                    return
                self._answer(reply.status, {"ok": reply.ok, "message": reply.message, "pid": reply.pid})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="biplane-up-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        # Anyone still waiting gets an answer rather than a timeout.
        while True:
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                break
            command.reply.put(Reply(ok=False, message="the cluster is shutting down", status=409))


class ControlError(Exception):
    """The control channel could not be reached or refused the command; the message says why."""


def send_command(url: str, token: str, *, kind: str, node_id: str, verb: str, timeout_s: float) -> Reply:
    request = urllib.request.Request(f"{url}/v1/children/{kind}/{node_id}/{verb}", data=b"", method="POST")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read())
            return Reply(ok=bool(body.get("ok")), message=str(body.get("message", "")), pid=body.get("pid"),
                         status=response.status)
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
            return Reply(ok=False, message=str(body.get("message", exc.reason)), pid=body.get("pid"), status=exc.code)
        except ValueError:
            raise ControlError(f"the supervisor's control channel at {url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ControlError(f"cannot reach the supervisor's control channel at {url}: {reason}") from None
