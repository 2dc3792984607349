"""What operators see of the groups a broker coordinates: a plain copy of each group's
state, member count and committed offsets, and the bounded
form a usage report carries. Pure: the driver copies the cores' groups on the event loop
(`snapshot`), everything after works on the copy, on any thread.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from common.usage import GROUP_OFFSETS_REPORTED_MAX, GROUPS_REPORTED_MAX, GroupOffsetUsage, GroupUsage
from dataplane.groups.state import Group, GroupState


@dataclasses.dataclass(frozen=True, slots=True)
class GroupSnapshot:
    group: str
    state: str                                   # GroupState's value: "Stable", "Empty", ...
    members: int
    offsets: tuple[tuple[str, int, int], ...]    # (topic, partition, committed offset), sorted


def snapshot(groups: Iterable[Group]) -> list[GroupSnapshot]:
    """Copies of the groups, sorted by id. Dead groups (being deleted) are left out, and so
    are negative committed offsets (a client may commit -1: no position to measure lag from)."""
    out = []
    for g in groups:
        if g.state is GroupState.DEAD:
            continue
        offsets = tuple(sorted((topic, partition, c.offset) for (topic, partition), c in g.offsets.items()
                               if c.offset >= 0))
        out.append(GroupSnapshot(group=g.group_id, state=g.state.value, members=len(g.members), offsets=offsets))
    out.sort(key=lambda s: s.group)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class GroupReport:
    groups: list[GroupUsage]
    groups_omitted: int
    offsets_omitted: int


def usage_report(snapshots: Iterable[GroupSnapshot], *, groups_max: int = GROUPS_REPORTED_MAX,
                 offsets_max: int = GROUP_OFFSETS_REPORTED_MAX) -> GroupReport:
    """The groups for a usage report, bounded: groups in the order given (sorted by id), each
    with its offsets in order, until `groups_max` groups or `offsets_max` offsets are in;
    a group reached once the offsets are used up is still reported (state, members) with the
    offsets that fit — none — and the rest are counted as omitted."""
    groups: list[GroupUsage] = []
    groups_omitted = offsets_omitted = 0
    room = offsets_max
    for s in snapshots:
        if len(groups) >= groups_max:
            groups_omitted += 1
            offsets_omitted += len(s.offsets)
            continue
        kept = s.offsets[:max(room, 0)]
        room -= len(kept)
        offsets_omitted += len(s.offsets) - len(kept)
        groups.append(GroupUsage(group=s.group, state=s.state, members=s.members, offsets=[
            GroupOffsetUsage(topic=t, partition=p, committed_offset=o) for t, p, o in kept]))
    return GroupReport(groups=groups, groups_omitted=groups_omitted, offsets_omitted=offsets_omitted)
