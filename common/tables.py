"""Plain-text tables for the CLI commands (admin and data plane alike): left-aligned
columns two spaces apart, "-" for a missing value."""
from __future__ import annotations

from typing import Any


def cell(value: Any) -> str:
    """A value as a user types it back (`--config unclean_leader_election=true`): true/false,
    not Python's True/False; "-" for none."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)
