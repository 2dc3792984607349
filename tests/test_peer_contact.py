"""dataplane/broker/contact.py: which replication links a broker reports silent."""
from __future__ import annotations

from common.topic_partition import TopicPartition
from dataplane.broker.contact import Expected, PeerContact

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)


def test_a_link_is_reported_once_silent_past_its_bound_and_not_after_word_comes():
    c = PeerContact()
    link = Expected(T0, 3, 2, 1000)
    assert c.unreachable([link], 0) == []       # expected from now on
    c.heard(2, 500)
    assert c.unreachable([link], 1500) == []    # 1000 since the last word: not past
    assert c.unreachable([link], 1501) == [link]
    c.heard(2, 1600)
    assert c.unreachable([link], 1700) == []


def test_a_new_epoch_or_role_gets_its_whole_bound_from_when_it_is_first_expected():
    """A leader change is not a cut: the new link's clock starts when it is first expected,
    whatever the peer's old silence."""
    c = PeerContact()
    assert c.unreachable([Expected(T0, 3, 2, 1000)], 0) == []
    new = Expected(T0, 4, 5, 1000)
    assert c.unreachable([new], 5000) == []
    assert c.unreachable([new], 6001) == [new]


def test_links_not_expected_any_more_are_forgotten():
    c = PeerContact()
    a, b = Expected(T0, 1, 2, 100), Expected(T1, 1, 3, 100)
    c.unreachable([a, b], 0)
    c.unreachable([b], 50)
    # a comes back: expected afresh from 160, not from 0.
    assert c.unreachable([a, b], 160) == [b]
    assert c.unreachable([a, b], 260) == [b]
    assert c.unreachable([a, b], 261) == [a, b]


def test_a_stall_of_its_own_is_not_its_peers_silence():
    c = PeerContact()
    link = Expected(T0, 1, 2, 1000)
    c.unreachable([link], 0)
    c.heard(2, 100)
    # The loop stalled from 100 to 3000: nothing was read meanwhile.
    c.forget_silence()
    assert c.unreachable([link], 3000) == []
    assert c.unreachable([link], 4001) == [link]


class Oracle:
    """The rule as the module states it, link by link with nothing kept between calls but
    each link's first-expected time and each peer's last word."""

    def __init__(self) -> None:
        self.heard_ms: dict[int, int] = {}
        self.since: dict[tuple, int] = {}

    def unreachable(self, expected: list[Expected], now_ms: int) -> list[Expected]:
        self.since = {(e.tp, e.leader_epoch, e.peer): self.since.get((e.tp, e.leader_epoch, e.peer), now_ms)
                      for e in expected}
        return [e for e in expected
                if now_ms - max(self.since[(e.tp, e.leader_epoch, e.peer)],
                                self.heard_ms.get(e.peer, -10**9)) > e.bound_ms]


def _against_the_rule(links: list[Expected], grouped=None) -> None:
    """Random words, checks, relists (a subset of `links`) and stalls: the contact's answers
    must be the rule's (Oracle), link by link, every time. `grouped(chosen, before)`: how
    the broker would pass the links (else the plain list)."""
    from hypothesis import given, settings, strategies as st

    step = st.one_of(st.tuples(st.just("heard"), st.sampled_from([2, 3, 4]), st.integers(0, 400)),
                     st.tuples(st.just("check"), st.just(0), st.integers(0, 400)),
                     st.tuples(st.just("relist"), st.integers(0, (1 << len(links)) - 1), st.integers(0, 400)),
                     st.tuples(st.just("stall"), st.just(0), st.integers(0, 400)))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(step, max_size=40))
    def run(steps):
        contact, oracle = PeerContact(), Oracle()
        current = list(links)
        passed = grouped(current, {}) if grouped is not None else current
        now = 0
        for kind, arg, advance in steps:
            now += advance
            if kind == "heard":
                contact.heard(arg, now)
                oracle.heard_ms[arg] = now
            elif kind == "relist":
                current = [link for i, link in enumerate(links) if arg & (1 << i)]
                passed = grouped(current, passed) if grouped is not None else current
            elif kind == "stall":
                contact.forget_silence()
                oracle.heard_ms.clear()
                oracle.since = {}
            assert contact.unreachable(passed, now) == oracle.unreachable(current, now)
    run()


def test_passing_the_same_list_again_gives_what_the_rule_gives():
    """The broker passes one list per metadata image (the check then skips peers heard within
    their tightest bound); the answers must be the rule's, link by link, every time."""
    _against_the_rule([Expected(TopicPartition("t", p), 1, peer, bound) for p, peer, bound in
                       [(0, 2, 100), (1, 3, 300), (2, 2, 500), (3, 4, 200)]])


def test_links_passed_in_groups_give_what_the_rule_gives_and_unchanged_groups_are_kept():
    """The broker passes its links as one group per topic, a group the same sequence object
    while its topic is unchanged, so that a metadata change works out only the topics it
    touched; the answers must still be the rule's, link by link, and a group passed again
    keeps when each of its links became expected."""
    def grouped(chosen: list[Expected], before: dict[str, tuple[Expected, ...]]) -> dict[str, tuple[Expected, ...]]:
        out: dict[str, tuple[Expected, ...]] = {}
        for topic in sorted({e.tp.topic for e in chosen}):
            group = tuple(e for e in chosen if e.tp.topic == topic)
            out[topic] = before[topic] if before.get(topic) == group else group   # unchanged: the same object
        return out
    _against_the_rule([Expected(TopicPartition(topic, p), 1, peer, bound) for topic, p, peer, bound in
                       [("a", 0, 2, 100), ("a", 1, 3, 300), ("b", 0, 2, 500), ("b", 1, 4, 200), ("c", 0, 3, 150)]],
                      grouped)
