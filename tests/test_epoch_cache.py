"""The leader-epoch cache's epoch lookup (dataplane/log/epoch_cache.py)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dataplane.log.epoch_cache import EpochCache
from dataplane.log.interface import UNDEFINED_EPOCH


def _by_scan(cache: EpochCache, offset: int) -> int:
    """The definition: the epoch of the last entry starting below `offset`."""
    epoch = UNDEFINED_EPOCH
    for entry in cache.entries():
        if entry.start_offset < offset:
            epoch = entry.epoch
    return epoch


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 5)), max_size=40), st.integers(-2, 200))
def test_epoch_before_is_the_last_epoch_starting_below_the_offset(steps: list[tuple[int, int]], offset: int) -> None:
    cache = EpochCache()
    epoch, start = 0, 0
    for epoch_step, start_step in steps:
        epoch, start = epoch + epoch_step, start + start_step
        cache.assign(epoch, start)
    assert cache.epoch_before(offset) == _by_scan(cache, offset)
    for entry in cache.entries():
        assert cache.epoch_before(entry.start_offset) == _by_scan(cache, entry.start_offset)
        assert cache.epoch_before(entry.start_offset + 1) == entry.epoch


def test_a_push_follower_checks_a_long_lived_logs_epochs_without_walking_them() -> None:
    """A push follower asks the epoch before every batch it is sent (a leader's resend of a
    range it holds is thousands). Walking every epoch each time held a broker's event loop
    for seconds in a long fault run, once its logs had hundreds of epochs; the lookup must not
    build the entry list."""
    cache = EpochCache()
    for epoch in range(1, 301):
        cache.assign(epoch, epoch * 100)
    built = []
    original = cache.entries
    cache.entries = lambda: built.append(1) or original()  # type: ignore[method-assign]
    assert [cache.epoch_before(o) for o in (0, 100, 101, 30_000, 30_001)] == [-1, -1, 1, 299, 300]
    assert not built
