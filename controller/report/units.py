"""Figures as a planner reads them: bytes in KiB/MiB/GiB/TiB, rates per second, days.

Pure and small: the report's HTML tables, summaries and plot axes all go through
these, and the CSVs keep the exact numbers for tools.
"""
from __future__ import annotations

import math

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
STEP = 1024


def byte_unit(value: float) -> tuple[float, str]:
    """The binary unit `value` bytes reads best in: (bytes per unit, name); KiB and up
    once a value reaches 1 KiB, so 1,536 bytes is 1.50 KiB."""
    magnitude = abs(value)
    power = 0
    while power < len(BYTE_UNITS) - 1 and magnitude >= STEP ** (power + 1):
        power += 1
    return float(STEP ** power), BYTE_UNITS[power]


def human_bytes(value: float | None) -> str:
    """1536 -> '1.50 KiB'; 4 * 2**40 -> '4.00 TiB'; three significant figures from KiB up."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    scale, unit = byte_unit(value)
    if unit == "B":
        return f"{int(value)} B"
    shown = value / scale
    digits = 2 if abs(shown) < 10 else 1 if abs(shown) < 100 else 0
    return f"{shown:.{digits}f} {unit}"


def human_rate(bytes_per_s: float | None) -> str:
    """Bytes per second: 52428800 -> '50.0 MiB/s'."""
    text = human_bytes(bytes_per_s)
    return f"{text}/s" if text else ""


def human_per_day(bytes_per_day: float | None) -> str:
    text = human_bytes(bytes_per_day)
    return f"{text}/day" if text else ""


def human_days(days: float | None) -> str:
    """Days until full: '9.8 days', '0.4 days', or '' when the broker is not filling."""
    if days is None or (isinstance(days, float) and math.isnan(days)):
        return ""
    return f"{days:.1f} days" if days < 100 else f"{days:,.0f} days"


def human_duration(seconds: float | None) -> str:
    """A transfer's length: '45 s', '12 min', '3.5 h', '2.1 days'."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return ""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def human_value(column: str, value: object) -> object:
    """`value` of a report column in human units, chosen by the column's name (units in names:
    `bytes`, `bytes_per_s`, `bytes_per_day`, `_seconds`, `days_until_full...`; ratios end in
    `_over_mean`); other columns as they are."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if "bytes_per_s" in column:
        return human_rate(float(value))
    if "bytes_per_day" in column:
        return human_per_day(float(value))
    if column.endswith("_over_mean"):  # a ratio of byte counts
        return value
    if column.endswith("_bytes") or "_bytes_" in column or column.startswith("bytes_"):
        return human_bytes(float(value))
    if column.endswith("_seconds"):
        return human_duration(float(value))
    if column.startswith("days_until_full"):
        return human_days(float(value))
    return value
