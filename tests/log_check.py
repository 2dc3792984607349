"""Find unexpected errors in the logs of the processes a test started.

Every Biplane server writes `<time> level=LEVEL logger=NAME message` lines
(common/logs.py); anything else in its log is stderr: a traceback, or the
continuation of a log line's `exc_info`. An *error entry* is one of:
- a line at level ERROR or CRITICAL, with the lines that follow it up to the
  next log line (its traceback, if any);
- a `Traceback (most recent call last):` block anywhere else (after a
  WARNING's exc_info, an exception printed by a thread, asyncio or Python at
  exit), with the log line it follows.

`LogWatch` remembers, per file, how far it has read, so a cluster started once
for a whole module is checked test by test, each test answering for the
entries written while it ran. `tests/conftest.py` runs it after every test
over the logs the harnesses registered (`watch`) and every `*.log` under the
test's `tmp_path`; a test names the entries it expects with
`@pytest.mark.expected_log_errors(r"regex", ...)` (searched in the entry's text).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterable

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} level=(?P<level>[A-Z]+) ")
TRACEBACK_STARTS = ("Traceback (most recent call last):", "Exception in thread", "Exception ignored in")
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})
ENTRY_LINES_MAX = 60            # an entry shown in a failure is cut after this many lines
FILE_BYTES_MAX = 64 * 1024 * 1024   # read at most this much of one log per check


@dataclasses.dataclass(frozen=True, kw_only=True)
class ErrorEntry:
    path: Path
    line_number: int            # 1-based, in the part of the file that was read
    text: str

    def describe(self) -> str:
        lines = self.text.splitlines()
        shown = lines[:ENTRY_LINES_MAX] + ([f"... ({len(lines) - ENTRY_LINES_MAX} more lines)"]
                                           if len(lines) > ENTRY_LINES_MAX else [])
        return f"{self.path}:{self.line_number}:\n    " + "\n    ".join(shown)


def error_entries(text: str, *, path: Path = Path("-"), first_line: int = 1) -> list[ErrorEntry]:
    """The error entries in `text` (a log, or the new part of one); `first_line` numbers its first line."""
    entries: list[ErrorEntry] = []
    lines = text.splitlines()
    start: int | None = None      # index of the current entry's first line
    is_error = has_traceback = False

    def close(end: int) -> None:
        if start is not None and (is_error or has_traceback):
            entries.append(ErrorEntry(path=path, line_number=first_line + start,
                                      text="\n".join(lines[start:end])))

    for i, line in enumerate(lines):
        m = LOG_LINE.match(line)
        if m is not None:
            close(i)
            start, is_error, has_traceback = i, m.group("level") in ERROR_LEVELS, False
            continue
        if start is None:
            start = i
        if line.startswith(TRACEBACK_STARTS):
            has_traceback = True
    close(len(lines))
    return entries


def unexpected(entries: Iterable[ErrorEntry], allowed: Iterable[str]) -> list[ErrorEntry]:
    """The entries no `allowed` regex matches (re.search over the entry's text)."""
    patterns = [re.compile(p) for p in allowed]
    return [e for e in entries if not any(p.search(e.text) for p in patterns)]


class LogWatch:
    """Log files to check and how far each has been checked. Bounded by the files watched."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}

    def watch(self, path: Path) -> None:
        self._offsets.setdefault(Path(path).resolve(), 0)

    def watch_tree(self, root: Path) -> None:
        """Every `*.log` file under `root` (as it is now), but partition segments (`<digits>.log`)."""
        for path in sorted(Path(root).rglob("*.log")):
            if path.is_file() and not path.stem.isdigit():
                self.watch(path)

    def read_new(self) -> list[ErrorEntry]:
        """Error entries written since the last call, in every watched file.

        Only whole lines are consumed: a line still being written is read next time.
        """
        entries: list[ErrorEntry] = []
        for path, offset in list(self._offsets.items()):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(FILE_BYTES_MAX)
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            if end == 0:
                continue
            self._offsets[path] = offset + end
            entries.extend(error_entries(data[:end].decode(errors="replace"), path=path,
                                         first_line=_line_of(path, offset)))
        return entries

    def __len__(self) -> int:
        return len(self._offsets)


def _line_of(path: Path, offset: int) -> int:
    """1-based number of the line that starts at byte `offset`."""
    count = 0
    with open(path, "rb") as f:
        remaining = offset
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count + 1


# The session's watch: the harnesses register the logs of the processes they start.
WATCH = LogWatch()


def watch(path: Path) -> None:
    WATCH.watch(path)


def failure_message(entries: list[ErrorEntry]) -> str:
    return (f"{len(entries)} unexpected error(s) in process logs; fix them, or name the expected ones with "
            "@pytest.mark.expected_log_errors(r'regex', ...):\n" + "\n".join(e.describe() for e in entries))
