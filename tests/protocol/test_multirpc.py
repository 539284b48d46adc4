"""Multi-RPC from a non-member, decided by SCMP at delivery (RMP 4.5 with the SCMP filter)."""

from __future__ import annotations

from rmpd.protocol.calls import NO_HANDLER_GRACE
from rmpd.protocol.events import CallAnswered, CallToAnswer, messages_of
from rmpd.protocol.packets import CallStatus, NonMemberAck, NonMemberData, encode
from rmpd.protocol.qos import QoS

from .harness import Net

CALLER = 3


def group_with_server(dup: int = 1) -> Net:
    """Members 0-2 in group "g", member 1 holding handler lock 0; process 3 is outside.  Non Member Data is
    delivered ``dup`` times to each member.  The clock is moved past the joiner floor (start_upper)."""
    net = Net(4)
    net.do(0, lambda p, now: p.create("g", now))
    for i in (1, 2):
        net.do(i, lambda p, now: p.join("g", now))
        net.advance(0.5)
    net.do(1, lambda p, now: p.lock("g", 0, now))
    net.advance(3.0)
    net.copies = lambda src, dst, p: dup if isinstance(p, NonMemberData) else 1
    return net


def serve(net: Net, i: int) -> list[CallToAnswer]:
    """Answer every call request member ``i`` got with its payload upper-cased."""
    requests = net.of_type(i, CallToAnswer)
    for r in requests:
        net.do(i, lambda p, now, r=r: p.reply("g", r.caller, r.conn, r.stamp, r.payload.upper(), now))
    return requests


def test_call_duplicated_five_times_runs_once_and_gets_one_reply() -> None:
    net = group_with_server(dup=5)
    call_id = net.do(CALLER, lambda p, now: p.call("g", b"hello", now, handler=0))
    net.advance(0.2)
    requests = serve(net, 1)
    net.advance(1.0)
    assert [r.payload for r in requests] == [b"hello"]
    assert all(not net.of_type(i, CallToAnswer) for i in (0, 2)), "only the handler's holder runs calls"
    answers = net.of_type(CALLER, CallAnswered)
    assert [(a.call_id, a.reply, a.error) for a in answers] == [(call_id, b"HELLO", None)]
    # Every member's filter saw every relayed copy in the same order and decided alike.
    counts = [net[i].engines["g"].relay.calls.filter.counts for i in range(3)]
    assert counts[0] == counts[1] == counts[2]


def first_call(sent: list[NonMemberData]) -> NonMemberData:
    """The first copy of a call among the packets seen (a caller new to the group probes first)."""
    return next(p for p in sent if not p.flags & NonMemberData.FLAG_PROBE)


def replay(net: Net, packet: NonMemberData) -> None:
    """Hand every member a copy of ``packet``, as a network that held it back would."""
    for pid in net.pids[:3]:
        net.procs[pid].receive_datagram(encode(packet), net.pids[CALLER], net.now)
        net.collect(pid)


def test_copies_after_the_reply_get_the_stored_reply_not_a_second_run() -> None:
    net = group_with_server()
    sent: list[NonMemberData] = []
    lost_reply_acks = []

    def watch(src: str, dst: str, p: object) -> bool:
        if isinstance(p, NonMemberData):
            sent.append(p)
        if isinstance(p, NonMemberAck) and p.status is CallStatus.REPLY_ACK:
            lost_reply_acks.append(p)
            return True
        return False

    net.drop = watch
    net.do(CALLER, lambda p, now: p.call("g", b"x", now, handler=0))
    net.advance(0.2)
    serve(net, 1)
    net.advance(0.5)
    assert lost_reply_acks, "the caller acknowledged the reply"
    replay(net, first_call(sent))
    net.advance(0.5)
    assert len(net.of_type(1, CallToAnswer)) == 1
    assert net[1].engines["g"].stats["call_answer_reply"] == 2, "the stored reply went out again"


def test_copies_after_the_reply_ack_are_refused_as_unknown() -> None:
    net = group_with_server()
    sent: list[NonMemberData] = []
    net.drop = lambda src, dst, p: isinstance(p, NonMemberData) and bool(sent.append(p))
    net.do(CALLER, lambda p, now: p.call("g", b"x", now, handler=0))
    net.advance(0.2)
    serve(net, 1)
    net.advance(0.5)
    replay(net, first_call(sent))
    net.advance(0.5)
    assert len(net.of_type(1, CallToAnswer)) == 1
    assert net[1].engines["g"].stats["call_answer_unknown"] == 1


def test_call_without_handler_is_delivered_to_every_member_once() -> None:
    net = group_with_server(dup=3)
    net.do(CALLER, lambda p, now: p.call("g", b"note", now, handler=None))
    net.advance(1.0)
    for i in range(3):
        got = [e for e in messages_of(net.events[net.pids[i]]) if e.src == net.pids[CALLER]]
        assert [e.payload for e in got] == [b"note"]
    assert [(a.reply, a.error) for a in net.of_type(CALLER, CallAnswered)] == [(None, None)]


def test_call_to_an_unheld_handler_fails_fast() -> None:
    """A caller new to the group gives the server a moment to take the lock; one that knows the group does not."""
    net = group_with_server()
    net.do(CALLER, lambda p, now: p.call("g", b"x", now, handler=3))
    net.advance(NO_HANDLER_GRACE - 0.5)
    assert net.of_type(CALLER, CallAnswered) == []
    net.advance(1.0)
    assert [a.error for a in net.of_type(CALLER, CallAnswered)] == ["no-handler"]
    net.do(CALLER, lambda p, now: p.call("g", b"x", now, handler=3))
    net.advance(0.2)
    assert [a.error for a in net.of_type(CALLER, CallAnswered)] == ["no-handler"] * 2


def test_call_to_a_group_nobody_serves_times_out() -> None:
    net = group_with_server()
    net.do(CALLER, lambda p, now: p.call("nobody", b"x", now, handler=0, timeout=2.0))
    net.advance(3.0)
    assert [a.error for a in net.of_type(CALLER, CallAnswered)] == ["timeout"]


def test_a_fresh_member_refuses_calls_stamped_before_it_started() -> None:
    """The joiner floor: a call stamped before the group could vouch for it is refused as 'unknown', never run."""
    net = Net(4)
    net.do(0, lambda p, now: p.create("g", now))
    net.do(0, lambda p, now: p.lock("g", 0, now))
    net.advance(0.3)
    early = NonMemberData("g", None, net.pids[CALLER], 0, 1_700_000_000_000 + 100, QoS.TOTAL,
                          NonMemberData.FLAG_ACK, 0, b"early")  # a copy of a call made before the group formed
    answers: list[NonMemberAck] = []
    net.drop = lambda src, dst, p: isinstance(p, NonMemberAck) and bool(answers.append(p))
    replay(net, early)
    net.advance(0.5)
    assert not net.of_type(0, CallToAnswer)
    assert [a.status for a in answers] == [CallStatus.UNKNOWN]


def test_a_caller_new_to_a_fresh_group_probes_then_stamps_its_call_above_the_floor() -> None:
    """The call is made before the group forms: its first packets are probes nobody may run, and once the group
    answers with its floor the call goes stamped afresh above it, and runs once, within its timeout."""
    net = Net(4)
    call_id = net.do(CALLER, lambda p, now: p.call("g", b"early", now, handler=0, timeout=5.0))
    net.advance(0.5)
    net.do(0, lambda p, now: p.create("g", now))
    net.do(0, lambda p, now: p.lock("g", 0, now))
    floor = net[0].engines["g"].relay.calls.floor()
    assert floor > 1_700_000_000_000 + 1500, "the fresh group refuses what was stamped before it formed"
    net.advance_until(lambda: bool(net.of_type(0, CallToAnswer)), 4.0)
    [request] = net.of_type(0, CallToAnswer)
    assert request.payload == b"early" and request.stamp > floor
    serve(net, 0)
    net.advance(0.3)
    assert [(a.call_id, a.reply, a.error) for a in net.of_type(CALLER, CallAnswered)] == [(call_id, b"EARLY", None)]


def test_a_call_stamped_just_after_a_newcomer_joined_is_delivered_at_every_member() -> None:
    """Uniform verdicts: the newcomer's own filter starts at its floor (above the stamp) and the older members'
    below it; all follow the relay's verdict carried in the order, so the call reaches every member or none."""
    net = Net(4)
    net.do(0, lambda p, now: p.create("g", now))
    net.do(1, lambda p, now: p.join("g", now))
    net.advance(3.0)
    net.do(2, lambda p, now: p.join("g", now))
    assert net.advance_until(lambda: all(len(net[i].view("g").members) == 3 for i in range(3)), 5.0) is not None
    newcomer = net[2].engines["g"].relay.calls.floor()
    stamp = 1_700_000_000_000 + int(net.now * 1000) + 500  # after the older members' floors, before the newcomer's
    assert net[0].engines["g"].relay.calls.floor() < stamp < newcomer
    note = NonMemberData("g", None, net.pids[CALLER], 0, stamp, QoS.TOTAL, NonMemberData.FLAG_ACK, None, b"note")
    replay(net, note)
    net.advance(1.0)
    got = [[e.payload for e in messages_of(net.events[net.pids[i]]) if e.src == net.pids[CALLER]] for i in range(3)]
    assert got == [[b"note"]] * 3, got


def test_persisted_latest_covers_a_member_whose_clock_went_back() -> None:
    """The floor alone (own clock + ahead + skew) would let a replayed call through after the clock was set back
    across a restart; the persisted latest still refuses it."""
    from rmpd.protocol.fieldkinds import RELAYED_TAG, Relayed
    from rmpd.protocol.multirpc import GroupCalls, ScmpSettings, start_upper
    from rmpd.scmp.filter import Verdict

    before_crash_stamp = 1_000_000
    persisted = before_crash_stamp + 3000
    clock_after_restart = before_crash_stamp - 60_000  # set back a minute
    settings = ScmpSettings(upper=persisted, latest=persisted)
    calls = GroupCalls(ScmpSettings(upper=start_upper(settings, clock_after_restart), latest=persisted))
    relay_clock = before_crash_stamp + 100  # another member relays it as new, its clock right; the holder checks
    replay = Relayed(RELAYED_TAG, "10.0.0.9:1", 0, before_crash_stamp, 0, relay_clock, b"x")
    assert calls.decide(replay, relayed_here=False, responder=True, has_handler=True)[0] is Verdict.SUMMARY
    without = GroupCalls(ScmpSettings(upper=start_upper(ScmpSettings(), clock_after_restart)))
    assert without.decide(replay, relayed_here=False, responder=True, has_handler=True)[0] is Verdict.NEW


def test_a_call_two_relays_carried_as_new_is_delivered_once() -> None:
    """The relay changed while a call was on its way (the handler's lock moved, the first member left): the old and
    the new relay each judged it new before either packet was delivered.  The second delivery is a duplicate, at
    every member alike (each follows the same order), and the responder does not run it again."""
    from rmpd.protocol.fieldkinds import RELAYED_TAG, Relayed
    from rmpd.protocol.multirpc import GroupCalls, ScmpSettings
    from rmpd.scmp.filter import Verdict
    from rmpd.scmp.rpc import Action

    first = Relayed(RELAYED_TAG, "10.0.0.9:1", 0, 5000, 0, 5100, b"x", "new")
    second = first._replace(clock=5200)
    for responder in (False, True):
        calls = GroupCalls(ScmpSettings())
        verdict, action, _ = calls.decide(first, relayed_here=False, responder=responder, has_handler=False)
        assert (verdict, action) == (Verdict.NEW, Action.START)
        verdict, action, _ = calls.decide(second, relayed_here=False, responder=responder, has_handler=False)
        assert verdict is Verdict.DUPLICATE and action is not Action.START


def test_a_call_sent_once_its_handler_is_held_asks_for_no_timer_already_past() -> None:
    """A probe answered no-handler, then ready: the call goes out, and once the no-handler grace would have ended
    the caller's next timer is still ahead of the clock (a deadline already past would be fired for ever)."""
    net = group_with_server()
    net.do(CALLER, lambda p, now: p.call("g", b"x", now, handler=3, timeout=10.0))
    net.advance(0.5)
    net.do(1, lambda p, now: p.lock("g", 3, now))
    net.advance(NO_HANDLER_GRACE + 0.5)
    assert net.of_type(CALLER, CallAnswered) == []
    assert any(isinstance(r, CallToAnswer) for r in net.of_type(1, CallToAnswer))
    deadline = net.nodes[net.pids[CALLER]].get_timer()
    assert deadline is not None and deadline > net.now
