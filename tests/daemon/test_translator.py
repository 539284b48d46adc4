"""The daemon's translator, driven without sockets, processes or trio: client frames and engine events in; the
frames each client was pushed and the requests the process was asked out.

``Process`` stands in for the process loop (it records each request and answers from the views a test installs)
and ``Client`` for a connection (it keeps the frames pushed to it, decoded, and drains only when told)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmpd import localapi
from rmpd.daemon.backpressure import OVERRUN_BYTES
from rmpd.daemon.memberships import Membership, MembershipFile
from rmpd.daemon.translator import Translator
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import (
    CallAnswered,
    CallToAnswer,
    Delivered,
    JoinFailed,
    Left,
    LockResult,
    UndeliveredSends,
    ViewInstalled,
)
from rmpd.protocol.ids import ViewId
from rmpd.protocol.limits import check_keys
from rmpd.protocol.process import NotMember
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import View
from rmpd.runtime.adapter import OVERRUN_GRACE

ME = "10.0.0.1:7000"
PEER = "10.0.0.2:7000"


class Limits:
    config = EngineConfig()


class Guard:
    encrypt = False


class Process:
    """The process loop as the translator uses it, in memory: requests are recorded in ``asked``; a group is a
    member's once the test installs a view (:meth:`install`)."""

    pid = ME
    process = Limits()
    guard = Guard()

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []
        self.views: dict[str, View] = {}
        self.listed: set[str] = set()
        self.full: set[str] = set()
        """Groups whose send backlog is full."""
        self.seqs = itertools.count(1)
        self.call_ids = itertools.count(1)
        self.refusal_watch: object = None

    @contextlib.contextmanager
    def one_step(self) -> Iterator[None]:
        yield

    def install(self, group: str, members: tuple[str, ...] = (ME,), counter: int = 1) -> ViewInstalled:
        view = View(ViewId(members[0], counter), members)
        self.views[group] = view
        self.listed.add(group)
        return ViewInstalled(group, view.view_id, members, 0)

    def join(self, group: str, **options: Any) -> None:
        self.asked.append(("join", group))
        self.listed.add(group)

    def leave(self, group: str) -> None:
        self.asked.append(("leave", group))

    def send_many(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None = None,
                  keys: list[bytes] | None = None) -> list[int]:
        check_keys(payloads, qos, keys)  # as the engine does, before it accepts anything
        self.asked.append(("send", group, tuple(payloads)) if keys is None else
                          ("send", group, tuple(payloads), tuple(keys)))
        return [next(self.seqs) for _ in payloads]

    def has_room(self, group: str) -> bool:
        return group not in self.full

    def set_overrun(self, group: str, overrun: bool) -> None:
        self.asked.append(("overrun", group, overrun))

    def call(self, group: str, payload: bytes, *, handler: int | None, timeout: float, qos: QoS | None = None) -> int:
        call_id = next(self.call_ids)
        self.asked.append(("call", group, payload, call_id))
        return call_id

    def cancel_call(self, call_id: int) -> None:
        self.asked.append(("cancel_call", call_id))

    def reply(self, group: str, caller: str, conn: int, stamp: int, payload: bytes) -> bool:
        return False

    def lock(self, group: str, lock: int) -> None:
        self.asked.append(("lock", group, lock))

    def unlock(self, group: str, lock: int) -> None:
        if group not in self.views:
            raise NotMember(group)
        self.asked.append(("unlock", group, lock))

    def is_member(self, group: str) -> bool:
        return group in self.views

    def is_leaving(self, group: str) -> bool:
        return False

    def groups(self) -> list[str]:
        return sorted(self.listed)

    def view(self, group: str) -> View | None:
        return self.views.get(group)

    def requests(self, kind: str) -> list[tuple[Any, ...]]:
        return [request for request in self.asked if request[0] == kind]


class Client:
    """A local client's connection in memory.  ``frames``: what it was pushed, decoded, in order; ``raw``: the
    same frames as pushed.  A ``stalled`` client reads nothing: its frames stay queued until :meth:`drain`."""

    numbers = itertools.count(1)

    def __init__(self, *, stalled: bool = False) -> None:
        self.id = next(self.numbers)
        self.peer: tuple[int, int, int] | None = None
        self.closed = False
        self.queued_frames = self.queued_bytes = self.dropped = 0
        self.on_written = lambda: None
        self.stalled = stalled
        self.frames: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.cut_with: tuple[str, str] | None = None

    def push(self, message: dict[str, Any]) -> bool:
        return self.push_encoded(localapi.encode_frame(message))

    def push_encoded(self, frame: bytes) -> bool:
        if self.closed:
            self.dropped += 1
            return False
        self.raw.append(frame)
        self.frames.append(localapi.decode_body_untrusted(frame[localapi.HEADER.size:]))
        if self.stalled:
            self.queued_frames += 1
            self.queued_bytes += len(frame)
        return True

    def cut(self, code: str, message: str) -> None:
        self.closed, self.cut_with = True, (code, message)

    def finish(self) -> None:
        self.closed = True

    def drain(self) -> None:
        self.stalled = False
        self.queued_frames = self.queued_bytes = 0
        self.on_written()

    def take(self) -> list[dict[str, Any]]:
        frames, self.frames = self.frames, []
        return frames

    def replies(self) -> dict[Any, dict[str, Any]]:
        """The replies taken, by request id."""
        return {frame["id"]: frame for frame in self.take() if "event" not in frame}

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [frame for frame in self.take() if frame.get("event") == kind]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def process() -> Process:
    return Process()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def hub(process: Process, clock: Clock) -> Translator:
    return Translator(process, clock=clock, overrun_frames=10)


def connect(hub: Translator, **options: Any) -> Client:
    client = Client(**options)
    hub.add(client)
    return client


def joined(hub: Translator, process: Process, group: str, *clients: Client) -> None:
    """``clients`` join ``group``, and the process gets into a view of it."""
    for client in clients:
        hub.handle(client, {"op": "join", "id": "j", "group": group})
    hub.handle_events([process.install(group)])
    for client in clients:
        assert client.replies()["j"]["ok"]


def delivered(group: str, src: str, seq: int, *payloads: bytes, handler: int | None = None,
              answer: bool = False) -> Delivered:
    return Delivered(group, src, seq, QoS.TOTAL, seq, ViewId(ME, 1), handler, payloads, answer)


# --------------------------------------------------------------------------------------------------------------------
# Join and leave


def test_a_join_is_answered_with_the_view_the_process_gets_into(hub: Translator, process: Process) -> None:
    client = connect(hub)
    hub.handle(client, {"op": "join", "id": 1, "group": "g"})
    assert process.requests("join") == [("join", "g")]
    assert client.take() == []  # waits for the view
    hub.handle_events([process.install("g", (ME, PEER))])
    frames = client.take()
    assert frames[0] == {"event": "view", "group": "g", "view": f"{ME}/1", "members": [ME, PEER], "ts": 0}
    assert frames[1] == {"id": 1, "ok": True, "view": f"{ME}/1", "members": [ME, PEER], "state_peers": 0}
    other = connect(hub)
    hub.handle(other, {"op": "join", "id": 2, "group": "g"})  # a member already: answered at once
    assert other.replies()[2]["members"] == [ME, PEER]


def test_the_process_leaves_a_group_when_its_last_client_does(hub: Translator, process: Process) -> None:
    first, second = connect(hub), connect(hub)
    joined(hub, process, "g", first, second)
    hub.handle(first, {"op": "leave", "id": 1, "group": "g"})
    assert first.replies()[1]["daemon_left"] is False
    assert process.requests("leave") == []
    hub.remove(second)  # a client that goes away leaves like one that asks
    assert process.requests("leave") == [("leave", "g")]
    hub.handle(first, {"op": "leave", "id": 2, "group": "g"})
    assert first.replies()[2]["error"] == localapi.NOT_JOINED


# --------------------------------------------------------------------------------------------------------------------
# Sends


def test_a_send_is_answered_with_its_sequence_number(hub: Translator, process: Process) -> None:
    client = connect(hub)
    hub.handle(client, {"op": "send", "id": 1, "group": "g", "payload": b"early"})
    refusal = client.replies()[1]
    assert refusal["error"] == localapi.NOT_MEMBER and "join it first" in refusal["message"]
    joined(hub, process, "g", client)
    hub.handle(client, {"op": "send", "id": 2, "group": "g", "payload": b"a"})
    hub.handle(client, {"op": "send_batch", "id": 3, "group": "g", "payloads": [b"b", b"c"]})
    replies = client.replies()
    assert replies[2] == {"id": 2, "ok": True, "seq": 1}
    assert replies[3] == {"id": 3, "ok": True, "seqs": [2, 3]}
    assert process.requests("send") == [("send", "g", (b"a",)), ("send", "g", (b"b", b"c"))]


def test_a_send_to_a_full_backlog_is_answered_once_it_has_room(hub: Translator, process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    process.full.add("g")
    hub.handle(client, {"op": "send", "id": 1, "group": "g", "payload": b"a"})
    hub.handle_events([])
    assert client.take() == []
    process.full.clear()
    hub.handle_events([])
    assert client.replies()[1]["seq"] == 1


# --------------------------------------------------------------------------------------------------------------------
# Deliveries


def test_deliveries_are_encoded_once_per_group_whatever_the_number_of_clients(hub: Translator,
                                                                              process: Process) -> None:
    clients = [connect(hub) for _ in range(3)]
    alone = connect(hub)
    joined(hub, process, "g", *clients)
    joined(hub, process, "h", alone)
    hub.handle_events([delivered("g", PEER, 1, b"a", b"b"), delivered("h", PEER, 1, b"x"),
                       delivered("g", PEER, 2, b"c")])
    frames = [client.raw[-1] for client in clients]
    assert all(frame is frames[0] for frame in frames)  # one frame, encoded once, for every client
    for client in clients:
        (event,) = client.events("deliveries")
        assert [(run[0], run[1], run[7]) for run in event["runs"]] == [(PEER, 1, [b"a", b"b"]), (PEER, 2, [b"c"])]
    (event,) = alone.events("deliveries")
    assert [run[7] for run in event["runs"]] == [[b"x"]]


def test_deliveries_before_another_event_of_their_group_are_pushed_before_it(hub: Translator,
                                                                              process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    hub.handle_events([delivered("g", PEER, 1, b"a"), process.install("g", (ME, PEER), 2),
                       delivered("g", PEER, 2, b"b")])
    assert [frame["event"] for frame in client.take()] == ["deliveries", "view", "deliveries"]


def test_only_the_client_holding_the_handler_lock_is_told_to_answer(hub: Translator, process: Process) -> None:
    holder, other = connect(hub), connect(hub)
    joined(hub, process, "g", holder, other)
    hub.handle(holder, {"op": "lock", "id": 1, "group": "g", "lock": 3})
    hub.handle_events([LockResult("g", 3, "lock", True)])
    assert holder.replies()[1]["granted"]
    hub.handle_events([delivered("g", PEER, 1, b"q", handler=3, answer=True)])
    assert holder.events("deliveries")[0]["runs"][0][8] is True
    assert other.events("deliveries")[0]["runs"][0][8] is False


# --------------------------------------------------------------------------------------------------------------------
# A client behind


def test_a_client_behind_holds_the_token_back_then_is_cut(hub: Translator, process: Process, clock: Clock) -> None:
    slow, fast = connect(hub, stalled=True), connect(hub)
    joined(hub, process, "g", slow, fast)
    hub.handle_events([delivered("g", PEER, seq, b"m") for seq in range(1, 12)])
    assert process.requests("overrun") == []  # one frame for the drain: not behind
    for seq in range(12, 24):
        hub.handle_events([delivered("g", PEER, seq, b"m")])
    assert process.requests("overrun") == [("overrun", "g", True)]
    clock.now += OVERRUN_GRACE / 2
    hub.handle_events([])
    assert not slow.closed
    clock.now += OVERRUN_GRACE
    hub.handle_events([])
    assert slow.cut_with is not None and slow.cut_with[0] == localapi.SLOW_CONSUMER
    assert not fast.closed
    assert process.requests("overrun") == [("overrun", "g", True), ("overrun", "g", False)]
    assert hub.stats["overrun_cut"] == 1


def test_a_client_that_catches_up_lets_the_token_go_again(hub: Translator, process: Process) -> None:
    slow = connect(hub, stalled=True)
    joined(hub, process, "g", slow)
    hub.handle_events([delivered("g", PEER, 1, b"m" * (OVERRUN_BYTES + 1))])
    assert process.requests("overrun") == [("overrun", "g", True)]
    slow.drain()
    assert process.requests("overrun") == [("overrun", "g", True), ("overrun", "g", False)]
    assert not slow.closed


# --------------------------------------------------------------------------------------------------------------------
# Locks and calls


def test_a_lock_is_given_back_when_its_client_goes(hub: Translator, process: Process) -> None:
    owner, other = connect(hub), connect(hub)
    joined(hub, process, "g", owner, other)
    hub.handle(owner, {"op": "lock", "id": 1, "group": "g", "lock": 2})
    assert process.requests("lock") == [("lock", "g", 2)]
    hub.handle_events([LockResult("g", 2, "lock", True)])
    assert owner.replies()[1] == {"id": 1, "ok": True, "granted": True, "lock": 2}
    hub.handle(other, {"op": "unlock", "id": 2, "group": "g", "lock": 2})
    assert other.replies()[2]["error"] == localapi.NOT_OWNER
    hub.handle(other, {"op": "lock", "id": 3, "group": "g", "lock": 2})
    assert other.replies()[3]["error"] == localapi.LOCK_HELD
    hub.remove(owner)
    assert process.requests("unlock") == [("unlock", "g", 2)]


def test_a_call_is_answered_or_fails_with_its_code(hub: Translator, process: Process) -> None:
    client = connect(hub)
    hub.handle(client, {"op": "call", "id": 1, "group": "far", "payload": b"q1"})
    hub.handle(client, {"op": "call", "id": 2, "group": "far", "payload": b"q2"})
    (first, second) = [request[3] for request in process.requests("call")]
    hub.handle_events([CallAnswered(first, "far", b"r1")])
    assert client.replies() == {1: {"id": 1, "ok": True, "reply": b"r1"}}
    hub.handle_events([CallAnswered(second, "far", None, "timeout", "no reply within 1 s")])
    assert client.replies()[2] == {"id": 2, "error": "call-timeout", "message": "no reply within 1 s"}
    hub.handle_events([CallAnswered(first, "far", b"again")])  # answered once only
    assert client.take() == []
    hub.handle(client, {"op": "call", "id": 3, "group": "far", "payload": b"q3"})
    hub.remove(client)
    assert process.requests("cancel_call") == [("cancel_call", 3)]


def test_a_groups_call_goes_to_the_client_holding_its_handler_lock(hub: Translator, process: Process) -> None:
    owner, other = connect(hub), connect(hub)
    joined(hub, process, "g", owner, other)
    call = CallToAnswer("g", PEER, 7, 1234, 4, b"work", ViewId(ME, 1))
    hub.handle_events([call])
    assert hub.stats["requests_unserved"] == 1
    hub.handle(owner, {"op": "lock", "id": 1, "group": "g", "lock": 4})
    hub.handle_events([LockResult("g", 4, "lock", True), call])
    (request,) = owner.events("request")
    assert (request["caller"], request["conn"], request["stamp"], request["payload"]) == (PEER, 7, 1234, b"work")
    assert other.events("request") == []


# --------------------------------------------------------------------------------------------------------------------
# A membership that ends


def test_a_failed_join_is_reported_to_its_clients_only(hub: Translator, process: Process) -> None:
    waiting, elsewhere = connect(hub), connect(hub)
    joined(hub, process, "h", elsewhere)
    hub.handle(waiting, {"op": "join", "id": 1, "group": "g"})
    hub.handle_events([JoinFailed("g", "no group answered")])
    reply = waiting.replies()[1]
    assert reply["error"] == localapi.JOIN_FAILED and "no group answered" in reply["message"]
    assert elsewhere.take() == []
    hub.handle(waiting, {"op": "send", "id": 2, "group": "g", "payload": b"x"})
    assert waiting.replies()[2]["error"] == localapi.NOT_MEMBER


def test_a_membership_that_ends_by_itself_tells_each_client_its_own_messages(hub: Translator,
                                                                             process: Process) -> None:
    first, second, elsewhere = connect(hub), connect(hub), connect(hub)
    joined(hub, process, "g", first, second)
    joined(hub, process, "h", elsewhere)
    hub.handle(first, {"op": "send", "id": 1, "group": "g", "payload": b"a"})
    hub.handle(second, {"op": "send", "id": 2, "group": "g", "payload": b"b"})
    hub.handle(first, {"op": "lock", "id": 3, "group": "g", "lock": 1})
    for client in (first, second):
        client.take()
    del process.views["g"]
    hub.handle_events([UndeliveredSends("g", (1, 2), "cut off"), Left("g", "cut off", rejoining=True)])
    first_frames, second_frames = first.take(), second.take()
    assert first_frames[0] == {"event": "undelivered", "group": "g", "seqs": [1], "reason": "cut off"}
    assert second_frames[0] == {"event": "undelivered", "group": "g", "seqs": [2], "reason": "cut off"}
    assert {"event": "rejoining", "group": "g", "reason": "cut off"} in first_frames
    assert {"id": 3, "error": localapi.LEFT, "message": "left 'g': cut off"} in first_frames
    assert elsewhere.take() == []
    hub.handle(first, {"op": "send", "id": 4, "group": "g", "payload": b"c"})
    assert "rejoining" in first.replies()[4]["message"]


def test_a_membership_that_ends_detaches_its_clients(hub: Translator, process: Process) -> None:
    client, elsewhere = connect(hub), connect(hub)
    joined(hub, process, "g", client)
    joined(hub, process, "h", elsewhere)
    del process.views["g"]
    hub.handle_events([Left("g", "removed")])
    assert client.take() == [{"event": "left", "group": "g", "reason": "removed"}]
    assert elsewhere.take() == []
    hub.handle(client, {"op": "leave", "id": 1, "group": "g"})
    assert client.replies()[1]["error"] == localapi.NOT_JOINED


# --------------------------------------------------------------------------------------------------------------------
# Bad requests


@pytest.mark.parametrize(("frame", "code"), [
    ({"id": 1}, localapi.BAD_REQUEST),
    ({"op": "dance", "id": 1}, localapi.UNKNOWN_OP),
    ({"op": "send", "id": 1, "group": "g"}, localapi.BAD_REQUEST),
    ({"op": "send", "id": 1, "group": "g", "payload": "text"}, localapi.BAD_REQUEST),
    ({"op": "join", "id": 1, "group": "g", "colour": "red"}, localapi.BAD_REQUEST),
    ({"op": "join", "id": 1, "group": "bad\nname"}, localapi.BAD_REQUEST),
    ({"op": "send", "id": 1, "group": "g", "payload": b"x", "qos": "fastest"}, localapi.BAD_REQUEST),
    ({"op": "lock", "id": 1, "group": "g", "lock": 1}, localapi.NOT_MEMBER),
    ({"op": "unlock", "id": 1, "group": "g", "lock": 1}, localapi.NOT_OWNER),
    ({"op": "reply", "id": 1, "group": "g", "caller": PEER, "conn": 1, "stamp": 1, "payload": b""},
     localapi.STALE_CALL),
    ({"op": "status", "id": 1, "all": True}, localapi.BAD_REQUEST),
])
def test_a_bad_request_is_answered_with_a_structured_error(hub: Translator, frame: dict[str, Any],
                                                           code: str) -> None:
    client = connect(hub)
    hub.handle(client, frame)
    (reply,) = client.take()
    assert reply["id"] == 1 and reply["error"] == code and reply["message"]
    assert hub.stats["requests_refused"] == 1


def test_every_operation_of_the_local_api_is_handled(hub: Translator, process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    for op, (required, _optional) in localapi.OPS.items():
        if op in ("leave", "status"):
            continue  # leave ends the membership; status reads the process's state, which this one has not
        fields = {"group": "g", "payload": b"x", "payloads": [b"x"], "lock": 1, "caller": PEER, "conn": 1,
                  "stamp": 1}
        hub.handle(client, {"op": op, "id": op, **{name: fields[name] for name in required}})
    assert hub.stats["requests_failed"] == 0


def test_shutting_down_refuses_requests_and_ends_every_connection(hub: Translator, process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    hub.leave_all()
    assert process.requests("leave") == [("leave", "g")]
    hub.handle(client, {"op": "send", "id": 1, "group": "g", "payload": b"x"})
    assert client.replies()[1]["error"] == localapi.SHUTTING_DOWN
    hub.close_sessions("bye")
    assert client.take() == [{"id": None, "error": localapi.SHUTTING_DOWN, "message": "bye"}]
    assert client.closed


# --------------------------------------------------------------------------------------------------------------------
# The deliveries frame, as a client decodes it


def test_a_deliveries_frame_carries_the_engines_fields_and_decodes_to_them(hub: Translator, process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    k2 = Delivered("g", PEER, 5, QoS.k(2), 9, ViewId(PEER, 12), 1, (b"a", b"b"), False)
    hub.handle_events([k2, delivered("g", PEER, 6, b"c")])
    (event,) = client.events("deliveries")
    assert event["runs"][0] == [PEER, 5, QoS.k(2).code(), 9, [PEER, 12], 1, 0, [b"a", b"b"], False]
    runs = localapi.decode_deliveries_untrusted(event["runs"], lambda *run: [run])
    assert runs == [(PEER, 5, QoS.k(2), 9, f"{PEER}/12", 1, 0, [b"a", b"b"], False, None),
                    (PEER, 6, QoS.TOTAL, 6, f"{ME}/1", None, 0, [b"c"], False, None)]


@pytest.mark.parametrize("runs", [
    None, 7, "runs", [[PEER, 1]], [[PEER, 1, 3, 0, [ME, 1], None, 0, [b"x"]]],
    [[PEER, 1, 7, 0, [ME, 1], None, 0, [b"x"], False]],  # no such QoS level
    [[PEER, 1, "total", 0, [ME, 1], None, 0, [b"x"], False]],
    [[PEER, 1, 3, 0, f"{ME}/1", None, 0, [b"x"], False]],
    [[PEER, 1, 3, 0, [ME, "1"], None, 0, [b"x"], False]],
    [[PEER, 1, 3, 0, [ME, 1, 2], None, 0, [b"x"], False]],
    [[PEER, 1, 3, 0, [ME, 1], None, 0, [b"x"], False, [b"k1", b"k2"]]],  # not one key per payload
    [[PEER, 1, 3, 0, [ME, 1], None, 0, [b"x"], False, ["k1"]]],
    [[PEER, 1, 3, 0, [ME, 1], None, 0, [b"x"], False, b"k1"]],
    [[PEER, 1, 3, 0, [ME, 1], None, 0, [b"x"], False, [b"k1"], 0]],
])
def test_runs_that_are_not_deliveries_are_a_bad_frame(runs: Any) -> None:
    with pytest.raises(localapi.FrameError) as refused:
        localapi.decode_deliveries_untrusted(runs, lambda *run: [run])
    assert refused.value.code == localapi.BAD_FRAME


# --------------------------------------------------------------------------------------------------------------------
# Memberships kept with no client, and state transfer participants


def test_a_persistent_join_is_recorded_and_a_failed_one_takes_its_record_back(process: Process, clock: Clock,
                                                                             tmp_path: Path) -> None:
    kept = MembershipFile(tmp_path / "kept.json")
    hub = Translator(process, clock=clock, kept=kept)
    client = connect(hub)
    hub.handle(client, {"op": "join", "id": 1, "group": "g", "persist": True})
    hub.handle(client, {"op": "join", "id": 2, "group": "h", "persist": True})
    assert set(kept.load()) == {"g", "h"}
    hub.handle_events([process.install("g"), JoinFailed("h", "no group answered")])
    assert set(kept.load()) == {"g"}
    hub.remove(client)
    assert process.requests("leave") == []  # kept with no client
    other = connect(hub)
    hub.handle(other, {"op": "leave", "id": 3, "group": "g", "persist": True})
    assert other.replies()[3] == {"id": 3, "ok": True, "daemon_left": True}
    assert kept.load() == {}
    assert process.requests("leave") == [("leave", "g")]


def test_a_persistent_join_the_state_directory_cannot_record_is_refused(process: Process, clock: Clock,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "not-a-directory").write_text("")
    hub = Translator(process, clock=clock, kept=MembershipFile(tmp_path / "not-a-directory" / "kept.json"))
    client = connect(hub)
    hub.handle(client, {"op": "join", "id": 1, "group": "g", "persist": True})
    assert client.replies()[1]["error"] == localapi.STATE_UNWRITABLE
    assert process.requests("join") == []
    assert hub.stats["memberships_unsaved"] == 1


def test_kept_groups_are_joined_at_start_and_a_reload_drops_those_no_longer_listed(hub: Translator,
                                                                                  process: Process) -> None:
    hub.rejoin_kept([Membership("a"), Membership("b")], {"c": Membership("c")})
    assert sorted(request[1] for request in process.requests("join")) == ["a", "b", "c"]
    client = connect(hub)
    hub.handle(client, {"op": "join", "id": 1, "group": "b"})
    joined_now, dropped = hub.reload_kept([Membership("a"), Membership("d")], {})
    assert (joined_now, dropped) == (["d"], ["b", "c"])
    assert process.requests("leave") == [("leave", "c")]  # b still has a client


def test_a_state_participant_that_leaves_is_announced_to_the_group(hub: Translator, process: Process) -> None:
    participant, other = connect(hub), connect(hub)
    hub.handle(participant, {"op": "join", "id": 1, "group": "g", "state": True})
    hub.handle_events([process.install("g")])
    hub.handle(other, {"op": "join", "id": 2, "group": "g", "state": True})
    assert other.replies()[2]["state_peers"] == 1
    hub.handle(participant, {"op": "leave", "id": 3, "group": "g"})
    notice = localapi.state_participant_gone(ME, participant.id)
    assert process.requests("send") == [("send", "g", (notice,))]
