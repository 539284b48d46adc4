"""Multi-RPC on real daemons: `rmp call` from a non-member, `rmp serve` answering, SCMP at-most-once across
duplicates on the wire and across kill -9 of every member, for calls and for join requests (issue: SCMP
at-most-once, multi-RPC)."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import trio

import rmpd
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.naming import group_address
from rmpd.protocol.packets import CallStatus, ListChangeRequest, NonMemberAck, NonMemberData, decode, encode
from rmpd.protocol.qos import QoS

from .harness import RMP, unique, wait_for


def start_server(daemon, runs: Path, group: str) -> subprocess.Popen[bytes]:
    """`rmp serve` with a command that counts its runs in ``runs`` and upper-cases the request."""
    err = runs.with_suffix(f".{daemon.name}.err")
    script = f"echo ran >> {runs}; tr a-z A-Z"
    proc = subprocess.Popen([RMP, "--socket", str(daemon.socket), "serve", group, "--handler", "0", "--",
                             "sh", "-c", script], stderr=err.open("wb"))
    wait_for(lambda: "serving" in err.read_text() or proc.poll() is not None, 30, "rmp serve to take the lock")
    assert proc.poll() is None, err.read_text()
    return proc


def ready_for_calls(members, group: str) -> bool:
    """Every member's filter floor (calls stamped before it started are refused) is in the past."""
    now_ms = time.time() * 1000
    groups = [g for d in members for g in d.status()["groups"] if g["group"] == group]
    return len(groups) == len(members) and all(g["scmp"].get("upper", now_ms) < now_ms - 50 for g in groups)


def runs_of(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


class RawCaller:
    """A non-member speaking the wire protocol from a plain UDP socket: it can send one CALL datagram as many
    times as it likes, keep it, and replay it later."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        self.pid = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def datagram(self, payload: bytes) -> bytes:
        return encode(NonMemberData(self.group, None, self.pid, 0, int(time.time() * 1000), QoS.TOTAL,
                                    NonMemberData.FLAG_ACK, 0, payload))

    def join_datagram(self) -> bytes:
        """A List Change Request asking to join, stamped now (request ID = clock in ms times 1000)."""
        request_id = int(time.time() * 1000) * 1000
        return encode(ListChangeRequest(self.group, None, self.pid, request_id, "join", 0, True, 1, 1))

    def send(self, data: bytes, copies: int) -> None:
        for _ in range(copies):
            self.sock.sendto(data, group_address(self.group))

    def answers(self, seconds: float) -> list[NonMemberAck]:
        """Every Non Member ACK that arrives within ``seconds`` (the group answers each copy it orders)."""
        out: list[NonMemberAck] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data, _ = self.sock.recvfrom(65536)
            except TimeoutError:
                break
            packet = decode(data)
            if isinstance(packet, NonMemberAck):
                out.append(packet)
        return out


def test_call_runs_once_with_duplicates_on_the_wire_and_after_kill_9_of_every_member(daemons, tmp_path) -> None:
    group = unique("rpc")
    runs = tmp_path / "runs"
    members = [daemons(f"m{i}") for i in range(3)]
    for d in members[1:]:
        d.rmp("join", group)
    server = start_server(members[0], runs, group)
    wait_for(lambda: all(len(d.members(group)) == 3 for d in members), 30, "a three-member group")
    wait_for(lambda: ready_for_calls(members, group), 10, "the members' SCMP floors to pass")
    outsider = daemons("outsider")

    # A non-member's `rmp call` gets one reply; the command ran once.
    result = outsider.rmp("call", group, "hello")
    assert result.stdout == "HELLO"
    assert runs_of(runs) == 1

    # The same CALL datagram five times on the wire: one run; copies ordered while it runs get an ACK, later
    # ones the stored reply.
    caller = RawCaller(group)
    call = caller.datagram(b"dup")
    caller.send(call, 5)
    answers = caller.answers(2.0)
    replies = {a.reply for a in answers if a.status is CallStatus.REPLY}
    assert replies == {b"DUP"} and {a.status for a in answers} <= {CallStatus.ACK, CallStatus.REPLY}
    assert runs_of(runs) == 2
    scmp = next(g["scmp"] for g in members[0].status()["groups"] if g["group"] == group)
    assert scmp["new"] == 2 and scmp["duplicate"] >= 1, scmp

    # A join request from before the crash, kept to be replayed after it.
    old_join = caller.join_datagram()

    # kill -9 every member, start them again on the same ports (same process IDs, same state directories).
    latest_files = sorted(p for d in members for p in d.state_dir.glob("scmp-latest-*"))
    assert len(latest_files) == 3
    stamp = decode(call).stamp
    assert all(int(p.read_text()) >= stamp for p in latest_files), "latest covered the call before it ran"
    ports = [int(d.pid.rsplit(":", 1)[1]) for d in members]
    for d in members:
        d.proc.send_signal(signal.SIGKILL)
    for d in members:
        d.proc.wait(10)
    server.wait(30)
    members = [daemons(f"m{i}", port=port) for i, port in enumerate(ports)]
    for d in members[1:]:
        d.rmp("join", group)
    server = start_server(members[0], runs, group)
    wait_for(lambda: all(len(d.members(group)) == 3 for d in members), 30, "the group formed again")

    # The CALL captured before the crash, replayed: refused as a possible duplicate, not run.
    caller.send(call, 5)
    answers = caller.answers(2.0)
    assert answers and {a.status for a in answers} == {CallStatus.UNKNOWN}
    assert runs_of(runs) == 2

    # The join request from before the crash, replayed: refused (the group's join floor comes from the restarted
    # founder's persisted latest), and the group stays as it is.
    caller.send(old_join, 5)
    answers = caller.answers(2.0)
    refusal = (CallStatus.JOIN_REFUSED, decode(old_join).request_id)
    assert answers and {(a.status, a.stamp) for a in answers} == {refusal}
    assert all(caller.pid not in d.members(group) for d in members)
    groups = [g for d in members for g in d.status()["groups"] if g["group"] == group]
    assert sum(g["scmp"]["joins_refused"] for g in groups) >= 1

    # A fresh call is accepted once the restarted members' floors have passed.
    wait_for(lambda: ready_for_calls(members, group), 10, "the restarted members' SCMP floors to pass")
    assert outsider.rmp("call", group, "again").stdout == "AGAIN"
    assert runs_of(runs) == 3
    server.terminate()


def test_call_errors_are_clear(daemons) -> None:
    group = unique("rpc")
    member = daemons("m")
    member.rmp("join", group)
    wait_for(lambda: ready_for_calls([member], group), 10, "the member's SCMP floor to pass")
    outsider = daemons("outsider")
    no_handler = outsider.rmp("call", group, "x", "--handler", "2", check=False)
    assert no_handler.returncode == 1 and "call-no-handler" in no_handler.stderr
    nobody = outsider.rmp("call", "no-such-group", "x", "--timeout", "0.5", check=False)
    assert nobody.returncode == 1 and "call-timeout" in nobody.stderr
    delivered = outsider.rmp("call", group, "note", "--no-handler")
    assert "delivered" in delivered.stderr
    scmp = next(g["scmp"] for g in member.status()["groups"] if g["group"] == group)
    assert scmp["new"] == 1 and scmp["estimator"] == "limited-horizon", scmp
    assert "lifetime" in member.rmp("status").stdout


def test_a_member_calls_its_own_group_through_its_own_daemon(daemons, tmp_path) -> None:
    """The README's `rmp serve calc --handler 0 -- bc &` then `rmp call calc` on the same daemon: the daemon's
    own call reaches its own group engine (a host does not hear its own multicast), runs once, and is answered."""
    group = unique("rpc")
    member = daemons("m")
    runs = tmp_path / "runs"
    server = start_server(member, runs, group)
    try:
        wait_for(lambda: ready_for_calls([member], group), 10, "the member's SCMP floor to pass")
        first = member.rmp("call", group, "hello", "--timeout", "10")
        assert first.stdout.strip() == "HELLO" and runs_of(runs) == 1, first.stderr
        second = member.rmp("call", group, "again", "--timeout", "10")
        assert second.stdout.strip() == "AGAIN" and runs_of(runs) == 2, second.stderr
        assert member.counters().get("calls_looped_back", 0) >= 4  # each call, and its answer, stayed inside
    finally:
        server.terminate()
        server.wait(10)


def test_a_call_answered_at_once_by_its_own_daemons_group_is_not_lost(daemons) -> None:
    """A one-member group on the caller's own daemon decides the call inside the request that makes it (from the
    second call on: the first one's probe told the daemon the group is there): the answer must still reach the
    caller (it used to be dropped, and the call then waited forever, ignoring --timeout)."""
    group = unique("rpc")
    member = daemons("m")
    member.rmp("join", group)
    for _ in range(3):
        started = time.monotonic()
        result = member.rmp("call", group, "x", "--handler", "3", "--timeout", "2", check=False, timeout=20)
        assert result.returncode == 1 and "call-no-handler" in result.stderr, result.stderr
        assert time.monotonic() - started < 10


def test_a_call_nobody_serves_ends_by_its_timeout(daemons) -> None:
    """No member anywhere: the call ends with call-timeout within its timeout plus 1 s, each time (timed from the
    library's call, so the `rmp` process's start-up on a busy host does not count)."""
    caller = daemons("outsider")

    async def timed_call(group: str, timeout: float) -> tuple[str, float]:
        async with rmpd.connect(caller.socket) as client:
            started = trio.current_time()
            try:
                await client.call(group, b"x", timeout=timeout)
            except rmpd.RmpdError as exc:
                return exc.code, trio.current_time() - started
            return "answered", trio.current_time() - started

    for timeout in (0.3, 1.0, 2.0, 1.0, 0.3):
        code, took = trio.run(timed_call, unique("nobody"), timeout)
        assert code == "call-timeout" and timeout <= took + 0.05 and took <= timeout + 1.0, (timeout, code, took)
    result = caller.rmp("call", unique("nobody"), "x", "--timeout", "0.5", check=False, timeout=20)
    assert result.returncode == 1 and "call-timeout" in result.stderr


def test_rmp_call_sends_bytes_that_are_not_utf8_and_its_json_gives_the_reply_back_exactly(daemons) -> None:
    member = daemons("m")
    group = unique("bytes")
    proc = subprocess.Popen([RMP, "--socket", str(member.socket), "serve", group, "--json", "--count", "1", "--",
                             "cat"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "serving"
        request = b"caf\xe9 \xff"
        result = subprocess.run([RMP.encode(), b"--socket", bytes(member.socket), b"call", group.encode(), request,
                                 b"--json"], capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert "reply" not in answer and base64.b64decode(answer["reply_b64"]) == request, answer
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_rmp_serve_json_prints_one_object_when_serving_and_one_per_call(daemons) -> None:
    member = daemons("m")
    group = unique("json")
    proc = subprocess.Popen([RMP, "--socket", str(member.socket), "serve", group, "--json", "--count", "1", "--",
                             "tr", "a-z", "A-Z"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        serving = json.loads(proc.stdout.readline())
        assert (serving["event"], serving["group"], serving["handler"]) == ("serving", group, 0), serving
        assert serving["command"] == ["tr", "a-z", "A-Z"] and serving["view"]
        assert member.rmp("call", group, "hi").stdout == "HI"
        served = json.loads(proc.stdout.readline())
        assert (served["event"], served["served"], served["ok"], served["request_bytes"], served["reply_bytes"]) \
            == ("served", 1, True, 2, 2), served
        assert served["caller"] == member.pid and proc.wait(30) == 0
    finally:
        proc.kill()


def test_an_embedded_node_calls_its_own_group_and_hears_every_answer(loopback_multicast) -> None:
    """The embedded Node: a one-member group of its own answers inside the call (no-handler, at once, once the
    first call's probe told the caller the group is there), and a served call made right after the group formed is
    answered (stamped above the floor the probe was told), within the timeout."""

    async def main() -> tuple[list[str], bytes | None]:
        fast_join = EngineConfig(request_interval=0.1, join_retries=3)
        async with rmpd.Node(interface="lo", port=0, config=fast_join) as node:
            group = await node.join(unique("own"))
            unheld = []
            for _ in range(2):
                with trio.fail_after(5):
                    try:
                        await node.call(group.name, b"x", handler=3, timeout=2.0)
                        unheld.append("answered")
                    except rmpd.RmpdError as exc:
                        unheld.append(exc.code)
            await group.lock(0)

            async def serve() -> None:
                async for request in group.requests(0):
                    await request.reply(request.payload.upper())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                with trio.fail_after(10.5):
                    reply = await node.call(group.name, b"hi", handler=0)
                nursery.cancel_scope.cancel()
            return unheld, reply

    assert trio.run(main) == (["call-no-handler"] * 2, b"HI")
