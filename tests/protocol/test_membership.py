"""Membership views: joins, leaves, locks and virtual synchrony through New List packets (paper 4.3)."""

from __future__ import annotations

import pytest

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import Delivered, JoinFailed, Left, LockResult, ViewInstalled
from rmpd.protocol.ids import ViewId
from rmpd.protocol.membership import apply_change
from rmpd.protocol.packets import ListChangeRequest, NewList
from rmpd.protocol.qos import QoS
from rmpd.protocol.reformation import MIN_PARTITION_ALL, MIN_PARTITION_MAJORITY
from rmpd.protocol.view import View

from .harness import Net


def group_of(n: int, config: EngineConfig | None = None, min_partitions: list[int] | None = None) -> Net:
    """``n`` members joined one after the other; ``min_partitions[i]``: what member i asks for (default 1 each)."""
    wanted = min_partitions or [1] * n
    net = Net(n, config)
    net.do(0, lambda p, now: p.create("g", now, min_partition=wanted[0]))
    for i in range(1, n):
        net.do(i, lambda p, now, m=wanted[i]: p.join("g", now, min_partition=m))
        net.advance(0.5)
    return net


MAJORITY, ALL = MIN_PARTITION_MAJORITY, MIN_PARTITION_ALL


@pytest.mark.parametrize(("group", "joiner", "size_before", "kept"), [
    (MAJORITY, 1, 2, MAJORITY),  # a max kept 1 here: the default joiner dropped the group's majority
    (1, MAJORITY, 1, MAJORITY),  # at 2 members a majority is 2, stricter than 1
    (2, MAJORITY, 4, MAJORITY),  # at 5: 3 against 2
    (3, MAJORITY, 3, 3),  # at 4: 3 against 3, a tie keeps the group's
    (MAJORITY, 3, 3, MAJORITY),  # the same tie the other way round
    (MAJORITY, 4, 4, 4),  # at 5: 4 against 3
    (MAJORITY, ALL, 1, MAJORITY),  # at 2 both require 2: the group's
    (MAJORITY, ALL, 2, ALL),  # at 3: 3 against 2
    (5, 9, 2, 5),  # at 3 both are capped at 3: the group's
    (ALL, 2, 3, ALL),
])
def test_a_join_keeps_the_minimum_partition_that_requires_more_at_the_new_size(
        group: int, joiner: int, size_before: int, kept: int) -> None:
    members = tuple(f"10.0.0.{i}:7000" for i in range(1, size_before + 1))
    view = View(ViewId(members[0], 1), members, min_partition=group)
    request = ListChangeRequest("g", None, "10.0.0.99:7000", 1, "join", 0, True, joiner, 1)
    change = apply_change(view, request, members[0])
    assert change.granted and len(change.members) == size_before + 1
    assert change.min_partition == kept


def test_members_joining_with_the_default_keep_a_founders_majority_everywhere() -> None:
    net = group_of(3, min_partitions=[MAJORITY, 1, 1])
    assert all(net[i].view("g").size == 3 and net[i].view("g").min_partition == MAJORITY for i in range(3))
    later = group_of(3, min_partitions=[1, 1, MAJORITY])  # a joiner's majority is taken: 2 of 3 against 1
    assert all(later[i].view("g").min_partition == MAJORITY for i in range(3))


def test_joiner_is_placed_after_the_token_site_and_takes_the_token() -> None:
    net = group_of(2)
    a, b = net.pids[:2]
    assert net.views(1) == [(a, b)]
    assert net.views(0) == [(a,), (a, b)]
    assert net[1].engines["g"].token.accepted_ts >= 1, "the joiner was named next token site and accepted"


def test_join_without_answer_forms_a_group_of_its_own() -> None:
    net = Net(2)
    net.do(1, lambda p, now: p.join("g", now))
    net.advance(30.0)
    assert net.views(1) == [(net.pids[1],)]
    assert net[1].stats["join_requests"] == net[1].config.join_retries


def test_existing_only_join_fails_clearly() -> None:
    net = Net(2)
    net.do(1, lambda p, now: p.join("g", now, existing_only=True))
    net.advance(30.0)
    failures = net.of_type(1, JoinFailed)
    assert len(failures) == 1 and "answered" in failures[0].reason
    assert net[1].view("g") is None


def test_a_join_kept_from_founding_fails_unanswered_and_is_still_admitted_when_answered() -> None:
    net = Net(3)
    net.do(1, lambda p, now: p.join("g", now))
    assert net[1].keep_from_founding("g")  # the runtime heard the group in a form it cannot take
    assert not net[1].keep_from_founding("other")  # no join of it under way
    net.advance(30.0)
    failures = net.of_type(1, JoinFailed)
    assert len(failures) == 1 and "answered" in failures[0].reason
    assert net[1].view("g") is None and net[1].groups() == []

    net.do(0, lambda p, now: p.create("g", now))
    net.do(2, lambda p, now: p.join("g", now))
    assert net[2].keep_from_founding("g")
    net.advance(5.0)
    assert net[2].view("g") is not None and len(net[2].view("g").members) == 2


def history(net: Net, i: int) -> list[object]:
    """Deliveries and view installs, in the order the application saw them."""
    out: list[object] = []
    for e in net.events[net.pids[i]]:
        if isinstance(e, Delivered):
            out.extend(e.payloads)
        elif isinstance(e, ViewInstalled):
            out.append(("view", e.view))
    return out


def test_messages_split_at_the_same_point_around_view_changes() -> None:
    net = group_of(4)
    for i in range(8):
        net.send(i % 4 if i < 4 else (0, 1, 3)[i % 3], f"m{i}".encode())
        if i == 3:
            net.do(2, lambda p, now: p.leave("g", now))
        if i == 5:
            net.do(1, lambda p, now: p.lock("g", 2, now))
    net.advance(5.0)
    last_join = history(net, 3)[0]
    suffixes = [h[h.index(last_join):] for h in (history(net, 0), history(net, 1), history(net, 3))]
    assert suffixes[0] == suffixes[1] == suffixes[2]
    assert sum(isinstance(x, tuple) for x in suffixes[0]) == 3, "join of the fourth, the leave, the lock"
    assert sorted(x for x in suffixes[0] if isinstance(x, bytes)) == sorted(f"m{i}".encode() for i in range(8))


def test_a_member_left_alone_by_a_leave_waits_on_no_token_pass() -> None:
    """The New List that removes the only other member passes the token to its sender itself; nothing will confirm
    that pass, so none may be pending (it was resent until a failure was suspected, 4.5 s later, and the
    reformation held up the last member's own leave)."""
    net = group_of(2)
    a, b = net.pids
    for i in (0, 1):  # whichever member orders the leave, the token ends with the one left
        net.send(1 - i, b"before")
        net.do(1, lambda p, now: p.leave("g", now))
        net.advance(10.0)
        engine = net[0].engines["g"]
        assert net.views(0)[-1] == (a,)
        assert engine.token.pass_pending is None and engine.token.pass_timer.deadline is None
        assert engine.stats["failures_suspected"] == 0 and engine.stats["ack_retransmits"] == 0
        net.do(1, lambda p, now: p.join("g", now))
        net.advance(1.0)
        assert net.views(1)[-1] == (a, b)


def test_leave_commits_then_departs_and_nothing_sent_is_lost() -> None:
    net = group_of(3)
    a, b, _c = net.pids
    net.send(2, b"last-words")
    net.do(2, lambda p, now: p.leave("g", now))
    net.advance(10.0)
    assert net.views(0)[-1] == (a, b)
    assert net.views(1)[-1] == (a, b)
    assert b"last-words" in net.delivered(0) and b"last-words" in net.delivered(1)
    assert b"last-words" in net.delivered(2)
    assert len(net.of_type(2, Left)) == 1
    assert "g" not in net[2].engines
    # The group's counters stay with the process once its engine is gone: an operator's counters never go back.
    assert net[2].stats["delivered"] == len(net.delivered(2)) and net[2].stats["sent"] >= 1


def test_the_view_carries_the_largest_ttl_a_member_asked_for_through_joins_leaves_and_a_reformation() -> None:
    net = Net(4)
    net.do(0, lambda p, now: p.create("g", now))
    for i, ttl in ((1, 4), (2, 2), (3, 1)):
        net.do(i, lambda p, now, ttl=ttl: p.join("g", now, ttl=ttl))
        net.advance(0.5)
    assert [net[i].view("g").ttl for i in range(4)] == [4, 4, 4, 4]
    net.do(1, lambda p, now: p.leave("g", now))  # the member that asked for 4 leaves: the others' largest is 2
    net.advance(10.0)
    assert [net[i].view("g").ttl for i in (0, 2, 3)] == [2, 2, 2]
    net.down.add(net.pids[2])  # it crashes: the reformation's view keeps the survivors' TTLs
    net.advance(30.0)
    survivors = [net[i].view("g") for i in (0, 3)]
    assert all(view.members == (net.pids[0], net.pids[3]) and view.ttl == 1 for view in survivors), survivors


def test_locks_are_granted_once_and_released() -> None:
    net = group_of(3)
    net.do(1, lambda p, now: p.lock("g", 0, now))
    net.advance(2.0)
    net.do(2, lambda p, now: p.lock("g", 0, now))
    net.advance(2.0)
    assert [(r.lock, r.op, r.granted) for r in net.of_type(1, LockResult)] == [(0, "lock", True)]
    assert [(r.lock, r.op, r.granted) for r in net.of_type(2, LockResult)] == [(0, "lock", False)]
    assert net[0].view("g").lock_holder(0) == net.pids[1]
    net.do(1, lambda p, now: p.unlock("g", 0, now))
    net.advance(2.0)
    net.do(2, lambda p, now: p.lock("g", 0, now))
    net.advance(2.0)
    assert [(r.lock, r.op, r.granted) for r in net.of_type(2, LockResult)] == [(0, "lock", False), (0, "lock", True)]
    assert all(net[i].view("g").lock_holder(0) == net.pids[2] for i in range(3))


def test_request_overtaken_by_a_later_one_is_asked_again() -> None:
    """A token site takes a process's requests numbered at or below the highest it served as done, so a lock
    request that is lost until a later request of the same process was served must be asked again, not skipped."""
    net = group_of(3, EngineConfig(journal=True, null_ack_prompt=1.0))  # process 1 gets the token only after 1 s
    dropping = True
    net.drop = lambda src, dst, p: dropping and isinstance(p, ListChangeRequest) and p.arg == 3
    net.do(1, lambda p, now: p.lock("g", 3, now))
    net.advance(0.05)
    net.do(1, lambda p, now: p.lock("g", 4, now))
    net.advance(1.0)
    assert [(r.lock, r.granted) for r in net.of_type(1, LockResult)] == [(4, True)]
    dropping = False
    net.advance(3.0)
    assert sorted((r.lock, r.granted) for r in net.of_type(1, LockResult)) == [(3, True), (4, True)]
    assert all(net[i].view("g").lock_holder(3) == net.pids[1] for i in range(3))
    assert all(net[i].engines["g"].stats["reformations"] == 0 for i in range(3))


def test_denied_lock_keeps_the_view_id() -> None:
    net = group_of(2)
    net.do(0, lambda p, now: p.lock("g", 7, now))
    net.advance(2.0)
    before = net[1].view("g").view_id
    net.do(1, lambda p, now: p.lock("g", 7, now))
    net.advance(2.0)
    assert net[1].view("g").view_id == before


def test_view_ids_are_unique_and_named_by_their_creator() -> None:
    net = group_of(4)
    net.do(1, lambda p, now: p.lock("g", 1, now))
    net.advance(2.0)
    ids = [e.view for e in net.events[net.pids[0]] if isinstance(e, ViewInstalled)]
    assert len(ids) == len(set(ids)) == 5
    assert all(v.creator in net.pids for v in ids)


def test_joiner_missing_its_new_list_asks_again() -> None:
    net = Net(2)
    net.do(0, lambda p, now: p.create("g", now))
    dropped = []

    def drop_first(src: str, dst: str, packet: object) -> bool:
        if isinstance(packet, NewList) and dst == net.pids[1] and len(dropped) < 2:
            dropped.append(packet)
            return True
        return False

    net.drop = drop_first
    net.do(1, lambda p, now: p.join("g", now))
    net.advance(5.0)
    assert len(dropped) == 2
    assert net.views(1) == [tuple(net.pids)]


def test_member_that_missed_a_new_list_learns_it_from_the_view_creator() -> None:
    """The New List adding a fourth member is lost at the old members; the newcomer passes the token in a view they
    do not know.  They cannot take the newcomer's word (it is not in their view) but ask the view's creator, which
    is, and nobody is suspected of failing."""
    net = Net(4)
    net.do(0, lambda p, now: p.create("g", now))
    for i in (1, 2):
        net.do(i, lambda p, now: p.join("g", now))
        net.advance(0.5)
    joiner = net.pids[3]
    net.drop = lambda src, dst, p: isinstance(p, NewList) and p.request_src == joiner and dst != joiner
    net.do(3, lambda p, now: p.join("g", now))
    net.advance(0.2)
    net.drop = lambda src, dst, p: False
    net.advance(3.0)
    assert all(len(net[i].view("g").members) == 4 for i in range(4))
    assert all(net[i].engines["g"].stats["reformations"] == 0 for i in range(4))


def test_a_group_formed_by_joins_frees_what_every_member_holds() -> None:
    """Slots ordered before a member joined are never held by it: they must be freed once the members of their
    time hold them, or a daemon's OrderingQ grows with every message (found by rmp bench's memory figure)."""
    net = group_of(3)
    for n in range(300):
        net.do(n % 3, lambda p, now, n=n: p.send("g", f"m{n}".encode(), QoS.TOTAL, now))
        net.advance(0.01)
    net.advance(3.0)
    for i in range(3):
        engine = net[i].engines["g"]
        assert len([e for e in history(net, i) if not isinstance(e, tuple)]) >= 300
        q = engine.ordering.q
        assert len(q.slots) <= 3 and len(engine.ordering.data) <= 1, (i, len(q.slots), q.base)


def test_member_that_missed_a_new_list_while_waiting_asks_at_once() -> None:
    """A member holding safe messages that are not yet stable misses the New List of a lock grant.  The ring stops
    at it: the token site passes it the token in a view it does not know, again and again.  Each such packet says
    a New List was missed, so it asks the sender promptly, rather than at its next stall round (1.5 s and more)."""
    net = group_of(3)
    lagging = net.pids[2]
    net.drop = lambda src, dst, p: isinstance(p, NewList) and dst == lagging
    for n in range(5):
        net.send(0, f"s{n}".encode(), QoS.SAFE)
    net.do(1, lambda p, now: p.lock("g", 0, now))
    net.advance(0.05, step=0.001)
    net.drop = lambda src, dst, p: False
    assert net[2].view("g") != net[0].view("g"), "the lagging member missed the New List"
    missed_at = net.now
    while net[2].view("g") != net[0].view("g") and net.now - missed_at < 5.0:
        net.advance(0.01, step=0.001)
    assert net.now - missed_at < 0.5, f"caught up only after {net.now - missed_at:.2f} s"
    assert net[2].engines["g"].stats["reformations_started"] == 0
    net.advance(2.0)
    assert net.delivered(2) == net.delivered(0)
