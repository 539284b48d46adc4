"""Groups that heal themselves: silent members of a quiet ring, views of one group that meet, restarted processes
and members left with no view (docs/protocol.md, "Healing")."""

from __future__ import annotations

import random

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import Left, UndeliveredSends
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import Data, NewList
from rmpd.protocol.process import RmpProcess
from rmpd.protocol.qos import QoS
from rmpd.protocol.reformation import MIN_PARTITION_MAJORITY

from .harness import Net, Ring


def one_view(net: Net, members: list[int]) -> bool:
    """Processes ``members`` are all in one view, which holds exactly them."""
    views = {net[i].view("g") for i in members}
    if len(views) != 1 or None in views:
        return False
    view = next(iter(views))
    assert view is not None
    return set(view.members) == {net.pids[i] for i in members}


def formed(n: int, config: EngineConfig | None = None, **join: int) -> Net:
    net = Net(n, config)
    net.do(0, lambda p, now: p.create("g", now, **join))
    for i in range(1, n):
        net.do(i, lambda p, now: p.join("g", now, **join))
        assert net.advance_until(lambda i=i: one_view(net, list(range(i + 1))), 5.0) is not None
    return net


def restart_in_place(net: Net, index: int, config: EngineConfig, seed: int) -> None:
    """Process ``index`` starts again under its process ID, as a daemon restarted on its port: a new incarnation
    with a clock and sequence numbers past the old one's (the harness's clocks: 1_700_000_000_000 + i at 0)."""
    pid = net.pids[index]
    wall_ms = 1_700_000_000_000 + int(net.now * 1000) + index
    restart = RmpProcess(pid=pid, config=config, rng=random.Random(seed), now=net.now, wall_ms=wall_ms,
                         seq_base=wall_ms * 1000)
    net.nodes[pid] = restart
    net.procs[pid] = restart
    net.down.discard(pid)


def test_a_quiet_ring_drops_a_dead_member_within_fail_after_and_a_second() -> None:
    net = formed(3)
    net.advance(3.0)  # nothing sent: the ring is idle
    net.down.add(net.pids[2])
    killed = net.now
    dropped = net.advance_until(lambda: one_view(net, [0, 1]), 10.0, step=0.01)
    assert dropped is not None, "the survivors never noticed"
    assert dropped - killed <= net[0].config.fail_after + 1.0, dropped - killed
    assert net[0].counters()["suspected_silent"] + net[1].counters()["suspected_silent"] >= 1


def test_an_idle_member_costs_about_one_alive_per_second() -> None:
    net = formed(3)
    before = {i: net[i].counters()["sent"] for i in range(3)}
    net.advance(20.0)
    for i in range(3):
        assert net[i].counters()["sent"] - before[i] <= 21, "an idle member sends one Alive a second, nothing else"


def test_two_views_of_one_group_merge_when_they_can_hear_each_other() -> None:
    net = Net(5)
    left, right = {net.pids[0], net.pids[1]}, {net.pids[2], net.pids[3], net.pids[4]}
    net.drop = lambda src, dst, p: (src in left) != (dst in left)  # a partition from the start
    net.do(0, lambda p, now: p.create("g", now))
    net.do(2, lambda p, now: p.create("g", now))
    for i in (1, 3, 4):
        net.do(i, lambda p, now: p.join("g", now))
        net.advance(2.0)
    assert one_view(net, [0, 1]) and one_view(net, [2, 3, 4])
    for i in range(5):
        net.send(i, b"before %d" % i)
    net.advance(2.0)
    net.drop = lambda src, dst, p: False
    healed = net.now
    merged = net.advance_until(lambda: one_view(net, list(range(5))), 15.0, step=0.01)
    assert merged is not None, [net[i].view("g") for i in range(5)]
    assert merged - healed < 5.0
    survivor = net[2].view("g")
    assert survivor is not None and survivor.members[0] in right, "the larger view survived"
    for i in (0, 1):  # the smaller view's members delivered their view's messages, then came over as new members
        assert {b"before 0", b"before 1"} <= set(net.delivered(i))
        assert any(isinstance(e, Left) and e.rejoining for e in net.events[net.pids[i]])
    net.send(0, b"after")
    net.advance(2.0)
    assert all(net.delivered(i)[-1] == b"after" for i in range(5))


def test_simultaneous_founders_end_in_one_view() -> None:
    net = Net(3)
    for i in range(3):
        net.do(i, lambda p, now: p.join("g", now))
    together = net.advance_until(lambda: one_view(net, [0, 1, 2]), 30.0, step=0.01)
    assert together is not None, [net[i].view("g") for i in range(3)]


def test_a_restarted_process_is_admitted_again_without_waiting_for_failure_detection() -> None:
    net = formed(3)
    pid = net.pids[2]
    net.down.add(pid)
    net.advance(0.5)
    restart_in_place(net, 2, net[2].config, 9)
    started = net.now
    net.do(2, lambda p, now: p.join("g", now, existing_only=True))
    back = net.advance_until(lambda: one_view(net, [0, 1, 2]), 10.0, step=0.01)
    assert back is not None
    assert back - started < net[0].config.fail_after, "the new incarnation did not wait for the old one's removal"
    assert sum(net[i].counters()["incarnations_replaced"] + net[i].counters()["suspected_restarted"]
               for i in (0, 1)) >= 1
    net.send(2, b"from the new incarnation")
    net.advance(1.0)
    assert net.delivered(0)[-1] == b"from the new incarnation"


def test_the_new_list_removing_an_old_incarnation_passes_the_token_to_a_member_of_its_view() -> None:
    """A restarted process's join reaches the token site while the old incarnation is still in the view and the
    token was last passed elsewhere (no ``suspected_restarted``): the New List that removes the old incarnation
    must pass the token within the view it makes.  Passed to the removed process ID, nobody took it: the new
    incarnation, not yet admitted, ignores it, so the view waited for a token loss to be detected while the joiner
    founded a view of its own."""
    daemon_like = EngineConfig(request_interval=0.1, join_retries=3, fail_after=1.5)
    net = formed(3, daemon_like)
    pid = net.pids[2]
    net.send(1, b"ordered where the token rests, at the last joiner")
    net.advance(0.001)
    net.send(0, b"ordered at the next site, where the token comes to rest")
    net.advance(1.0)
    net.down.add(pid)  # killed and restarted at once: nothing was passed to it meanwhile
    restart_in_place(net, 2, daemon_like, 5)
    started = net.now
    net.do(2, lambda p, now: p.join("g", now, existing_only=True))
    lone = []
    back = net.advance_until(lambda: lone.append(net[2].view("g")) or one_view(net, [0, 1, 2]), 20.0, step=0.01)
    assert back is not None
    assert sum(net[i].counters()["incarnations_replaced"] for i in (0, 1)) >= 1, "the case this test is about"
    assert all(view is None or view.size > 1 for view in lone), "the restarted process founded a view of its own"
    assert back - started < daemon_like.fail_after, "the old incarnation's removal waited for a lost token"


def test_a_process_restarted_while_its_group_reforms_joins_it_instead_of_founding_a_view_alone() -> None:
    """A daemon killed and restarted on its port joins as its group reforms without the old incarnation; the
    reformation sends no Alives, so the join once found no answer for ``join_retries`` and founded a view of one
    beside the group, which had to merge back later (seconds more)."""
    daemon_like = EngineConfig(request_interval=0.2, join_retries=4)
    net = formed(4, daemon_like)
    pid = net.pids[3]
    net.down.add(pid)
    reforming = net.advance_until(lambda: net[0].status("g").reforming, 10.0, step=0.01)
    assert reforming is not None
    # The reformation is slow (its New Lists are lost for a while), as under loss on a loaded host; the restarted
    # process hears its other packets all along.
    slow_until = net.now + 5.0
    net.drop = lambda src, dst, packet: (pid not in (src, dst) and type(packet) is NewList
                                         and net.now < slow_until)
    restart_in_place(net, 3, daemon_like, 7)
    net.do(3, lambda p, now: p.join("g", now))
    lone = []
    back = net.advance_until(lambda: lone.append(net[3].view("g")) or one_view(net, [0, 1, 2, 3]), 30.0, step=0.01)
    assert back is not None
    assert all(view is None or view.size > 1 for view in lone), "the restarted process founded a view of its own"
    assert net[3].counters()["reformation_heard_while_joining"] >= 1


def test_a_member_cut_off_stops_reports_its_unordered_messages_and_rejoins_after_the_heal() -> None:
    net = formed(3, min_partition=MIN_PARTITION_MAJORITY)
    cut = net.pids[2]
    net.drop = lambda src, dst, p: cut in (src, dst)
    net.send(2, b"ordered here, if the token was here")
    net.advance(0.1)  # a token held here is passed on (and the pass lost): what follows waits for an ACK
    net.send(2, b"lost in the cut")
    stopped = net.advance_until(lambda: any(isinstance(e, Left) for e in net.events[cut]), 40.0, step=0.01)
    assert stopped is not None
    left = next(e for e in net.events[cut] if isinstance(e, Left))
    assert left.rejoining and "minimum" in left.reason
    reported = [e for e in net.events[cut] if isinstance(e, UndeliveredSends)]
    assert reported and reported[0].seqs, "the message the cut left unordered was reported"
    assert one_view(net, [0, 1])
    net.drop = lambda src, dst, p: False
    back = net.advance_until(lambda: one_view(net, [0, 1, 2]), 15.0, step=0.01)
    assert back is not None


def test_a_group_with_no_view_left_is_founded_again_by_a_majority_of_its_last_view() -> None:
    net = formed(3, min_partition=MIN_PARTITION_MAJORITY)
    everyone = set(net.pids)
    net.drop = lambda src, dst, p: src in everyone and dst in everyone  # every member cut from every other
    gone = net.advance_until(lambda: all(net[i].status("g") is None for i in range(3)), 60.0, step=0.01)
    assert gone is not None, "each member alone is below the majority: all stop"
    net.advance(5.0)
    assert all(net[i].view("g") is None for i in range(3)), "a minority never founds the group alone"
    net.drop = lambda src, dst, p: False
    again = net.advance_until(lambda: one_view(net, [0, 1, 2]), 120.0, step=0.01)
    assert again is not None


def test_during_a_reformation_only_data_its_sync_point_names_is_taken_from_a_view_not_known() -> None:
    """A member reforming takes a packet of a view it does not know only when the shared sync point names it:
    some member holds it, so every member must.  A packet of a view that went on beside ours (the other side of a
    split, a view it merges into later) was once taken too, because its source had been in our order, and this
    member's view then ordered it again, at another place than the other view did: two orders of one message."""
    ring = Ring(3)
    a, b, c = ring.pids
    for i in range(3):
        ring.send(i, b"before")
    ring.advance(1.0)
    engine = ring.engines[c]
    ring.down.add(a)  # a goes silent: c ends up reforming
    assert ring.advance_until(lambda: engine.frozen, 30.0, step=0.01) is not None
    elsewhere = ViewId(b, 99_999)  # a view made by a member of ours that this member does not know
    taken_before = engine.stats["data_of_earlier_view"]
    next_of_a = engine.ordering.ordered_upto.get(a, 0) + 1
    ring.do(2, lambda e, now: e.receive_packet(Data(elsewhere, a, next_of_a + 5, QoS.TOTAL, None, b"beside"), now))
    assert engine.stats["data_of_earlier_view"] == taken_before, "data of a view beside ours was taken"
    assert (a, next_of_a + 5) not in engine.ordering.data


def test_a_view_never_orders_unordered_data_of_a_source_it_left_out() -> None:
    """A member cut off by a partition orders its own unordered messages again on its side.  The other side had
    taken the same packets (its resends, in the view both shared) while reforming; had its new view, which lacks
    the source, ordered them too, one message would have had two places, and a member that saw both orders (a
    process restarted into the other side) would have delivered it twice."""
    ring = Ring(3)
    a, b, c = ring.pids
    for i in range(3):
        ring.send(i, b"before")
    ring.advance(1.0)
    shared = ring.view.view_id
    ring.drop = lambda src, dst, packet: (src == c) != (dst == c)  # c cut off from a and b
    seqs = [ring.send(2, b"cut-%d" % k) for k in range(3)]  # sent in the shared view, never ordered in it
    assert ring.advance_until(lambda: ring.engines[a].frozen, 30.0, step=0.01) is not None
    for i in (0, 1):  # c's resends reach a and b while they reform
        for seq in seqs:
            ring.do(i, lambda e, now, seq=seq: e.receive_packet(Data(shared, c, seq, QoS.TOTAL, None, b"cut"), now))
    ring.advance(30.0, step=0.01)
    assert c not in ring.engines[a].views.current and c not in ring.engines[b].views.current
    assert sorted(d.payload for d in ring.deliveries(2) if d.payload.startswith(b"cut")) == [b"cut-0", b"cut-1",
                                                                                            b"cut-2"]
    for i in (0, 1):
        assert not [d for d in ring.deliveries(i) if d.payload.startswith(b"cut")], "ordered on both sides"



def test_a_member_that_missed_every_packet_of_a_reformed_view_asks_and_commits_it() -> None:
    """A member that acknowledged a reformation's New List learns of the commit from a packet of the new view.
    When the new view lasted only until a change already waiting made the next one, and every packet of it was
    lost to this member, all it hears is a view it cannot know yet: it asks that packet's sender what follows, as
    outside a reformation, instead of waiting until it gives the reformation up and starts one of its own in a
    view the others have left."""
    ring = Ring(4)
    a, b, c, d = ring.pids
    engine = ring.engines[b]  # c, before the failed d in the ring, initiates; b takes part
    for i in range(4):
        ring.send(i, b"before")
    ring.advance(1.0)
    reformed: list[ViewId] = []
    lost = [True]

    def the_new_view_lost_to_b(src: str, dst: str, packet: object) -> bool:
        if isinstance(packet, NewList) and packet.request_src is None and not reformed:
            reformed.append(packet.new_view)
        return lost[0] and dst == b and bool(reformed) and getattr(packet, "view", None) == reformed[0]

    ring.drop = the_new_view_lost_to_b
    ring.down.add(d)
    assert ring.advance_until(lambda: engine.reformation.awaiting_commit, 30.0, step=0.01) is not None
    assert ring.advance_until(lambda: ring.engines[a].views.current.view_id == reformed[0], 1.0) is not None
    asked = engine.stats["hint_nacks_sent"]
    later = ViewId(c, 99_999)  # the view after the reformed one, which b cannot know yet
    ring.do(1, lambda e, now: e.receive_packet(Data(later, c, 10**9, QoS.TOTAL, None, b"later"), now))
    assert ring.advance_until(lambda: engine.stats["hint_nacks_sent"] > asked, engine.config.nack_delay + 0.05)
    lost[0] = False
    committed = ring.advance_until(lambda: engine.views.current.view_id == reformed[0], 1.0)
    assert committed is not None, engine.status()
    assert engine.stats["reformations_started"] == 0, "b gave the reformation up and started its own"


def test_a_member_that_joined_after_a_reformation_is_not_refused_for_the_versions_before_it() -> None:
    """Reformations of one view are ordered by (version, initiator), and a member refuses a Recovery Start below
    the highest it has seen.  A member admitted after a reformation counts from zero; had the others kept their
    counts from the view before, its first reformation would have been refused, and each retry, one version
    higher after a backoff, until it passed theirs."""
    net = formed(4)
    a = net.pids[0]
    net.down.add(a)  # d, before a in the ring, reforms without it: everyone left has seen (1, d)
    assert net.advance_until(lambda: one_view(net, [1, 2, 3]), 30.0, step=0.01) is not None
    restart_in_place(net, 0, net[1].config, 11)
    net.do(0, lambda p, now: p.join("g", now))
    assert net.advance_until(lambda: one_view(net, [0, 1, 2, 3]), 30.0, step=0.01) is not None
    view = net[0].view("g")
    assert view is not None
    after_a = view.next_after(a)  # silent next: a is the one to notice and reform
    net.down.add(after_a)
    rest = [i for i in range(4) if net.pids[i] != after_a]
    assert net.advance_until(lambda: one_view(net, rest), 30.0, step=0.01) is not None
    assert net[0].counters()["reformations_started"] >= 1, "a, before the silent member in the ring, reformed"
    assert net[0].counters()["reformations_aborted"] == 0, "a's reformation was refused"
