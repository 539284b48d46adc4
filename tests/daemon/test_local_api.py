"""The local socket under hostile and careless clients: every bad request gets a structured error, and the
daemon keeps serving; the socket is mode 0660; READY=1 reaches the service manager; SIGTERM exits 0."""

from __future__ import annotations

import contextlib
import grp
import os
import random
import socket
import stat
import struct
import subprocess
import time

import msgpack
import pytest

from rmpd.bench.daemons import recv_frame
from rmpd.localapi import encode_frame

from .conftest import FAST_JOIN
from .harness import RMP, unique, wait_for
from .test_calls import ready_for_calls


class RawClient:
    """A client that writes whatever bytes a test gives it, to see what the daemon answers."""

    def __init__(self, path: os.PathLike[str]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(os.fspath(path))
        self.buffer = b""

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, obj: object) -> dict:
        """Send one frame and return the first frame that is not a pushed event (view changes, deliveries)."""
        self.sock.sendall(encode_frame(obj) if isinstance(obj, dict) else _frame(obj))
        return self.answer()

    def answer(self) -> dict:
        """The next frame that is not a pushed event."""
        while "event" in (reply := self.read()):
            pass
        return reply

    def read(self) -> dict:
        frame, self.buffer = recv_frame(self.sock, self.buffer)
        return frame

    def closed_by_peer(self) -> bool:
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buffer += chunk
        except TimeoutError:
            return False


def _frame(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def assert_error(reply: dict, code: str) -> None:
    assert reply.get("error") == code, reply
    assert isinstance(reply.get("message"), str) and reply["message"]


def test_garbage_gets_structured_errors_and_the_daemon_keeps_serving(daemons) -> None:
    d = daemons()
    client = RawClient(d.socket)
    assert_error(client.request({"op": "fly", "id": 1}), "unknown-op")
    assert_error(client.request({"id": 2}), "bad-request")
    assert_error(client.request({"op": 7, "id": 3}), "bad-request")
    assert_error(client.request({"op": "join", "id": 4}), "bad-request")
    assert_error(client.request({"op": "join", "id": 5, "group": 12}), "bad-request")
    assert_error(client.request({"op": "join", "id": 6, "group": "g", "ttl": "high"}), "bad-request")
    assert_error(client.request({"op": "join", "id": 7, "group": ""}), "bad-request")
    assert_error(client.request({"op": "send", "id": 8, "group": "g", "payload": "text, not bytes"}), "bad-request")
    assert_error(client.request({"op": "send", "id": 9, "group": "g", "payload": b"x", "qos": "fast"}), "bad-request")
    assert_error(client.request({"op": "send", "id": 10, "group": "g", "payload": b"x"}), "not-member")
    assert_error(client.request({"op": "lock", "id": 11, "group": "g", "lock": True}), "bad-request")
    assert_error(client.request({"op": "members", "id": 12, "group": "g", "extra": 1}), "bad-request")
    assert_error(client.request({"op": "status", "id": [1]}), "bad-request")
    assert_error(client.request([1, 2, 3]), "bad-frame")
    assert_error(client.request("just a string"), "bad-frame")
    assert_error(client.request({1: 2}), "bad-frame")
    client.send_raw(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    assert_error(client.read(), "bad-frame")
    rng = random.Random(4)
    for _ in range(200):
        body = rng.randbytes(rng.randrange(1, 64))
        client.send_raw(struct.pack(">I", len(body)) + body)
        reply = client.read()
        assert "error" in reply and isinstance(reply["message"], str), reply
    reply = client.request({"op": "hello", "id": 99})
    assert reply["ok"] and reply["id"] == 99 and reply["pid"] == d.pid

    # An oversize frame: its length cannot be trusted, so the error comes and then the connection closes.
    client.send_raw(struct.pack(">I", 512 * 1024 * 1024) + b"x" * 100)
    assert_error(client.read(), "frame-too-large")
    assert client.closed_by_peer()

    # Random bytes with no framing at all, then hang up: the daemon survives and serves the next client.
    junk = RawClient(d.socket)
    junk.send_raw(random.Random(5).randbytes(100_000))
    junk.sock.close()
    fresh = RawClient(d.socket)
    assert fresh.request({"op": "hello", "id": 1})["ok"]
    assert d.proc.poll() is None
    assert d.counters()["hub_requests_refused"] >= 10


def test_what_one_datagram_cannot_carry_is_refused_before_the_daemon_keeps_it(daemons) -> None:
    """A call or a reply over one packet and a K past its bound were accepted, then failed to encode when a
    timer resent them, which stopped the daemon and lost what it had accepted; now each gets its error code."""
    a, b = daemons(), daemons()
    server, caller = RawClient(a.socket), RawClient(b.socket)
    assert server.request({"op": "join", "id": 1, "group": "big"})["ok"]
    too_big = b"x" * 70_000  # over the 60 KiB packets of loopback
    assert_error(caller.request({"op": "call", "id": 1, "group": "big", "payload": too_big}), "message-too-large")
    huge_k = "k" + "9" * 30
    assert_error(caller.request({"op": "call", "id": 2, "group": "big", "payload": b"q", "qos": huge_k}),
                 "bad-request")
    assert_error(server.request({"op": "send", "id": 2, "group": "big", "payload": b"a", "qos": huge_k}),
                 "bad-request")
    assert_error(server.request({"op": "lock", "id": 3, "group": "big", "lock": 1024}), "bad-request")

    assert server.request({"op": "lock", "id": 4, "group": "big", "lock": 0})["granted"]
    wait_for(lambda: ready_for_calls([a], "big"), 10, "the member's SCMP floor to pass")
    caller.send_raw(encode_frame({"op": "call", "id": 5, "group": "big", "payload": b"q", "timeout": 10}))
    while (call := server.read()).get("event") != "request":
        pass
    answer = {"op": "reply", "group": "big", "caller": call["caller"], "conn": call["conn"], "stamp": call["stamp"]}
    assert_error(server.request({**answer, "id": 6, "payload": too_big}), "message-too-large")
    assert server.request({**answer, "id": 7, "payload": b"fits"})["ok"]
    assert caller.read() == {"id": 5, "ok": True, "reply": b"fits"}
    assert server.request({"op": "send", "id": 8, "group": "big", "payload": b"after"})["ok"]
    assert a.proc.poll() is None and b.proc.poll() is None
    assert a.counters()["hub_requests_refused"] == 3 and b.counters()["hub_requests_refused"] == 2


def test_out_of_descriptors_the_daemon_defers_new_clients_and_keeps_serving(daemons) -> None:
    """accept() failing with EMFILE ended the daemon: any local user could stop it by opening connections."""
    d = daemons()
    d.rmp("join", "fds")
    first = RawClient(d.socket)
    assert first.request({"op": "join", "id": 1, "group": "fds"})["ok"]
    limit = len(os.listdir(f"/proc/{d.proc.pid}/fd")) + 4
    subprocess.run(["prlimit", f"--pid={d.proc.pid}", f"--nofile={limit}:{limit}"], check=True)
    crowd = []
    for _ in range(12):  # more than the descriptors left: the last ones wait in the listen backlog
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.fspath(d.socket))
        crowd.append(sock)
    wait_for(lambda: first.request({"op": "status", "id": 2})["counters"].get("hub_accept_deferred", 0) > 0, 10,
             "accept to run out of descriptors")
    assert first.request({"op": "send", "id": 3, "group": "fds", "payload": b"still here"})["ok"]
    for sock in crowd:
        sock.close()
    late = RawClient(d.socket)  # accepted once descriptors are free again
    assert late.request({"op": "hello", "id": 1})["ok"]
    assert d.proc.poll() is None


def test_socket_mode_ready_notification_and_clean_sigterm(daemons) -> None:
    d = daemons()
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o660
    assert "READY=1" in d.ready_message
    d.rmp("join", "solo")
    assert f"uid {os.getuid()} gid {os.getgid()}" in d.log_path.read_text()  # each client's SO_PEERCRED
    assert d.members("solo") == [d.pid]
    assert d.stop() == 0
    assert not d.socket.exists()
    assert "leaving 1 group" in d.log_path.read_text()


def test_the_socket_and_its_new_directory_belong_to_the_configured_group(daemons, tmp_path) -> None:
    others = [g for g in grp.getgrall() if g.gr_gid != os.getgid()]
    if not others or os.geteuid() != 0:
        pytest.skip("needs root and a second group to give the socket to")
    config = tmp_path / "group.toml"
    config.write_text(f'socket_group = "{others[0].gr_name}"\nruntime_dir_mode = 0o710\n')
    socket_path = tmp_path / "run" / "rmpd.sock"
    d = daemons(config=config, socket_path=socket_path)
    assert os.stat(socket_path).st_gid == others[0].gr_gid
    assert os.stat(socket_path.parent).st_gid == others[0].gr_gid
    assert stat.S_IMODE(os.stat(socket_path.parent).st_mode) == 0o710
    assert d.proc.poll() is None


def test_sigterm_leaves_the_group_so_the_others_install_a_view_without_it(daemons) -> None:
    a, b = daemons(), daemons()
    a.rmp("join", "g")
    b.rmp("join", "g")
    wait_for(lambda: sorted(a.members("g")) == sorted([a.pid, b.pid]), 10, "a two-member view")
    assert b.stop() == 0
    wait_for(lambda: a.members("g") == [a.pid], 10, "a view without the stopped daemon")


def test_handler_locks_belong_to_the_client_that_took_them(daemons) -> None:
    d = daemons()
    d.rmp("join", "locks")
    owner, other = RawClient(d.socket), RawClient(d.socket)
    assert owner.request({"op": "join", "id": 1, "group": "locks"})["ok"]
    assert other.request({"op": "join", "id": 1, "group": "locks"})["ok"]
    assert owner.request({"op": "lock", "id": 2, "group": "locks", "lock": 3}) == {
        "id": 2, "ok": True, "granted": True, "lock": 3}
    assert_error(other.request({"op": "lock", "id": 2, "group": "locks", "lock": 3}), "lock-held")
    assert_error(other.request({"op": "unlock", "id": 3, "group": "locks", "lock": 3}), "not-owner")
    owner.sock.close()  # the owner goes away: its lock is given back to the group
    wait_for(lambda: not any(g["locks"] for g in d.status()["groups"]), 10, "the lock to be released")
    assert other.request({"op": "lock", "id": 4, "group": "locks", "lock": 3})["granted"]
    # Locks taken by `rmp lock` belong to the daemon until `rmp unlock`.
    d.rmp("lock", "locks", "4")
    assert_error(other.request({"op": "unlock", "id": 5, "group": "locks", "lock": 4}), "not-owner")
    d.rmp("unlock", "locks", "4")
    result = d.rmp("unlock", "locks", "4", check=False)
    assert result.returncode == 1 and "not-owner" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_two_clients_asking_for_one_lock_at_once_are_never_both_granted_it(daemons) -> None:
    """The group grants locks to daemons, so while one client's request was on its way a second client of the
    same daemon passed the daemon's check too, and both were told "granted"."""
    a, b = daemons(), daemons()
    a.rmp("join", "race")
    b.rmp("join", "race")
    wait_for(lambda: sorted(a.members("race")) == sorted([a.pid, b.pid]), 10, "a two-member view")
    first, second = RawClient(a.socket), RawClient(a.socket)
    for client in (first, second):
        assert client.request({"op": "join", "id": 0, "group": "race"})["ok"]
    for lock in range(6, 46):
        for client in (first, second):  # both requests on their way before either is answered
            client.send_raw(encode_frame({"op": "lock", "id": lock, "group": "race", "lock": lock}))
        replies = [first.answer(), second.answer()]
        granted = [r for r in replies if r.get("granted")]
        assert len(granted) == 1, (lock, replies)
        assert [r.get("error") for r in replies if not r.get("granted")] == ["lock-held"]
    # The same client asking twice is answered twice, from one request to the group.
    for _ in range(2):
        first.send_raw(encode_frame({"op": "lock", "id": "again", "group": "race", "lock": 100}))
    assert [first.answer()["granted"], first.answer()["granted"]] == [True, True]


def test_a_client_that_hangs_up_with_frames_unread_is_gone_as_one_that_ends_cleanly(daemons) -> None:
    """Closing a socket with frames of the daemon's still unread resets it: the daemon's next read fails instead of
    ending. The client is gone all the same: detached from its group, which the daemon then leaves."""
    d = daemons()
    group = unique("reset")
    client = RawClient(d.socket)
    assert client.request({"op": "join", "group": group, "id": 1})["ok"]
    client.send_raw(encode_frame({"op": "send", "group": group, "payload": b"x" * 1000, "id": 2}))
    # Everything the daemon has for it is in its socket, unread (then nothing the daemon writes finds it gone).
    wait_for(lambda: b"x" * 1000 in client.sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT), 10,
             "the delivery of its message")
    client.sock.close()
    wait_for(lambda: all(g["group"] != group for g in d.status()["groups"]), 10, "the daemon to leave the group")


def test_a_leave_from_a_client_that_never_joined_leaves_a_persistent_membership_alone(daemons) -> None:
    d = daemons()
    d.rmp("join", "kept")  # persistent: until `rmp leave`
    stranger = RawClient(d.socket)
    assert_error(stranger.request({"op": "leave", "id": 1, "group": "kept"}), "not-joined")
    assert d.members("kept") == [d.pid]
    assert stranger.request({"op": "leave", "id": 2, "group": "kept", "persist": True})["daemon_left"]


def test_a_slow_reader_slows_the_group_and_a_stuck_one_is_cut_off(daemons, tmp_path) -> None:
    """Section 4.6: a member whose client is behind holds the token back, so the sender is paced to the reader
    and nothing is lost; a client that stops reading is cut off with slow-consumer and the group goes on."""
    config = tmp_path / "small-queue.toml"
    config.write_text("client_queue = 50\n" + FAST_JOIN)
    d = daemons(config=config)
    d.rmp("join", "flood")
    slow, stuck = RawClient(d.socket), RawClient(d.socket)
    for client in (slow, stuck):
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert client.request({"op": "join", "id": 1, "group": "flood"})["ok"]
    sender = subprocess.Popen([RMP, "--socket", str(d.socket), "send", "flood", "--count", "3000", "--size",
                               "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    frames = []
    delivered = 0
    while delivered < 3000:  # a reader slower than the sender: at most about 200 frames a second
        frame = slow.read()
        frames.append(frame)
        assert "error" not in frame, frame
        if frame.get("event") == "deliveries":
            delivered += sum(len(run[7]) for run in frame["runs"])
        time.sleep(0.005)
    assert sender.wait(60) == 0
    stuck.sock.settimeout(30)
    last = None
    with contextlib.suppress(AssertionError, OSError):
        while True:
            last = stuck.read()
    assert last is not None and last.get("error") == "slow-consumer", last
    assert d.proc.poll() is None
    assert d.rmp_json("members", "flood")["members"] == [d.pid]
    counters = d.counters()
    assert counters["hub_overrun_on"] >= 1 and counters["hub_overrun_cut"] == 1 and counters["overruns"] >= 1


def test_status_reads_whole_at_80_columns_and_its_json_keys_are_one_style(daemons, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    a, b = daemons(), daemons()
    group = unique("status")
    a.rmp("join", group)
    b.rmp("join", group, "--ttl", "3")
    wait_for(lambda: sorted(a.members(group)) == sorted([a.pid, b.pid]), 30, "one view of both daemons")
    # The view carries the largest TTL any member asked for: a multicasts with b's 3 (paper section 3.1).
    assert next(g["ttl"] for g in a.status()["groups"] if g["group"] == group) == 3
    text = a.rmp("status").stdout
    assert max(len(line) for line in text.splitlines()) <= 80, text
    view = next(g["view"] for g in a.status()["groups"] if g["group"] == group)
    for whole in (a.pid, b.pid, view, group):
        assert whole in text, (whole, text)
    scmp = next(g["scmp"] for g in a.rmp_json("status")["groups"] if g["group"] == group)
    assert not [key for key in scmp if "-" in key], scmp
    assert {"summary_rejected", "too_early", "new", "duplicate"} <= set(scmp)
    a.rmp("send", group, "one")
    watched = a.rmp("status", "--watch", "--interval", "0.2", "--count", "3").stdout
    assert group in watched and b.pid in watched and "per second" in watched
    rates = [line for line in watched.splitlines() if line.strip().startswith("datagrams out")]
    assert rates and rates[-1].rstrip().endswith("/s"), watched
