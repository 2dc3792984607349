"""Read each broker's partition logs straight from its segment files (after every process
stopped): decode batches and records into (offset, "e<leader epoch>|pid<id>:<epoch>:<seq>|<value>")
entries (the producer part is "-" for a batch without a producer id).
Batches without records (a new leader's epoch-start batch, control batches) become one entry
"e<epoch>|<control>" at their base offset, so two replicas compare entry for entry.
"""
from __future__ import annotations

import os
from pathlib import Path

from common.batch import iter_batches, read_records, scan_valid_prefix
from common.errors import BiplaneError

SEGMENT_SUFFIX = ".log"


def read_partition_dir(directory: Path) -> tuple[list[tuple[int, str]], list[str]]:
    """Entries of one replica's log and notes on anything that did not decode."""
    entries: list[tuple[int, str]] = []
    notes: list[str] = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(SEGMENT_SUFFIX):
            continue
        data = (directory / name).read_bytes()
        valid, _ = scan_valid_prefix(data)
        if valid < len(data):
            notes.append(f"{directory / name}: {len(data) - valid} bytes past the valid prefix (torn tail)")
        for pos, header in iter_batches(memoryview(data)[:valid]):
            try:
                records = read_records(data, pos)
            except BiplaneError as exc:
                notes.append(f"{directory / name} @{pos}: {exc}")
                continue
            if header.is_control or not records:
                entries.append((header.base_offset, f"e{header.leader_epoch}|<control>"))
                continue
            for i, r in enumerate(records):
                value = r.value.decode(errors="replace") if r.value is not None else "<null>"
                producer = (f"pid{header.producer_id}:{header.producer_epoch}:{header.base_sequence + i}"
                            if header.has_producer_id else "-")
                entries.append((r.offset, f"e{header.leader_epoch}|{producer}|{value}"))
    return entries, notes


def read_broker(data_dir: Path, topics: set[str]) -> tuple[dict[str, list[tuple[int, str]]], list[str]]:
    """tp key ("topic/partition") -> entries, for every partition directory of these topics."""
    out: dict[str, list[tuple[int, str]]] = {}
    notes: list[str] = []
    if not data_dir.is_dir():
        return out, [f"{data_dir}: missing"]
    for name in sorted(os.listdir(data_dir)):
        topic, sep, partition = name.rpartition("-")
        if not sep or topic not in topics or not partition.isdigit() or not (data_dir / name).is_dir():
            continue
        entries, more = read_partition_dir(data_dir / name)
        out[f"{topic}/{partition}"] = entries
        notes += more
    return out, notes
