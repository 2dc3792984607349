"""Leader-epoch cache: for each leader epoch, the first offset written in it.

The cache itself is pure (a sorted list); `files.write_atomically` makes it
durable. Followers use `end_offset_for_epoch` on the leader to find where their
log diverges (Kafka's OffsetsForLeaderEpoch).
"""
from __future__ import annotations

import bisect

from common.errors import CorruptBatchError, StaleEpochError

from .interface import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEntry

_FORMAT_VERSION = 0


class EpochCache:
    """Epochs and start offsets, both strictly increasing."""

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for entry in entries or []:
            self.assign(entry.epoch, entry.start_offset)

    def entries(self) -> list[EpochEntry]:
        return [EpochEntry(epoch=e, start_offset=s) for e, s in zip(self._epochs, self._starts)]

    def epoch_before(self, offset: int) -> int:
        """The epoch of the batch holding offset - 1: the last epoch starting below `offset`
        (UNDEFINED_EPOCH for an empty prefix). A bisection: a push follower asks this for every
        batch it is sent, and a long-lived log has hundreds of epochs."""
        i = bisect.bisect_left(self._starts, offset)
        return self._epochs[i - 1] if i > 0 else UNDEFINED_EPOCH

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def would_change(self, epoch: int) -> bool:
        return epoch > self.latest_epoch

    def check_epoch(self, epoch: int) -> None:
        """Refuse an epoch older than the latest one: a log's epochs never go backwards."""
        if epoch < self.latest_epoch:
            raise StaleEpochError(
                f"leader epoch {epoch} is older than the log's latest epoch {self.latest_epoch}; "
                f"truncate the log before writing an older epoch's batches",
                field="leader_epoch", expected=self.latest_epoch, actual=epoch)

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; returns True when the cache changed."""
        self.check_epoch(epoch)
        if epoch == self.latest_epoch:
            return False
        if self._starts and start_offset < self._starts[-1]:
            raise StaleEpochError(
                f"epoch {epoch} cannot start at offset {start_offset}, before epoch "
                f"{self._epochs[-1]}'s start offset {self._starts[-1]}",
                field="leader_epoch", expected=self.latest_epoch, actual=epoch)
        if self._starts and start_offset == self._starts[-1]:
            # The previous epoch never got a batch; a later epoch replaces it.
            self._epochs[-1] = epoch
            return True
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Forget epochs that start at or after end_offset (the log was truncated there)."""
        keep = bisect.bisect_left(self._starts, end_offset)
        if keep == len(self._starts):
            return False
        del self._epochs[keep:], self._starts[keep:]
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """Drop epochs wholly below start_offset; the epoch covering it now starts there."""
        covering = bisect.bisect_right(self._starts, start_offset) - 1
        if covering < 0:
            return False
        changed = covering > 0 or self._starts[0] != start_offset
        del self._epochs[:covering], self._starts[:covering]
        self._starts[0] = start_offset
        return changed

    def clear(self) -> bool:
        changed = bool(self._epochs)
        self._epochs.clear()
        self._starts.clear()
        return changed

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's semantics: (the largest known epoch <= epoch, where it ends).

        Where it ends is the start offset of the next known epoch, or log_end_offset
        for the latest epoch. An epoch below every known one answers
        (epoch, start of the first known epoch): nothing of it is here. An empty
        cache answers (UNDEFINED_EPOCH, UNDEFINED_OFFSET).
        """
        if not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if i < 0:
            return epoch, self._starts[0]
        if i == len(self._epochs) - 1:
            return self._epochs[i], log_end_offset
        return self._epochs[i], self._starts[i + 1]

    def encode(self) -> bytes:
        lines = [str(_FORMAT_VERSION), str(len(self._epochs))]
        lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes, *, path: str) -> EpochCache:
        try:
            lines = data.decode().splitlines()
            if int(lines[0]) != _FORMAT_VERSION:
                raise ValueError(f"unknown version {lines[0]!r}")
            count = int(lines[1])
            if count != len(lines) - 2:
                raise ValueError(f"header says {count} entries, file has {len(lines) - 2}")
            entries = []
            for line in lines[2:]:
                epoch, start = line.split()
                entries.append(EpochEntry(epoch=int(epoch), start_offset=int(start)))
            return cls(entries)
        except (ValueError, IndexError, UnicodeDecodeError, StaleEpochError) as exc:
            raise CorruptBatchError(
                f"leader-epoch checkpoint {path} is unreadable ({exc}); "
                f"move it aside to rebuild it from the log") from exc
