"""The admin commands of `biplane` over the controller's HTTP API.

    biplane topic create NAME [--partitions N] [--replication-factor R] [--config k=v ...]
    biplane topic list | describe NAME | delete NAME | alter NAME [--set k=v ...] [--reset k ...]
    biplane topic add-partitions NAME --partitions N [--replica-assignment 1,2:2,3]
    biplane cluster status | brokers
    biplane reassign TOPIC PARTITION BROKER[,BROKER...]    |  biplane reassign --list
    biplane elect [TOPIC:PARTITION ...]
    biplane snapshot take | list

Every command takes --controller URL (env BIPLANE_CONTROLLER; several URLs may be
given comma-separated, the first that answers is used), --token (env
BIPLANE_ADMIN_TOKEN) and --json. Writes sent to a follower follow its redirect
to the leader. Errors print the API's message and exit 1 (2 for usage errors).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

REDIRECTS_MAX = 3
UNAVAILABLE_WAIT_S = 10.0


class CliError(Exception):
    pass


class ApiClient:
    """A small synchronous client: JSON in and out, bearer token, manual redirects, retry on 503."""

    def __init__(self, urls: list[str], token: str | None, *, timeout_s: float = 15.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.token = token
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None) -> Any:
        deadline = time.monotonic() + UNAVAILABLE_WAIT_S
        while True:
            status, doc = self._call_any(method, path, body)
            if status == 503 and time.monotonic() < deadline and _retriable(doc):
                # No leader yet (an election is running): nothing was done, so retry. A 504
                # (outcome unknown) is not retried: the write may have happened.
                time.sleep(0.25)
                continue
            if status >= 400:
                err = doc.get("error", {}) if isinstance(doc, dict) else {}
                message = err.get("message") or (doc if isinstance(doc, str) else f"HTTP {status}")
                field = f" (field: {err['field']})" if err.get("field") else ""
                raise CliError(f"{err.get('code', 'HTTP_' + str(status))}: {message}{field}")
            return doc

    def _call_any(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        last: Exception | None = None
        for url in self.urls:
            try:
                return self._call_one(method, url + path, body)
            except (urllib.error.URLError, OSError) as exc:
                last = exc
        raise CliError(f"cannot reach the controller at {', '.join(self.urls)}: {last}")

    def _call_one(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(REDIRECTS_MAX + 1):
            req = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            if self.token:
                req.add_header("Authorization", f"Bearer {self.token}")
            try:
                with _OPENER.open(req, timeout=self.timeout_s) as resp:
                    return resp.status, _decode(resp.read())
            except urllib.error.HTTPError as exc:
                payload = _decode(exc.read())
                location = exc.headers.get("Location")
                if exc.code in (307, 308) and location:
                    url = urllib.parse.urljoin(url, location)
                    continue
                return exc.code, payload
        raise CliError(f"too many redirects (> {REDIRECTS_MAX}) starting at {url}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _decode(payload: bytes) -> Any:
    if not payload:
        return {}
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")


def _retriable(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("error", {}).get("retriable", False)


# ---------------------------------------------------------------- output

def table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def ids(values: list[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def partition_rows(partitions: list[dict]) -> list[list[Any]]:
    return [[p["topic"], p["partition"], p["leader"], ids(p["replicas"]), ids(p["isr"]), p["leader_epoch"],
             p["partition_epoch"], ids(p.get("adding", [])), ids(p.get("removing", []))] for p in partitions]


PARTITION_HEADERS = ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "LEADER_EPOCH", "EPOCH", "ADDING", "REMOVING"]


def parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def parse_pairs(pairs: list[str], what: str) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {pair!r} is not KEY=VALUE")
        out[key.strip()] = parse_value(value.strip())
    return out


# ---------------------------------------------------------------- commands

def parse_assignment(text: str) -> list[list[int]]:
    try:
        return [[int(b) for b in part.split(",")] for part in text.split(":")]
    except ValueError:
        raise CliError(f"--replica-assignment {text!r} is not like 1,2:2,3 (broker ids, ',' within a "
                       "partition, ':' between partitions)") from None


def local_cluster() -> tuple[str | None, str | None]:
    """Controller URLs and token of a `biplane up` cluster (./.biplane/cluster.json or
    $BIPLANE_CLUSTER), or (None, None) when there is none."""
    from dataplane.client.discovery import load_cluster_file
    from dataplane.client.errors import NoClusterError
    try:
        doc = load_cluster_file()
        urls = [c["api_url"] for _, c in sorted(doc["controllers"].items(), key=lambda kv: int(kv[0]))]
        return ",".join(urls), doc.get("admin_token")
    except (NoClusterError, KeyError, TypeError, ValueError):
        return None, None


def common_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    env_url, env_token = os.environ.get("BIPLANE_CONTROLLER"), os.environ.get("BIPLANE_ADMIN_TOKEN")
    local_url, local_token = local_cluster() if not (env_url and env_token) else (None, None)
    p.add_argument("--controller", default=env_url or local_url or "http://127.0.0.1:8080",
                   help="controller API URL(s), comma-separated (env BIPLANE_CONTROLLER; default: the "
                        "`biplane up` cluster in ./.biplane/cluster.json, else http://127.0.0.1:8080)")
    p.add_argument("--token", default=env_token or (local_token if not env_url or env_url == local_url else None),
                   help="admin bearer token (env BIPLANE_ADMIN_TOKEN; default: the `biplane up` cluster's)")
    p.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    return p


def client_of(args: argparse.Namespace) -> ApiClient:
    urls = [u.strip() for u in args.controller.split(",") if u.strip()]
    return ApiClient([u if "://" in u else "http://" + u for u in urls], args.token)


def run(fn, argv: list[str], prog: str, parser: argparse.ArgumentParser) -> int:
    args = parser.parse_args(argv)
    try:
        out = fn(args, client_of(args))
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    if out is not None:
        print(out)
    return 0


def emit(args: argparse.Namespace, doc: Any, text: str) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) if args.json else text


def topic_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Create, list, describe, alter or delete topics, or add partitions.")
    sub = parser.add_subparsers(dest="action", required=True)
    c = sub.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument("--replication-factor", type=int, default=1)
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--replica-assignment", help="per partition replica lists: 1,2:2,3:3,1")
    sub.add_parser("list", help="list topics")
    d = sub.add_parser("describe", help="a topic's config and partitions")
    d.add_argument("name")
    x = sub.add_parser("delete", help="delete a topic")
    x.add_argument("name")
    a = sub.add_parser("alter", help="set or reset config keys")
    a.add_argument("name")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--reset", action="append", default=[], metavar="KEY")
    g = sub.add_parser("add-partitions", help="grow a topic to N partitions in all (never fewer)")
    g.add_argument("name")
    g.add_argument("--partitions", type=int, required=True, help="the new total, larger than today's")
    g.add_argument("--replica-assignment", help="replica lists of the new partitions only: 1,2:2,3")
    # Let the shared options follow the action too: `biplane topic list --json`.
    for sp in (c, d, x, a, g, sub.choices["list"]):
        sp.add_argument("--controller", default=argparse.SUPPRESS)
        sp.add_argument("--token", default=argparse.SUPPRESS)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS)

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        if args.action == "create":
            body: dict[str, Any] = {"name": args.name, "partitions": args.partitions,
                                    "replication_factor": args.replication_factor,
                                    "config": parse_pairs(args.config, "--config")}
            if args.replica_assignment:
                body["replica_assignment"] = parse_assignment(args.replica_assignment)
                body["partitions"] = len(body["replica_assignment"])
                body["replication_factor"] = len(body["replica_assignment"][0])
            doc = api.call("POST", "/v1/topics", body)
            return emit(args, doc, f"created topic {doc['name']} ({len(doc['partitions'])} partitions, "
                                   f"metadata offset {doc['metadata_offset']})")
        if args.action == "list":
            doc = api.call("GET", "/v1/topics")
            return emit(args, doc, table([[t["name"], t["partitions"], t["replication_factor"], t["commit_policy"],
                                           t["replication_mode"]] for t in doc["topics"]],
                                         ["NAME", "PARTITIONS", "RF", "COMMIT_POLICY", "MODE"]))
        name = urllib.parse.quote(args.name, safe="")
        if args.action == "describe":
            doc = api.call("GET", f"/v1/topics/{name}")
            config = "\n".join(f"  {k} = {v}" for k, v in sorted(doc["config"].items()))
            return emit(args, doc, f"topic {doc['name']} (id {doc['topic_id']})\nconfig:\n{config}\n\n"
                                   + table(partition_rows(doc["partitions"]), PARTITION_HEADERS))
        if args.action == "delete":
            doc = api.call("DELETE", f"/v1/topics/{name}")
            return emit(args, doc, doc["result"])
        if args.action == "add-partitions":
            grow: dict[str, Any] = {"partitions": args.partitions}
            if args.replica_assignment:
                grow["replica_assignment"] = parse_assignment(args.replica_assignment)
            doc = api.call("POST", f"/v1/topics/{name}/partitions", grow)
            return emit(args, doc, f"topic {doc['name']} now has {len(doc['partitions'])} partitions "
                                   f"(metadata offset {doc['metadata_offset']})")
        doc = api.call("PATCH", f"/v1/topics/{name}/config",
                       {"set": parse_pairs(args.set, "--set"), "reset": args.reset})
        return emit(args, doc, f"topic {doc['name']} config updated (metadata offset {doc['metadata_offset']})")

    return run(go, argv, prog, parser)


def cluster_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Show the controller quorum and the brokers.")
    parser.add_argument("action", choices=("status", "brokers"))

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        if args.action == "status":
            doc = api.call("GET", "/v1/cluster")
            leader = (f"controller {doc['leader_id']} ({doc['leader_api_url']})" if doc["leader_id"] is not None
                      else "none (election in progress)")
            head = f"leader: {leader}  term {doc['term']}  metadata offset {doc['metadata_offset']}"
            return emit(args, doc, head + "\n" + table(
                [[c["node_id"], c["raft_address"], c["api_url"], c["priority"], "yes" if c["is_leader"] else "",
                  "yes" if c["connected"] else "no"] for c in doc["controllers"]],
                ["ID", "RAFT", "API", "PRIORITY", "LEADER", "CONNECTED"]))
        doc = api.call("GET", "/v1/brokers")
        return emit(args, doc, table(
            [[b["broker_id"], f"{b['host']}:{b['port']}", b["rack"], b["priority"],
              "fenced" if b["fenced"] else "active", b["leaders"], b["replicas"], b["metadata_offset"]]
             for b in doc["brokers"]],
            ["ID", "ADDRESS", "RACK", "PRIORITY", "STATE", "LEADERS", "REPLICAS", "METADATA_OFFSET"]))

    return run(go, argv, prog, parser)


def reassign_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Move a partition's replicas to a target set, or list reassignments.")
    parser.add_argument("topic", nargs="?")
    parser.add_argument("partition", nargs="?", type=int)
    parser.add_argument("replicas", nargs="?", help="target broker ids, comma-separated, preferred leader first")
    parser.add_argument("--list", action="store_true", help="list partitions being reassigned")

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        if args.list or args.topic is None:
            doc = api.call("GET", "/v1/reassignments")
            return emit(args, doc, table(partition_rows(doc["reassignments"]), PARTITION_HEADERS))
        if args.partition is None or not args.replicas:
            raise CliError("give TOPIC PARTITION BROKER[,BROKER...], or --list")
        try:
            target = [int(b) for b in args.replicas.split(",")]
        except ValueError:
            raise CliError(f"target replicas {args.replicas!r} are not broker ids like 1,2,3")
        doc = api.call("POST", "/v1/reassignments",
                       {"topic": args.topic, "partition": args.partition, "target_replicas": target})
        return emit(args, doc, table(partition_rows(doc["partitions"]), PARTITION_HEADERS))

    return run(go, argv, prog, parser)


def elect_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Move leadership to the preferred replica (first in the replica list).")
    parser.add_argument("partitions", nargs="*", metavar="TOPIC:PARTITION", help="default: every partition")

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        body: dict[str, Any] = {}
        if args.partitions:
            refs = []
            for ref in args.partitions:
                topic, sep, part = ref.rpartition(":")
                if not sep or not part.isdigit():
                    raise CliError(f"{ref!r} is not TOPIC:PARTITION")
                refs.append({"topic": topic, "partition": int(part)})
            body["partitions"] = refs
        doc = api.call("POST", "/v1/elections/preferred", body)
        if not doc["elected"]:
            return emit(args, doc, "every partition is already led by its preferred replica")
        return emit(args, doc, table(partition_rows(doc["elected"]), PARTITION_HEADERS))

    return run(go, argv, prog, parser)


def snapshot_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Take a controller snapshot now, or list the snapshot files.")
    parser.add_argument("action", choices=("take", "list"))

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        keys = ["name", "time", "metadata_offset", "size_bytes"]
        if args.action == "take":
            doc = api.call("POST", "/v1/snapshots")
            return emit(args, doc, f"snapshot written: {doc.get('name')} (metadata offset "
                                   f"{doc.get('metadata_offset')}, {doc.get('size_bytes')} bytes)")
        doc = api.call("GET", "/v1/snapshots")
        rows = doc.get("snapshots", [])
        return emit(args, doc, table([[r.get(k) for k in keys] for r in rows], [k.upper() for k in keys])
                    if rows else "no snapshots yet")

    return run(go, argv, prog, parser)
