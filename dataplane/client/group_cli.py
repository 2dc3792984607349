"""`biplane group`: consumer groups, as Kafka's kafka-consumer-groups tool shows and changes them.

    biplane group list [--state STATE ...]
    biplane group describe GROUP
    biplane group reset-offsets GROUP --to-earliest|--to-latest|--to-offset N|--to-datetime ISO
                                (--topic TOPIC[:P[,P...]] ... | --all-topics) [--dry-run]
    biplane group delete GROUP [GROUP ...]

Over the data-plane wire to the brokers (dataplane/client/group_admin.py); brokers are found
as `biplane produce` and `consume` find them (--bootstrap, --data-dir, $BIPLANE_BOOTSTRAP,
$BIPLANE_CLUSTER). Each command takes --json for a machine-readable answer. Errors print one
line and exit 1; usage errors exit 2.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from common.errors import ErrorCode, NoClusterError
from common.topic_partition import TopicPartition
from common.tables import table
from dataplane.client.cli import ADDRESS_EPILOG, _address_args, _fail, _note, _run, resolve_brokers
from dataplane.client.group_admin import EMPTY_STATES, GroupAdmin, GroupDescription

TIMEOUT_MS_DEFAULT = 30_000
STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")

DESCRIPTION = """Consumer groups: list them, describe one (members, their partitions, committed
offsets and lag), reset a group's committed offsets, delete groups."""

RESET_EPILOG = f"""\
Only a group with no members can be reset (stop its consumers first), as with Kafka's tool;
a group that does not exist yet gets the offsets, and its first members start there.
--to-offset is held within each partition's earliest and latest offsets. Without --dry-run
the new offsets are committed; with it they are only shown.

{ADDRESS_EPILOG}"""


def _common(p: argparse.ArgumentParser) -> None:
    _address_args(p)
    p.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS_DEFAULT,
                   help=f"fail when the brokers do not answer within this long (default {TIMEOUT_MS_DEFAULT})")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=ADDRESS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="list the groups every broker coordinates",
                             description="List consumer groups (every broker lists those it coordinates).",
                             epilog=ADDRESS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    listing.add_argument("--state", action="append", choices=STATES, metavar="STATE",
                         help=f"only groups in this state (repeatable; one of {', '.join(STATES)})")
    _common(listing)
    describe = sub.add_parser("describe", help="members, assignments, committed offsets and lag of a group",
                              description="Describe GROUP: its state, its members and their partitions, and per "
                                          "partition the committed offset, the end (high watermark) and the lag "
                                          "between them.",
                              epilog=ADDRESS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    describe.add_argument("group", help="the group id")
    _common(describe)
    reset = sub.add_parser("reset-offsets", help="set a group's committed offsets (the group must have no members)",
                           description="Set GROUP's committed offsets for the partitions named.",
                           epilog=RESET_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    reset.add_argument("group", help="the group id")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's earliest offset")
    to.add_argument("--to-latest", action="store_true", help="each partition's end: skip everything there is")
    to.add_argument("--to-offset", type=int, metavar="N", help="this offset in every partition named")
    to.add_argument("--to-datetime", metavar="ISO",
                    help="the first record at or after this time, e.g. 2026-11-25T08:00:00Z (no zone: UTC)")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", action="append", metavar="TOPIC[:P[,P...]]",
                       help="a topic, or some of its partitions (repeatable)")
    which.add_argument("--all-topics", action="store_true", help="every partition the group has an offset for")
    reset.add_argument("--dry-run", action="store_true", help="show the new offsets without committing them")
    _common(reset)
    delete = sub.add_parser("delete", help="delete groups with no members, and their offsets",
                            description="Delete each GROUP (it must have no members), its committed offsets too.",
                            epilog=ADDRESS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    delete.add_argument("groups", nargs="+", metavar="GROUP", help="the group ids")
    _common(delete)
    return p


def main(argv: list[str], prog: str) -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    usage = _action_parser(p, args.action)
    if args.timeout_ms < 1:
        usage.error(f"--timeout-ms {args.timeout_ms} must be at least 1")
    if args.action == "reset-offsets":
        try:
            args.how, args.value = _reset_target(args)
            args.targets = [_parse_topic(t) for t in args.topic or ()]
        except ValueError as exc:
            usage.error(str(exc))
    try:
        brokers = resolve_brokers(args)
    except NoClusterError as exc:
        return _fail(prog, f"{exc} (for brokers: --bootstrap HOST:PORT)")
    run = {"list": _list, "describe": _describe, "reset-offsets": _reset, "delete": _delete}[args.action]
    return _run(prog, run(args, prog, brokers.bootstrap), brokers.hint)


def _action_parser(p: argparse.ArgumentParser, action: str) -> argparse.ArgumentParser:
    """The subcommand's own parser, so a usage error shows that subcommand's usage."""
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            found: argparse.ArgumentParser = a.choices[action]
            return found
    return p


def _reset_target(args: argparse.Namespace) -> tuple[str, int | None]:
    if args.to_earliest:
        return "earliest", None
    if args.to_latest:
        return "latest", None
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise ValueError(f"--to-offset {args.to_offset} must be >= 0")
        return "offset", args.to_offset
    text = args.to_datetime
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--to-datetime {text!r} is not an ISO 8601 time such as 2026-11-25T08:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"--to-datetime {text!r} is before 1970")
    return "timestamp", ms


def _parse_topic(text: str) -> tuple[str, list[int] | None]:
    topic, sep, rest = text.partition(":")
    if not topic:
        raise ValueError(f"--topic {text!r}: name a topic, e.g. --topic events or --topic events:0,2")
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in rest.split(",")]
    except ValueError:
        raise ValueError(f"--topic {text!r}: partitions must be numbers, e.g. {topic}:0,2") from None
    if not partitions or any(p < 0 for p in partitions):
        raise ValueError(f"--topic {text!r}: partitions must be numbers >= 0, e.g. {topic}:0,2")
    return topic, partitions


def _emit(args: argparse.Namespace, doc: Any, text: str) -> int:
    print(json.dumps(doc, indent=2) if args.json else text)
    return 0


# ------------------------------------------------------------------ list

async def _list(args: argparse.Namespace, prog: str, bootstrap: str) -> int:
    async with GroupAdmin(bootstrap, request_timeout_ms=args.timeout_ms) as admin:
        groups, failures = await admin.list_groups(args.state or ())
    for failure in failures:
        _note(prog, f"warning: {failure}; the groups it coordinates are missing")
    doc = [{"group_id": g.group_id, "state": g.group_state, "protocol_type": g.protocol_type} for g in groups]
    text = table([[g.group_id, g.group_state, g.protocol_type] for g in groups], ["GROUP", "STATE", "PROTOCOL"]) \
        if groups else "no groups"
    _emit(args, doc, text)
    return 1 if failures else 0


# ------------------------------------------------------------------ describe

def description_doc(d: GroupDescription) -> dict[str, Any]:
    return {
        "group_id": d.group_id, "state": d.state, "protocol_type": d.protocol_type, "protocol": d.protocol,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                     "client_host": m.client_host,
                     "assignment": None if m.assignment is None else [[tp.topic, tp.partition] for tp in m.assignment]}
                    for m in d.members],
        "partitions": [{"topic": p.partition.topic, "partition": p.partition.partition, "committed": p.committed,
                        "end": p.end, "lag": p.lag, "member_id": p.member_id} for p in d.partitions],
    }


def _assignment_text(partitions: tuple[TopicPartition, ...] | None, size: int) -> str:
    if partitions is None:
        return f"({size} bytes, not a consumer assignment)"
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items())) or "-"


def description_text(d: GroupDescription) -> str:
    protocol = f"{d.protocol_type}/{d.protocol}" if d.protocol else (d.protocol_type or "-")
    lines = [f"group {d.group_id}: {d.state}, protocol {protocol}, {len(d.members)} member(s)"]
    if d.members:
        lines += ["", table([[m.member_id, m.group_instance_id, m.client_id, m.client_host,
                              _assignment_text(m.assignment, m.assignment_bytes)] for m in d.members],
                            ["MEMBER", "INSTANCE", "CLIENT", "HOST", "ASSIGNMENT"])]
    if d.partitions:
        total = sum(p.lag or 0 for p in d.partitions)
        lines += ["", table([[p.partition.topic, p.partition.partition, p.committed, p.end, p.lag, p.member_id]
                             for p in d.partitions], ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER"]),
                  "", f"total lag: {total}"]
    else:
        lines += ["", "no committed offsets"]
    return "\n".join(lines)


async def _describe(args: argparse.Namespace, prog: str, bootstrap: str) -> int:
    async with GroupAdmin(bootstrap, request_timeout_ms=args.timeout_ms) as admin:
        d = await admin.describe(args.group)
    if not d.exists:
        return _fail(prog, f"group {args.group!r} does not exist (no members, no committed offsets); "
                           "`biplane group list` shows the groups there are")
    return _emit(args, description_doc(d), description_text(d))


# ------------------------------------------------------------------ reset-offsets

async def _reset(args: argparse.Namespace, prog: str, bootstrap: str) -> int:
    async with GroupAdmin(bootstrap, request_timeout_ms=args.timeout_ms) as admin:
        d = await admin.describe(args.group)
        if d.state not in EMPTY_STATES or d.members:
            return _fail(prog, f"group {args.group!r} is {d.state} with {len(d.members)} member(s): offsets can be "
                               "reset only while it has none; stop its consumers first")
        current = {p.partition: p.committed for p in d.partitions}
        if args.all_topics:
            tps = sorted(tp for tp, c in current.items() if c is not None)
            if not tps:
                return _fail(prog, f"group {args.group!r} has no committed offsets: name the topics with --topic")
        else:
            tps = []
            for topic, partitions in args.targets:
                known = await admin.partitions(topic)
                if partitions is None:
                    tps += known
                    continue
                bad = [p for p in partitions if TopicPartition(topic, p) not in known]
                if bad:
                    return _fail(prog, f"topic {topic!r} has {len(known)} partition(s); {bad} do not exist")
                tps += [TopicPartition(topic, p) for p in partitions]
            tps = sorted(set(tps))
        targets = await admin.offsets_for(tps, args.how, args.value)
        if not args.dry_run:
            await admin.reset_offsets(args.group, targets)
    rows = [[tp.topic, tp.partition, current.get(tp), targets[tp]] for tp in tps]
    doc = {"group_id": args.group, "dry_run": args.dry_run,
           "offsets": [{"topic": tp.topic, "partition": tp.partition, "previous": current.get(tp),
                        "new": targets[tp]} for tp in tps]}
    verb = "would be reset (dry run: nothing committed)" if args.dry_run else "reset"
    text = table(rows, ["TOPIC", "PARTITION", "PREVIOUS", "NEW"]) + \
        f"\n\n{len(tps)} partition(s) of group {args.group} {verb}"
    return _emit(args, doc, text)


# ------------------------------------------------------------------ delete

_DELETE_TEXT = {
    ErrorCode.NONE: "deleted",
    ErrorCode.NON_EMPTY_GROUP: "not deleted: it has members; stop its consumers first",
    ErrorCode.GROUP_ID_NOT_FOUND: "not deleted: no such group",
}


async def _delete(args: argparse.Namespace, prog: str, bootstrap: str) -> int:
    async with GroupAdmin(bootstrap, request_timeout_ms=args.timeout_ms) as admin:
        results = await admin.delete(list(dict.fromkeys(args.groups)))
    doc = {g: code.name for g, code in results.items()}
    failed = {g: c for g, c in results.items() if c != ErrorCode.NONE}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for group, code in results.items():
            line = f"group {group}: {_DELETE_TEXT.get(code, f'not deleted: {code.name}')}"
            print(line, file=sys.stderr if code != ErrorCode.NONE else sys.stdout)
    return 1 if failed else 0
