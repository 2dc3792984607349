"""The admin commands of `biplane` over the controller's HTTP API.

    biplane topic create NAME [--partitions N] [--replication-factor R] [--config k=v ...]
    biplane topic list | describe NAME | delete NAME | alter NAME [--set k=v ...] [--reset k ...]
    biplane topic add-partitions NAME --partitions N [--replica-assignment 1,2:2,3]
    biplane cluster status | brokers | health
    biplane reassign TOPIC PARTITION BROKER[,BROKER...]    |  biplane reassign --list
    biplane reassign --plan FILE [--throttle 10MiB] | --progress | --cancel (--plan FILE | TOPIC PARTITION | --all)
    biplane cluster config get [KEY] | set KEY VALUE | reset KEY
    biplane elect [TOPIC:PARTITION ...]
    biplane snapshot take | list
    biplane broker maintenance on|off ID | decommission ID | recommission ID | operations ID

Every command takes --controller URL (env BIPLANE_CONTROLLER; several URLs may be
given comma-separated, the first that answers is used), --token (env
BIPLANE_ADMIN_TOKEN), --data-dir DIR (a `biplane up` cluster's directory, whose
cluster.json holds both; env BIPLANE_CLUSTER; default ./.biplane), --timeout-ms and
--json. Writes sent to a follower follow its redirect to the leader. Errors print
the API's message and exit 1 (2 for usage errors).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from common.tables import cell, table

REDIRECTS_MAX = 3
UNAVAILABLE_WAIT_S = 10.0
TIMEOUT_MS_DEFAULT = 15_000


class CliError(Exception):
    pass


class ApiClient:
    """A small synchronous client: JSON in and out, bearer token, manual redirects, retry on 503.

    `timeout_s` bounds a whole call, every URL and retry included, so an unreachable or hung
    controller costs the user at most that long before a message says so. `hint` is what to
    tell the user when no URL answers (how the URLs were found decides what to do about it)."""

    def __init__(self, urls: list[str], token: str | None, *, timeout_s: float = TIMEOUT_MS_DEFAULT / 1000,
                 hint: str = "") -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.token = token
        self.timeout_s = timeout_s
        self.hint = hint

    def call(self, method: str, path: str, body: Any = None) -> Any:
        deadline = time.monotonic() + self.timeout_s
        unavailable_deadline = time.monotonic() + min(UNAVAILABLE_WAIT_S, self.timeout_s)
        while True:
            status, doc = self._call_any(method, path, body, deadline)
            if status == 503 and time.monotonic() < unavailable_deadline and _retriable(doc):
                # No leader yet (an election is running): nothing was done, so retry. A 504
                # (outcome unknown) is not retried: the write may have happened.
                time.sleep(0.25)
                continue
            if status == 429 and time.monotonic() < unavailable_deadline:
                time.sleep(0.5)   # the write rate is spent; the write was refused before it ran
                continue
            if status >= 400:
                err = doc.get("error", {}) if isinstance(doc, dict) else {}
                message = err.get("message") or (doc if isinstance(doc, str) else f"HTTP {status}")
                field = f" (field: {err['field']})" if err.get("field") else ""
                raise CliError(f"{err.get('code', 'HTTP_' + str(status))}: {message}{field}")
            return doc

    def _call_any(self, method: str, path: str, body: Any, deadline: float) -> tuple[int, Any]:
        failures = []
        for url in self.urls:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                failures.append(f"{url}: not tried, the {self.timeout_s * 1000:.0f} ms timeout had passed")
                continue
            try:
                return self._call_one(method, url + path, body, remaining_s)
            except (urllib.error.URLError, OSError) as exc:
                failures.append(f"{url}: {_reason(exc, remaining_s)}")
        raise CliError(f"cannot reach the controller ({'; '.join(failures)}){self.hint}")

    def _call_one(self, method: str, url: str, body: Any, timeout_s: float) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(REDIRECTS_MAX + 1):
            req = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            if self.token:
                req.add_header("Authorization", f"Bearer {self.token}")
            try:
                with _OPENER.open(req, timeout=timeout_s) as resp:
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


def _reason(exc: BaseException, timeout_s: float) -> str:
    """Why a URL did not answer, in a few words."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout_s * 1000:.0f} ms"
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason.strerror})"
    return str(reason)


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

def ids(values: list[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def leader_cell(p: dict) -> Any:
    """A quorum election under way has no leader yet: say so rather than show none."""
    if p["leader"] is None and p.get("fenced_for_election"):
        return "electing"
    return p["leader"]


def partition_rows(partitions: list[dict]) -> list[list[Any]]:
    return [[p["topic"], p["partition"], leader_cell(p), ids(p["replicas"]), ids(p["isr"]), p["leader_epoch"],
             p["partition_epoch"], ids(p.get("adding", [])), ids(p.get("removing", []))] for p in partitions]


PARTITION_HEADERS = ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "LEADER_EPOCH", "EPOCH", "ADDING", "REMOVING"]


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB': binary units, three significant figures at most."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{n} B"
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_age(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms} ms ago" if ms < 1000 else f"{ms / 1000:.1f} s ago"


def describe_text(doc: dict, offsets: dict | None, offsets_error: str | None) -> str:
    """A topic's config, then per partition its replica state and, from the leaders' reports,
    its offsets and size."""
    config = "\n".join(f"  {k} = {cell(v)}" for k, v in sorted(doc["config"].items()))
    head = f"topic {doc['name']} (id {doc['topic_id']})\nconfig:\n{config}\n\n"
    by_partition = {o["partition"]: o for o in (offsets or {}).get("partitions", [])}
    rows = []
    for row, p in zip(partition_rows(doc["partitions"]), doc["partitions"]):
        o = by_partition.get(p["partition"], {})
        rows.append(row + [o.get("log_start_offset"), o.get("high_watermark"), o.get("log_end_offset"),
                           human_bytes(o.get("size_bytes")), human_age(o.get("age_ms"))])
    text = head + table(rows, PARTITION_HEADERS + ["LOG_START", "HW", "LEO", "SIZE", "REPORTED"])
    if offsets_error is not None:
        return text + f"\n(no offsets or sizes: {offsets_error})"
    return text + ("\nLOG_START, HW, LEO and SIZE (the leader's copy) are as each partition's leader last "
                   "reported them in its heartbeat (about once a second), REPORTED ago; '-': no report from "
                   "the current leader yet.")


def parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def parse_pairs(pairs: list[str], what: str) -> dict[str, Any]:
    from common.metadata.config import normalize_key
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {pair!r} is not KEY=VALUE")
        key, parsed = key.strip(), parse_value(value.strip())
        # min.insync.replicas and min_insync_replicas are one key to the server, which kept the last.
        same = next((k for k in out if normalize_key(k) == normalize_key(key)), None)
        if same is not None and out[same] != parsed:
            raise CliError(f"{what} {key} is given twice ({same}={out[same]!r} and {key}={parsed!r}); give it once")
        out[key] = parsed
    return out


# ---------------------------------------------------------------- commands

def _topic_shape(args: argparse.Namespace) -> dict[str, Any]:
    """`topic create`'s partitions, replication factor, config and assignment, from whichever
    of its ways a user gave them: the flags, `--config partitions=N` (the config key list names
    them), or `--replica-assignment`, which fixes both. Two ways that disagree are refused."""
    from common.metadata.config import normalize_key
    config = parse_pairs(args.config, "--config")
    shape: dict[str, tuple[str, int]] = {}
    for key, flag, value in (("partitions", "--partitions", args.partitions),
                             ("replication_factor", "--replication-factor", args.replication_factor)):
        given = [(flag, value)] if value is not None else []
        for k in [k for k in config if normalize_key(k) == key]:
            raw = config.pop(k)
            try:
                if isinstance(raw, bool):
                    raise TypeError("true/false is no count")
                given.append((f"--config {k}", int(raw)))
            except (TypeError, ValueError):
                raise CliError(f"--config {k}={raw!r} is not a whole number") from None
        if len({v for _, v in given}) > 1:
            raise CliError(f"{key} given twice with different values: "
                           + " and ".join(f"{where} {v}" for where, v in given) + "; give it once")
        if given:
            shape[key] = given[0]
    body: dict[str, Any] = {"partitions": 1, "replication_factor": 1, "config": config}
    if args.replica_assignment:
        assignment = parse_assignment(args.replica_assignment)
        implied = {"partitions": len(assignment), "replication_factor": len(assignment[0])}
        for key, (where, value) in shape.items():
            if value != implied[key]:
                raise CliError(f"{where} {value} disagrees with --replica-assignment, which lists "
                               f"{implied[key]} ({key}); leave {where} out, the assignment sets it")
        body.update(implied, replica_assignment=assignment)
    else:
        body.update({key: value for key, (_, value) in shape.items()})
    return body


def parse_assignment(text: str) -> list[list[int]]:
    try:
        return [[int(b) for b in part.split(",")] for part in text.split(":")]
    except ValueError:
        raise CliError(f"--replica-assignment {text!r} is not like 1,2:2,3 (broker ids, ',' within a "
                       "partition, ':' between partitions)") from None


def common_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=ADDRESS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_address_args(p)
    return p


ADDRESS_EPILOG = """\
Which controller: --controller URL, else --data-dir DIR (the cluster.json `biplane up` wrote
there), else $BIPLANE_CONTROLLER, else the cluster.json $BIPLANE_CLUSTER names (the file or
its directory), else ./.biplane/cluster.json. The token: --token, else $BIPLANE_ADMIN_TOKEN,
else that cluster file's."""


def add_address_args(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    """The shared options; `suppress` for a subcommand's copy, so an option given before the
    subcommand is not reset by the subcommand's default."""
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value
    p.add_argument("--controller", default=default(None),
                   help="controller API URL(s), comma-separated; the first that answers is used "
                        "(env BIPLANE_CONTROLLER; default: the `biplane up` cluster's)")
    p.add_argument("--token", default=default(None),
                   help="admin bearer token (env BIPLANE_ADMIN_TOKEN; default: the `biplane up` cluster's)")
    p.add_argument("--data-dir", default=default(None), metavar="DIR",
                   help="the data directory of a `biplane up` cluster (its cluster.json gives the URLs and "
                        "token; env BIPLANE_CLUSTER; default ./.biplane)")
    p.add_argument("--timeout-ms", type=int, default=default(TIMEOUT_MS_DEFAULT),
                   help="give up when the controller has not answered within this long, every URL and retry "
                        f"included (default {TIMEOUT_MS_DEFAULT})")
    p.add_argument("--json", action="store_true", default=default(False),
                   help="print the API's JSON instead of a table")


def resolve_controller(args: argparse.Namespace) -> tuple[list[str], str | None, str]:
    """(URLs, token, what to tell the user when none answers), by the order ADDRESS_EPILOG gives."""
    from dataplane.client.discovery import cluster_file_source, load_cluster_file, not_answering_hint
    from dataplane.client.errors import NoClusterError
    if args.token is not None and not args.token.strip():
        raise CliError("--token is empty: give the admin token, or leave --token out to use "
                       "BIPLANE_ADMIN_TOKEN or the `biplane up` cluster's own")
    token = args.token or os.environ.get("BIPLANE_ADMIN_TOKEN")
    given = args.controller or (None if args.data_dir else os.environ.get("BIPLANE_CONTROLLER"))
    if given:
        urls = [u if "://" in u else "http://" + u for u in (x.strip() for x in given.split(",")) if u]
        if not urls:
            raise CliError(f"--controller {given!r} names no URL; give one like http://127.0.0.1:8080")
        if token is None:
            # The cluster file's token, when it is the same cluster's: a token is never sent to
            # controllers other than those the file names.
            try:
                doc = load_cluster_file()
                local = {c["api_url"].rstrip("/") for c in doc["controllers"].values()}
                if local & {u.rstrip("/") for u in urls}:
                    token = doc.get("admin_token")
            except (NoClusterError, KeyError, TypeError, AttributeError):
                pass
        return urls, token, "; is the controller running, and is that its address? A `biplane up` cluster " \
                            "starts with `biplane up`, and --data-dir DIR finds it without an address"
    try:
        doc = load_cluster_file(args.data_dir)
        urls = [c["api_url"] for _, c in sorted(doc["controllers"].items(), key=lambda kv: int(kv[0]))]
    except NoClusterError as exc:
        raise CliError(f"{exc} (for the admin API: --controller URL)") from None
    except (KeyError, TypeError, ValueError, AttributeError):
        raise CliError(f"{cluster_file_source(args.data_dir)[0]} lists no controllers' api_url; run "
                       "`biplane up` again to rewrite it") from None
    return urls, token or doc.get("admin_token"), not_answering_hint(args.data_dir, "controllers")


def client_of(args: argparse.Namespace) -> ApiClient:
    if args.timeout_ms < 1:
        raise CliError(f"--timeout-ms {args.timeout_ms} must be at least 1")
    urls, token, hint = resolve_controller(args)
    return ApiClient(urls, token, timeout_s=args.timeout_ms / 1000, hint=hint)


@dataclasses.dataclass(frozen=True)
class Finished:
    """What a command prints and the exit code it ends with, when that is not 0."""

    text: str | None
    code: int


def run(fn, argv: list[str], prog: str, parser: argparse.ArgumentParser) -> int:
    args = parser.parse_args(argv)
    try:
        out = fn(args, client_of(args))
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finished = out if isinstance(out, Finished) else Finished(out, 0)
    if finished.text is not None:
        print(finished.text)
    return finished.code


def emit(args: argparse.Namespace, doc: Any, text: str) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) if args.json else text


# What each topic config key means, for `biplane topic create --help` (the README's table
# says more); tests/test_cli.py checks that every key of TopicConfig is here, with a meaning.
CONFIG_KEY_MEANINGS: dict[str, str] = {
    "partitions": "partition count; fixed after creation (grow it with add-partitions)",
    "replication_factor": "replicas per partition; fixed after creation (change it by reassignment)",
    "replication_mode": "pull (followers fetch, Kafka) or push (the leader sends, Redpanda); fixed after creation",
    "commit_policy": "isr (every in-sync replica stores it, Kafka) or quorum (any quorum_required_acks do); "
                     "fixed after creation",
    "quorum_required_acks": "q for quorum topics, 1 < q <= RF (default: a majority of RF); fixed after creation",
    "min_insync_replicas": "isr topics refuse acks=all with NOT_ENOUGH_REPLICAS when the ISR is smaller",
    "durability": "fsync (count only flushed records toward the high watermark) or write",
    "unclean_leader_election": "isr topics may elect a replica outside the ISR (may lose acknowledged records)",
    "retention_ms": "delete whole segments older than this; -1 keeps everything",
    "retention_bytes": "delete the oldest whole segments beyond this size per partition; -1 unlimited",
    "segment_bytes": "roll a segment at this size (>= 1024)",
    "segment_ms": "roll a segment at this age",
    "flush_debounce_ms": "how long a replica gathers writes before one fsync (default: 5 under durability "
                         "fsync, 100 under write)",
    "max_message_bytes": "the largest record batch a producer may send",
    "replica_lag_time_max_ms": "a follower not caught up for this long leaves the ISR",
    "cleanup_policy": "delete (retention), compact (keep each key's latest record) or compact,delete",
    "delete_retention_ms": "how long a tombstone outlives its segment's first clean, for slow readers",
    "min_cleanable_dirty_ratio": "compact a partition once this share of its cleanable bytes is uncleaned",
    "min_compaction_lag_ms": "a record stays uncompacted at least this long after its timestamp",
}


def config_keys_help() -> str:
    from common.metadata.config import TopicConfig
    lines = ["topic config keys (--config KEY=VALUE, repeatable; Kafka's dotted names such as "
             "min.insync.replicas work too):"]
    for key, field in TopicConfig.model_fields.items():
        default = "majority of RF" if field.default is None else field.default
        lines.append(f"  {key:<25} default {default}: {CONFIG_KEY_MEANINGS[key]}")
    lines.append("Change them later with `biplane topic alter NAME --set KEY=VALUE` (all but partitions and "
                 "replication_factor).")
    return "\n".join(lines)


def topic_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Create, list, describe, alter or delete topics, or add partitions.")
    sub = parser.add_subparsers(dest="action", required=True)
    c = sub.add_parser("create", help="create a topic", description="Create topic NAME.",
                       epilog=config_keys_help() + "\n\n" + ADDRESS_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("name", help="the topic's name: letters, digits, '.', '_' and '-', at most 249")
    c.add_argument("--partitions", type=int, help="partition count (default 1)")
    c.add_argument("--replication-factor", type=int,
                   help="replicas per partition, at most the number of live brokers (default 1)")
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a topic config setting (repeatable); the keys are listed below")
    c.add_argument("--if-not-exists", action="store_true",
                   help="succeed without a change when the topic exists already (as kafka-topics)")
    c.add_argument("--replica-assignment", metavar="1,2:2,3",
                   help="replica lists per partition, ':' between partitions, preferred leader first "
                        "(sets the partition count and replication factor)")
    sub.add_parser("list", help="list topics", description="List every topic.")
    d = sub.add_parser("describe", help="a topic's config and partitions",
                       description="Show a topic's config and each partition's leader, replicas and ISR, and "
                                   "its log start offset, high watermark, log end offset and size as the "
                                   "partition's leader last reported them to the controller (brokers report "
                                   "about once a second; the REPORTED column says how long ago).")
    d.add_argument("name", help="the topic")
    x = sub.add_parser("delete", help="delete a topic", description="Delete a topic and its data.")
    x.add_argument("name", help="the topic")
    a = sub.add_parser("alter", help="set or reset config keys",
                       description="Set or reset a topic's config keys.",
                       epilog=config_keys_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("name", help="the topic")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a key (repeatable)")
    a.add_argument("--reset", action="append", default=[], metavar="KEY",
                   help="return a key to its default (repeatable)")
    g = sub.add_parser("add-partitions", help="grow a topic to N partitions in all (never fewer)",
                       description="Grow a topic to N partitions in all (never fewer).")
    g.add_argument("name", help="the topic")
    g.add_argument("--partitions", type=int, required=True, help="the new total, larger than today's")
    g.add_argument("--replica-assignment", help="replica lists of the new partitions only: 1,2:2,3")
    # Let the shared options follow the action too: `biplane topic list --json`.
    for sp in (c, d, x, a, g, sub.choices["list"]):
        add_address_args(sp, suppress=True)

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        if args.action == "create":
            body: dict[str, Any] = {"name": args.name, **_topic_shape(args)}
            try:
                doc = api.call("POST", "/v1/topics", body)
            except CliError as exc:
                if args.if_not_exists and str(exc).startswith("TOPIC_ALREADY_EXISTS"):
                    return emit(args, {"name": args.name, "created": False},
                                f"topic {args.name} exists already; nothing changed")
                raise
            count = len(doc["partitions"])
            return emit(args, doc, f"created topic {doc['name']} ({count} partition{'' if count == 1 else 's'}, "
                                   f"metadata offset {doc['metadata_offset']})")
        if args.action == "list":
            doc = api.call("GET", "/v1/topics")
            return emit(args, doc, table([[t["name"], t["partitions"], t["replication_factor"], t["commit_policy"],
                                           t["replication_mode"]] for t in doc["topics"]],
                                         ["NAME", "PARTITIONS", "RF", "COMMIT_POLICY", "MODE"]))
        name = urllib.parse.quote(args.name, safe="")
        if args.action == "describe":
            doc = api.call("GET", f"/v1/topics/{name}")
            offsets, offsets_error = None, None
            try:
                offsets = api.call("GET", f"/v1/topics/{name}/offsets")
            except CliError as exc:
                offsets_error = str(exc)
            return emit(args, {**doc, "offsets": offsets}, describe_text(doc, offsets, offsets_error))
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
        if not args.set and not args.reset:
            raise CliError("nothing to change: give --set KEY=VALUE or --reset KEY (each repeatable)")
        doc = api.call("PATCH", f"/v1/topics/{name}/config",
                       {"set": parse_pairs(args.set, "--set"), "reset": args.reset})
        return emit(args, doc, f"topic {doc['name']} config updated (metadata offset {doc['metadata_offset']})")

    return run(go, argv, prog, parser)


EXIT_DEGRADED = 3
EXIT_CRITICAL = 4

def config_epilog() -> str:
    from common.metadata.cluster_config import CLUSTER_CONFIG_MEANINGS
    return ("dynamic cluster config (`biplane cluster config get|set|reset`), committed through the controllers'\n"
            "Raft log and applied by every broker without a restart as it learns it:\n"
            + "\n".join(f"  {k:<36} {v}" for k, v in CLUSTER_CONFIG_MEANINGS.items()))


HEALTH_EPILOG = f"""\
health exit codes:
  0  healthy
  1  the check itself failed (no controller answered, bad token)
  {EXIT_DEGRADED}  degraded: under-replicated partitions (a replica out of the ISR), fenced brokers,
     a controller not connected to the leader; everything still serves
  {EXIT_CRITICAL}  critical: partitions without a leader, partitions whose ISR is below
     min_insync_replicas (quorum topics: below quorum_required_acks) so acks=all is refused,
     or no controller leader (or a leader that reaches no majority of the controllers)
The health is judged by the controller leader (a follower redirects there)."""


def broker_state(b: dict) -> str:
    """fenced/active, with the operator's mark when there is one."""
    state = "fenced" if b["fenced"] else "active"
    for mark in ("decommissioned", "decommissioning", "maintenance"):
        if b.get(mark):
            return f"{state},{mark}"
    return state


def health_text(doc: dict) -> str:
    lines = [f"cluster {doc['status'].upper()} (judged by controller {doc['node_id']}, controller leader "
             f"{doc['controller_leader'] if doc['controller_leader'] is not None else 'none'}, metadata offset "
             f"{doc['metadata_offset']})",
             f"  leaderless partitions:        {doc['leaderless_partitions']}",
             f"  under-min-ISR partitions:     {doc['under_min_isr_partitions']}",
             f"  under-replicated partitions:  {doc['under_replicated_partitions']}",
             f"  fenced brokers:               {doc['fenced_brokers']}",
             f"  controllers disconnected:     {doc['controllers_disconnected']}"]
    if doc["problems"]:
        lines.append("")
        lines += [f"{p['severity'].upper():<9} {p['check']:<24} {p['message']}" for p in doc["problems"]]
    if doc.get("problems_omitted"):
        lines.append(f"... and {doc['problems_omitted']} more (--json lists the first ones too; the counts "
                     "above include all)")
    return "\n".join(lines)


def cluster_config_text(doc: dict, key: str | None = None) -> str:
    rows = [[k, "-" if v is None else v, doc["descriptions"].get(k, "")]
            for k, v in sorted(doc["config"].items()) if key is None or k == key]
    return table(rows, ["KEY", "VALUE", "MEANING"]) + "\n('-': not set; each broker uses its own flag)"


def cluster_config(args: argparse.Namespace, api: ApiClient) -> str:
    words = args.words
    verb = words[0] if words else "get"
    if verb == "get" and len(words) <= 2:
        doc = api.call("GET", "/v1/cluster/config")
        key = words[1] if len(words) == 2 else None
        if key is not None and key not in doc["config"]:
            raise CliError(f"unknown cluster config key {key!r}; the keys are {', '.join(sorted(doc['config']))}")
        return emit(args, doc, cluster_config_text(doc, key))
    if verb == "set" and len(words) >= 3 and len(words) % 2 == 1:
        changes = {words[i]: parse_value(words[i + 1]) for i in range(1, len(words), 2)}
        doc = api.call("PATCH", "/v1/cluster/config", {"set": changes})
        return emit(args, doc, f"cluster config updated (metadata offset {doc['metadata_offset']}); brokers apply "
                               "it as they learn it\n" + cluster_config_text(doc))
    if verb == "reset" and len(words) >= 2:
        doc = api.call("PATCH", "/v1/cluster/config", {"reset": words[1:]})
        return emit(args, doc, f"cluster config updated (metadata offset {doc['metadata_offset']})\n"
                    + cluster_config_text(doc))
    raise CliError("cluster config takes: get [KEY] | set KEY VALUE [KEY VALUE ...] | reset KEY [KEY ...]")


def cluster_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Show the controller quorum, the brokers, or the cluster's health.")
    parser.epilog = HEALTH_EPILOG + "\n\n" + config_epilog() + "\n\n" + ADDRESS_EPILOG
    parser.add_argument("action", choices=("status", "brokers", "health", "config"),
                        help="status: the controller quorum and its leader; brokers: every broker; "
                             "health: what needs attention, with an exit code saying how bad (below); "
                             "config: the dynamic cluster config (below)")
    parser.add_argument("words", nargs="*", metavar="ARG",
                        help="for config: get [KEY] | set KEY VALUE [KEY VALUE ...] | reset KEY [KEY ...]")

    def go(args: argparse.Namespace, api: ApiClient) -> str | Finished:
        if args.action == "config":
            return cluster_config(args, api)
        if args.words:
            raise CliError(f"`{args.action}` takes no arguments, got {' '.join(args.words)}")
        if args.action == "health":
            doc = api.call("GET", "/v1/cluster/health")
            code = {"healthy": 0, "degraded": EXIT_DEGRADED}.get(doc["status"], EXIT_CRITICAL)
            return Finished(emit(args, doc, health_text(doc)), code)
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
            [[b["broker_id"], f"{b['host']}:{b['port']}", b["rack"], b["priority"], broker_state(b),
              b["leaders"], b["replicas"], b.get("replicas_opening"), b["metadata_offset"], b.get("metadata_lag")]
             for b in doc["brokers"]],
            ["ID", "ADDRESS", "RACK", "PRIORITY", "STATE", "LEADERS", "REPLICAS", "OPENING", "METADATA_OFFSET",
             "METADATA_LAG"]))

    return run(go, argv, prog, parser)


WAIT_TIMEOUT_MS_DEFAULT = 600_000
POLL_INTERVAL_S = 0.5


def _wait(args: argparse.Namespace, api: ApiClient, broker_id: int, done, progress) -> dict:
    """Poll the broker's operations until `done(doc)` says so; print `progress(doc)` to stderr
    when it changes. CliError when --wait-timeout-ms passes first."""
    deadline = time.monotonic() + args.wait_timeout_ms / 1000
    said = None
    while True:
        doc = api.call("GET", f"/v1/brokers/{broker_id}/operations")
        if done(doc):
            return doc
        line = progress(doc)
        if line != said:
            print(line, file=sys.stderr, flush=True)
            said = line
        if time.monotonic() >= deadline:
            raise CliError(f"not done within --wait-timeout-ms {args.wait_timeout_ms}: {doc['message']}. It goes "
                           f"on; watch it with `biplane broker operations {broker_id}`")
        time.sleep(POLL_INTERVAL_S)


def _stuck(doc: dict) -> str:
    return "".join(f"\n  stays: {why}" for why in doc.get("stuck", []))


def _maintenance_on(args: argparse.Namespace, api: ApiClient, doc: dict) -> dict:
    """Wait until no leadership another replica could take is left on the broker, and then until
    the broker itself has applied the metadata that moved them (it no longer acts as leader)."""
    b = doc["broker_id"]
    drained = _wait(args, api, b, lambda d: d["leaders_movable"] == 0,
                    lambda d: f"broker {b}: {d['leaders_movable']} leadership(s) still to move")
    moved_at = drained["metadata_offset"]
    return _wait(args, api, b,
                 lambda d: d["fenced"] or (d["broker_metadata_offset"] or -1) >= moved_at,
                 lambda d: f"broker {b}: waiting for it to apply metadata offset {moved_at} "
                           f"(it is at {d['broker_metadata_offset']})")


def broker_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Take a broker out of leadership (maintenance), out of the cluster "
                                 "(decommission), back in (recommission), or show where that stands.")
    parser.epilog = ("`biplane broker --broker-id N ...` (no action) runs a broker process instead.\n\n"
                     + ADDRESS_EPILOG)
    sub = parser.add_subparsers(dest="action", required=True)
    m = sub.add_parser("maintenance", help="drain (on) or allow again (off) a broker's leaderships",
                       description="on: the broker is not elected leader while another eligible replica exists; "
                                   "its leaderships move to other in-sync replicas (it stays in every ISR and "
                                   "keeps replicating). Waits until they have moved and the broker applied it. "
                                   "off: it may lead again; the preferred-leader rebalance hands its "
                                   "leaderships back over time.")
    m.add_argument("state", choices=("on", "off"), help="on or off")
    d = sub.add_parser("decommission", help="move every replica off a broker, then fence it for good",
                       description="Move every replica off the broker, each replaced by the least loaded live "
                                   "broker not already in its replica set (a few partitions at a time), then "
                                   "fence it; it stays fenced (stop its process then). Refused when the other "
                                   "brokers cannot hold some partition's replication factor. Idempotent; "
                                   "Ctrl-C stops only the waiting; `recommission` cancels.")
    r = sub.add_parser("recommission", help="cancel a decommission",
                       description="Cancel a decommission: moves still running go back to their original "
                                   "replicas, moves already done stay, and a running broker is unfenced on "
                                   "its next heartbeat.")
    o = sub.add_parser("operations", help="a broker's maintenance and decommission state",
                       description="Show a broker's maintenance and decommission state and what is left of them.")
    for sp in (m, d, r, o):
        sp.add_argument("broker_id", type=int, metavar="ID", help="the broker id")
        add_address_args(sp, suppress=True)
    for sp in (m, d):
        sp.add_argument("--no-wait", action="store_true", help="return once the controller accepted it")
        sp.add_argument("--wait-timeout-ms", type=int, default=WAIT_TIMEOUT_MS_DEFAULT,
                        help=f"give up waiting after this long; the operation goes on (default "
                             f"{WAIT_TIMEOUT_MS_DEFAULT})")

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        b = args.broker_id
        if b < 0:
            raise CliError(f"broker id {b} must be >= 0")
        if getattr(args, "wait_timeout_ms", 1) < 1:
            raise CliError(f"--wait-timeout-ms {args.wait_timeout_ms} must be at least 1 (or --no-wait to return "
                           "once the controller accepted it)")
        if args.action == "operations":
            doc = api.call("GET", f"/v1/brokers/{b}/operations")
            return emit(args, doc, doc["message"] + _stuck(doc))
        if args.action == "recommission":
            doc = api.call("POST", f"/v1/brokers/{b}/recommission")
            return emit(args, doc, f"{doc['message']} (recommissioned; {doc['replicas']} replica(s) on it)")
        if args.action == "maintenance":
            doc = api.call("POST", f"/v1/brokers/{b}/maintenance", {"enabled": args.state == "on"})
            if args.state == "off" or args.no_wait:
                return emit(args, doc, doc["message"])
            doc = _maintenance_on(args, api, doc)
            return emit(args, doc, f"broker {b} is in maintenance: leaderships drained; it leads "
                                   f"{doc['leaders']} partition(s) no other replica can take" + _stuck(doc))
        doc = api.call("POST", f"/v1/brokers/{b}/decommission")
        if args.no_wait:
            return emit(args, doc, doc["message"])
        total = max(doc["replicas"], 1)
        doc = _wait(args, api, b, lambda d: d["decommissioned"],
                    lambda d: f"broker {b}: {total - d['replicas']} of {total} replica(s) moved off, "
                              f"{d['replicas_moving']} moving" + _stuck(d))
        return emit(args, doc, doc["message"])

    return run(go, argv, prog, parser)


_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3}


def parse_bytes(text: str, what: str) -> int:
    """'10MiB', '512k', '1048576' -> bytes (binary units)."""
    t = text.strip().lower().replace(" ", "").removesuffix("/s")
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(digits):]
    if not digits or unit not in _UNITS:
        raise CliError(f"{what} {text!r} is not a size like 10485760, 512KiB or 10MiB")
    try:
        return int(float(digits) * _UNITS[unit])
    except ValueError:
        raise CliError(f"{what} {text!r} is not a size like 10485760, 512KiB or 10MiB") from None


def read_plan(path: str) -> dict[str, Any]:
    """A reassignment plan file as the API's body: {"version": 1, "partitions": [{"topic",
    "partition", "replicas"}], "throttle_bytes_per_s"?}. Other fields of an entry (a capacity
    report's bytes or time estimate, Kafka's log_dirs) are left out."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise CliError(f"cannot read the plan {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CliError(f"the plan {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise CliError(f"the plan {path} must be an object with a \"partitions\" list, like "
                       '{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2, 3]}]}')
    if doc.get("version", 1) != 1:
        raise CliError(f"the plan {path} has version {doc['version']!r}; this biplane reads version 1")
    moves = []
    for i, entry in enumerate(doc["partitions"]):
        if not isinstance(entry, dict) or not all(k in entry for k in ("topic", "partition", "replicas")):
            raise CliError(f"the plan {path}: partitions[{i}] must have topic, partition and replicas")
        moves.append({k: entry[k] for k in ("topic", "partition", "replicas")})
    body: dict[str, Any] = {"version": 1, "partitions": moves}
    if doc.get("throttle_bytes_per_s") is not None:
        body["throttle_bytes_per_s"] = doc["throttle_bytes_per_s"]
    return body


def progress_text(doc: dict) -> str:
    throttle = doc["throttle_bytes_per_s"]
    head = (f"reassignment throttle: {human_bytes(throttle) + '/s' if throttle else 'none'}; "
            f"{len(doc['partitions'])} partition(s) moving")
    rows = []
    for p in doc["partitions"]:
        for r in p["moving"] or [{"broker_id": None}]:
            rows.append([p["topic"], p["partition"], ids(p["target_replicas"]), ids(p["removing"]), p["leader"],
                         r.get("broker_id"), "yes" if r.get("in_isr") else "no", r.get("log_end_offset"),
                         p.get("leader_log_end_offset"), r.get("offsets_behind"), human_bytes(r.get("size_bytes")),
                         human_bytes(r.get("bytes_behind"))])
    return head + ("\n" + table(rows, ["TOPIC", "PARTITION", "TARGET", "REMOVING", "LEADER", "NEW_REPLICA", "IN_ISR",
                                       "ITS_LEO", "LEADER_LEO", "OFFSETS_BEHIND", "COPIED", "BYTES_BEHIND"])
                   if rows else "") + ("\n(figures from the brokers' latest usage reports, about once a second)"
                                        if rows else "")


REASSIGN_EPILOG = """\
plan file (--plan FILE), Kafka's reassignment JSON; `biplane report capacity` writes its move plan in it:
  {"version": 1,
   "partitions": [{"topic": "events", "partition": 0, "replicas": [2, 3, 4]}, ...],
   "throttle_bytes_per_s": 10485760}
replicas: the target replica list, preferred leader first. Other fields of an entry are ignored.
throttle_bytes_per_s (or --throttle, which wins): how fast each broker may copy the replicas it is
adding; it becomes the cluster's reassignment_throttle_bytes_per_s (`biplane cluster config`).
The plan starts all or none: one refused move refuses it, naming the entry."""


def reassign_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Move partitions' replicas to target sets: one partition, or many from a plan "
                                 "file with a replication throttle; show progress; cancel.")
    parser.epilog = REASSIGN_EPILOG + "\n\n" + ADDRESS_EPILOG
    parser.add_argument("topic", nargs="?", help="the topic of the partition to move")
    parser.add_argument("partition", nargs="?", type=int, help="the partition number")
    parser.add_argument("replicas", nargs="?", help="target broker ids, comma-separated, preferred leader first")
    parser.add_argument("--list", action="store_true", help="list partitions being reassigned")
    parser.add_argument("--plan", metavar="FILE", help="start (or with --cancel, cancel) every move in FILE")
    parser.add_argument("--throttle", metavar="BYTES_PER_S",
                        help="with --plan: replication throttle for the catch-up, e.g. 10MiB (per broker)")
    parser.add_argument("--progress", action="store_true",
                        help="each moving replica's log end offset and bytes copied against the leader's")
    parser.add_argument("--cancel", action="store_true",
                        help="send reassignments back to their original replica sets: those of --plan FILE, "
                             "of TOPIC PARTITION, or with --all every running one")
    parser.add_argument("--all", action="store_true", help="with --cancel: every running reassignment")

    def go(args: argparse.Namespace, api: ApiClient) -> str:
        if args.progress:
            doc = api.call("GET", "/v1/reassignments/progress")
            return emit(args, doc, progress_text(doc))
        if args.cancel:
            body: dict[str, Any]
            if args.plan:
                body = {"partitions": [{"topic": m["topic"], "partition": m["partition"]}
                                       for m in read_plan(args.plan)["partitions"]]}
            elif args.topic is not None and args.partition is not None:
                body = {"partitions": [{"topic": args.topic, "partition": args.partition}]}
            elif args.all:
                body = {"partitions": None}
            else:
                raise CliError("--cancel needs --plan FILE, TOPIC PARTITION, or --all")
            doc = api.call("POST", "/v1/reassignments/cancel", body)
            return emit(args, doc, f"cancelled {len(doc['reassignments'])} reassignment(s); their replicas now:\n"
                        + table(partition_rows(doc["reassignments"]), PARTITION_HEADERS))
        if args.plan:
            body = read_plan(args.plan)
            if not body["partitions"]:
                # A capacity report's plan when nothing needs to move: nothing to start.
                return emit(args, {"reassignments": []}, f"the plan {args.plan} moves no partition; nothing started")
            if args.throttle:
                body["throttle_bytes_per_s"] = parse_bytes(args.throttle, "--throttle")
            doc = api.call("POST", "/v1/reassignments/plan", body)
            throttle = body.get("throttle_bytes_per_s")
            return emit(args, doc, f"started {len(doc['reassignments'])} reassignment(s)"
                        + (f" at a throttle of {human_bytes(throttle)}/s per broker" if throttle else "")
                        + "; follow with --progress\n" + table(partition_rows(doc["reassignments"]), PARTITION_HEADERS))
        if args.throttle:
            raise CliError("--throttle goes with --plan FILE")
        if args.list or args.topic is None:
            doc = api.call("GET", "/v1/reassignments")
            return emit(args, doc, table(partition_rows(doc["reassignments"]), PARTITION_HEADERS))
        if args.partition is None or not args.replicas:
            raise CliError("give TOPIC PARTITION BROKER[,BROKER...], or --plan FILE, --progress, --cancel or --list")
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
        text = table(partition_rows(doc["elected"]), PARTITION_HEADERS)
        if any(leader_cell(p) == "electing" for p in doc["elected"]):
            text += ("\n'electing': a quorum topic's partition is electing its new leader from its replicas' "
                     "reports; `biplane topic describe TOPIC` shows who won")
        return emit(args, doc, text)

    return run(go, argv, prog, parser)


def snapshot_main(argv: list[str], prog: str) -> int:
    parser = common_parser(prog, "Take a controller snapshot now, or list the snapshot files.")
    parser.add_argument("action", choices=("take", "list"),
                        help="take: write a snapshot now; list: the snapshot files")

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
