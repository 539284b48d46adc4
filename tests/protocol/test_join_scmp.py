"""Join requests are first-contact packets filtered by SCMP at the token site (docs/protocol.md, "Join requests
and SCMP"): a join request captured before every member crashed is refused after they restart, a fresh joiner
refused meanwhile asks again under a new ID instead of forming a group of its own, and the floor travels in New
Lists to members that join later."""

from __future__ import annotations

import random

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import JoinFailed
from rmpd.protocol.multirpc import ScmpSettings
from rmpd.protocol.packets import CallStatus, ListChangeRequest, NonMemberAck, Packet, encode
from rmpd.protocol.process import RmpProcess

from .harness import Net

WALL0 = 1_700_000_000_000
"""Net's processes start with this wall clock (ms) at ``now == 0``."""

CONFIG = EngineConfig(journal=True, request_interval=0.1, join_retries=3)
"""Joins give up after 0.7 s: well within the 2 s a restarted founder's floor refuses fresh joins for."""


def advance(net: Net, seconds: float) -> None:
    """Advance the network, writing ``latest`` to 'stable storage' whenever a process asks (what the runtime does)."""
    end = net.now + seconds
    while net.now < end - 1e-9:
        net.advance(min(0.05, end - net.now))
        for pid, value in list(net.persist_wanted.items()):
            del net.persist_wanted[pid]
            net.procs[pid].persisted(value, net.now)


def restart_all(net: Net, persisted: int) -> None:
    """kill -9 every process and start it again under the same ID, finding ``persisted`` as its ``latest``."""
    for i, pid in enumerate(net.pids):
        wall_ms = WALL0 + int(net.now * 1000)
        net.procs[pid] = RmpProcess(pid=pid, config=CONFIG, rng=random.Random(100 + i), now=net.now,
                                    wall_ms=wall_ms, scmp=ScmpSettings(upper=persisted, latest=persisted))
        net.events[pid] = []
    net.wire.clear()


def joins_of(net: Net) -> list[ListChangeRequest]:
    """Record every join request that goes on the wire (as a wire capture would)."""
    captured: list[ListChangeRequest] = []

    def tap(src: str, dst: str, packet: Packet) -> bool:
        if isinstance(packet, ListChangeRequest) and packet.op == "join":
            captured.append(packet)
        return False

    net.drop = tap
    return captured


def refusals_to(net: Net, pid: str) -> list[NonMemberAck]:
    """Record the JOIN_REFUSED answers sent to ``pid``."""
    seen: list[NonMemberAck] = []

    def tap(src: str, dst: str, packet: Packet) -> bool:
        if dst == pid and isinstance(packet, NonMemberAck) and packet.status is CallStatus.JOIN_REFUSED:
            seen.append(packet)
        return False

    net.drop = tap
    return seen


def inject(net: Net, src: str, packet: Packet) -> None:
    """Put a datagram on the wire from ``src`` to every other process (a replay by whoever captured it)."""
    net.wire.extend((src, dst, encode(packet)) for dst in net.pids if dst != src)
    net.flush()


def group_formed() -> tuple[Net, ListChangeRequest]:
    """Three processes form g (1 and 2 join); the join request of 2 as a wire capture saw it."""
    net = Net(3, CONFIG)
    captured = joins_of(net)
    net.do(0, lambda p, now: p.create("g", now))
    net.do(1, lambda p, now: p.join("g", now))
    advance(net, 0.5)
    net.do(2, lambda p, now: p.join("g", now))
    advance(net, 0.5)
    assert net.views(2)[-1] == tuple(net.pids)
    return net, next(r for r in captured if r.src == net.pids[2])


def group_formed_then_restarted() -> tuple[Net, ListChangeRequest]:
    """The group formed, then every process restarts; 0 founds g again."""
    net, old_join = group_formed()
    advance(net, 1.0)
    crash_ms = WALL0 + int(net.now * 1000)
    restart_all(net, persisted=crash_ms + 3000)
    net.drop = lambda src, dst, p: False
    net.do(0, lambda p, now: p.create("g", now))
    return net, old_join


def test_a_join_captured_before_every_member_restarted_is_refused() -> None:
    net, old_join = group_formed_then_restarted()
    founder = net[0].engines["g"]
    assert founder.changes.join_floor >= old_join.request_id // 1000

    inject(net, net.pids[2], old_join)
    advance(net, 0.5)
    assert founder.stats["joins_refused_summary"] >= 1
    assert net.views(0) == [(net.pids[0],)], "the replayed join added nobody"


def test_a_refused_fresh_joiner_asks_again_and_is_admitted_without_forming_its_own_group() -> None:
    net, _ = group_formed_then_restarted()
    refused = refusals_to(net, net.pids[1])
    net.do(1, lambda p, now: p.join("g", now))
    advance(net, 5.0)
    assert refused, "the join stamped below the restarted founder's floor was refused, and told so"
    assert net[1].stats["joins_refused"] >= 1
    assert not net.of_type(1, JoinFailed)
    assert net.views(1) == [(net.pids[0], net.pids[1])], "admitted to the founder's group, no group of its own"
    assert net[1].stats["join_requests"] > CONFIG.join_retries, "it kept asking past join_retries while refused"


def test_the_floor_travels_to_joiners_and_every_token_site_refuses_the_replay() -> None:
    net, old_join = group_formed_then_restarted()
    net.do(1, lambda p, now: p.join("g", now))
    advance(net, 5.0)
    net.do(2, lambda p, now: p.join("g", now))
    advance(net, 3.0)
    assert set(net.views(0)[-1]) == set(net.pids)
    floor = net[0].engines["g"].changes.join_floor
    assert [net[i].engines["g"].changes.join_floor for i in (1, 2)] == [floor, floor]

    # A process the group's table does not know replays a join captured before the crash, many times over, while
    # the token goes round: whichever member holds it refuses.
    stranger = "10.0.1.9:7000"
    replay = ListChangeRequest("g", None, stranger, old_join.request_id, "join", 0, True, 1, 1)
    net.drop = lambda src, dst, p: dst == stranger  # nobody listens there
    for _ in range(10):
        net.wire.extend((stranger, dst, encode(replay)) for dst in net.pids)
        advance(net, 0.3)
    assert all(stranger not in net.views(i)[-1] for i in range(3))
    assert sum(net[i].engines["g"].stats["joins_refused_summary"] for i in range(3)) >= 1


def test_a_join_stamped_far_ahead_of_the_token_site_is_refused_as_too_early() -> None:
    net = Net(2, CONFIG)
    net.do(0, lambda p, now: p.create("g", now))
    advance(net, 0.2)
    ahead_ms = WALL0 + int(net.now * 1000) + 60_000
    inject(net, net.pids[1], ListChangeRequest("g", None, net.pids[1], ahead_ms * 1000, "join", 0, True, 1, 1))
    advance(net, 0.5)
    assert net[0].engines["g"].stats["joins_refused_too_early"] >= 1
    assert net.views(0) == [(net.pids[0],)]


def test_a_founder_without_stable_storage_admits_joins_at_once() -> None:
    """No ``latest`` recovered: nothing to bound (SCMP figure 2-1), and a join right after the group forms is not
    delayed."""
    net = Net(2, CONFIG)
    net.do(0, lambda p, now: p.create("g", now))
    net.do(1, lambda p, now: p.join("g", now))
    advance(net, 0.3)
    assert net[0].engines["g"].changes.join_floor == 0
    assert net.views(1) == [tuple(net.pids)]


def test_the_join_table_forgets_departed_processes_and_the_floor_keeps_their_old_requests_out() -> None:
    """Garbage collection (SCMP figure 2-1): a process that left is dropped from ``requests_done`` once its last
    request is older than the lifetime estimate; the floor rises to that request's stamp, so a replay of its old
    join is still refused, and a fresh join of it is admitted."""
    net, old_join = group_formed()
    net.do(2, lambda p, now: p.leave("g", now))
    advance(net, 2.0)
    assert net.pids[2] not in net.views(0)[-1]
    net.drop = lambda src, dst, p: False
    lifetime_ms = net[0].engines["g"].relay.calls.filter.estimator.estimate
    advance(net, lifetime_ms / 1000 + 1.0)

    # A request from a member makes the token site collect the table.
    net.do(1, lambda p, now: p.lock("g", 7, now))
    advance(net, 1.0)
    tables = [net[i].engines["g"] for i in (0, 1)]
    collected = [e for e in tables if net.pids[2] not in e.changes.requests_done]
    assert collected and all(e.changes.join_floor >= old_join.request_id // 1000 for e in collected)

    inject(net, net.pids[2], old_join)
    advance(net, 1.0)
    assert all(net.pids[2] not in net.views(i)[-1] for i in (0, 1)), "the old join stays refused"
    net.do(2, lambda p, now: p.join("g", now))
    advance(net, 2.0)
    assert set(net.views(0)[-1]) == set(net.pids), "a fresh join of the same process is admitted"
