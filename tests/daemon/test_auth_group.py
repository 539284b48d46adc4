"""Keyed groups on real daemons: only key holders enter, forged datagrams are dropped and counted, order holds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.ids import ViewId
from rmpd.protocol.naming import group_address
from rmpd.protocol.packets import Data, ListChangeRequest, decode, encode
from rmpd.protocol.qos import QoS
from rmpd.runtime.sockets import open_multicast
from rmpd.wire.sealing import signed_body

from .harness import RMP, RMPD, Daemon, unique, wait_for
from .test_loopback_group import start_listener


def keygen(path: Path) -> Path:
    result = subprocess.run([RMPD, "keygen", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return path


def keyed_group(daemons, key: Path, group: str) -> list[Daemon]:
    ds = [daemons(extra=["--auth-key", str(key)]) for _ in range(3)]
    for d in ds:
        d.rmp("join", group)
    wait_for(lambda: all(len(d.members(group)) == 3 for d in ds), 30, "a three-member keyed view")
    return ds


class Chatter:
    """Sends a message to the group every 0.1 s from one member, so the group's address carries traffic; entered
    once the first message went out (an outsider's join is only informative while traffic flows)."""

    def __init__(self, daemon: Daemon, group: str) -> None:
        self.stop = threading.Event()
        self.sending = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(daemon, group), daemon=True)
        self.thread.start()

    def _run(self, daemon: Daemon, group: str) -> None:
        while not self.stop.wait(0.1):
            if daemon.rmp("send", group, "tick", check=False).returncode == 0:
                self.sending.set()

    def __enter__(self) -> Chatter:
        assert self.sending.wait(30), "the chatter could not send"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def patient_join(tmp_path: Path) -> Path:
    """A join lasting about 3 s (not the suite's 0.7 s), so a group's traffic surely reaches the joiner."""
    patient = tmp_path / "patient-join.toml"
    patient.write_text("[timers]\nrequest_interval = 0.2\njoin_retries = 4\n")
    return patient


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("outsider_key", "existing"), [("none", False), ("another", True)])
def test_a_daemon_without_the_group_key_cannot_enter(daemons, tmp_path: Path, outsider_key: str,
                                                     existing: bool) -> None:
    ds = keyed_group(daemons, keygen(tmp_path / "group.key"), "secure")
    view = ds[0].status()["groups"][0]["view"]
    extra = ["--auth-key", str(keygen(tmp_path / "other.key"))] if outsider_key == "another" else []
    outsider = daemons("outsider", extra=extra, config=patient_join(tmp_path))
    with Chatter(ds[0], "secure"):
        started = time.monotonic()
        result = outsider.rmp("join", "secure", *(["--existing"] if existing else []), check=False, timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < 30
    said = one_line(result.stderr)
    if outsider_key == "none":  # it hears sealed datagrams it cannot open: the group is keyed, whatever it asked
        assert "auth-required" in said and "--auth-key" in said and "has no key" in said, said
    else:
        assert "join-failed" in said and "could not verify" in said, said
    assert all(len(d.members("secure")) == 3 and d.status()["groups"][0]["view"] == view for d in ds)
    assert outsider.status()["groups"] == []
    seen = outsider.status()
    assert set(seen["auth"]["unverified_sources"]) & {d.pid for d in ds}
    reason = "auth_unverifiable" if outsider_key == "none" else "auth_rejected_unknown_key"
    assert seen["counters"][reason] > 0
    dropped = ds[0].counters()  # the outsider's join requests reached the members and were dropped there
    assert dropped.get("auth_rejected_unsigned" if outsider_key == "none" else "auth_rejected_unknown_key", 0) > 0
    if outsider_key == "none":
        # A group nobody has is not found, whatever this daemon heard before on other groups' addresses.
        lonely = outsider.rmp("join", "--existing", unique("lonely"), check=False, timeout=60)
        said = one_line(lonely.stderr)
        assert lonely.returncode != 0 and "join-failed" in said and "not found" in said, said
        assert "key" not in said and "verify" not in said, said


def forged_datagrams(view: str, src: str, kid: bytes, count: int) -> list[bytes]:
    """Well-formed Data packets of the live view, sealed under the group's real key ID with random MACs."""
    return [b"RA" + kid + encode(Data(ViewId.parse(view), src, 10**9 + i, QoS.TOTAL, None, b"forged %d" % i))
            + os.urandom(16) for i in range(count)]


def test_ten_thousand_forged_datagrams_are_dropped_counted_and_order_holds(daemons, tmp_path: Path) -> None:
    group = "forged"
    ds = keyed_group(daemons, keygen(tmp_path / "group.key"), group)
    status = ds[0].status()
    view, kid = status["groups"][0]["view"], bytes.fromhex(status["auth"]["key_id"])
    listeners = [start_listener(d, group, 600, tmp_path / f"listen-{d.name}.jsonl") for d in ds]
    senders = [subprocess.Popen([RMP, "--socket", str(d.socket), "send", group, "--stdin", "--qos", "total"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE) for d in ds[:2]]
    for prefix, sender in zip("ab", senders, strict=True):
        sender.stdin.write("".join(f"{prefix}{i}\n" for i in range(300)).encode())
        sender.stdin.close()

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    address = group_address(group)
    forged = forged_datagrams(view, ds[1].pid, kid, 10_000)
    for start in range(0, len(forged), 1000):
        for datagram in forged[start:start + 1000]:
            sock.sendto(datagram, address)
        sent = start + 1000  # let every daemon catch up, so no kernel buffer overflows and every one is counted
        wait_for(lambda n=sent: all(d.counters().get("auth_rejected_bad_mac", 0) >= n for d in ds), 30,
                 f"{sent} forged datagrams counted at every member", interval=0.05)
    sock.close()

    for sender in senders:
        assert sender.wait(120) == 0, sender.stderr.read()
    for proc in listeners:
        assert proc.wait(120) == 0
    for d in ds:
        counters = d.counters()
        assert counters["auth_rejected_bad_mac"] == 10_000
        assert counters["auth_rejected"] == 10_000
        assert counters.get("auth_verified", 0) > 0
    orders = []
    for d in ds:
        rows = [json.loads(line) for line in (tmp_path / f"listen-{d.name}.jsonl").read_text().splitlines()]
        orders.append([(r["src"], r["seq"], r["payload"]) for r in rows])
    assert orders[0] == orders[1] == orders[2]
    payloads = [p for _, _, p in orders[0]]
    assert sorted(payloads) == sorted([f"a{i}" for i in range(300)] + [f"b{i}" for i in range(300)])


async def test_an_encrypting_daemon_and_an_embedded_node_with_the_key_share_a_group(daemons, tmp_path: Path) -> None:
    import trio

    import rmpd

    key = keygen(tmp_path / "group.key")
    d = daemons(extra=["--auth-key", str(key), "--encrypt"])
    d.rmp("join", "sealed")
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client, rmpd.Node(interface="lo", port=0, auth_key=key,
                                                                 encrypt=True) as node:
            via_daemon = await client.join("sealed")
            embedded = await node.join("sealed", existing_only=True)
            await embedded.send(b"secret", qos=rmpd.QoS.SAFE)
            async for event in via_daemon:
                if isinstance(event, rmpd.Delivery):
                    assert (event.payload, event.source) == (b"secret", node.pid)
                    break
    status = d.status()
    assert status["auth"]["encrypt"] and status["counters"]["auth_verified"] > 0
    assert status["counters"].get("auth_rejected", 0) == 0


def captured(sock: socket.socket) -> list[tuple[bytes, str]]:
    """Every datagram the capture socket holds, with its sender's process ID."""
    got = []
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except BlockingIOError:
            return got
        got.append((data, f"{addr[0]}:{addr[1]}"))


def test_mixed_encrypt_settings_form_no_group_and_nothing_goes_out_in_clear(daemons, tmp_path: Path) -> None:
    """One daemon encrypts, two only sign, all with the same key: the two cannot join the encrypting daemon's group,
    and what reaches the group's multicast address is sealed; no message body is readable there."""
    key = keygen(tmp_path / "group.key")
    group = unique("mixed")
    capture = open_multicast(*group_address(group), "127.0.0.1")  # what anyone on the LAN sees of the group
    encrypting = daemons("encrypting", extra=["--auth-key", str(key), "--encrypt"])
    encrypting.rmp("join", group)
    signing = [daemons(f"signing{i}", extra=["--auth-key", str(key)], config=patient_join(tmp_path)) for i in (1, 2)]
    with Chatter(encrypting, group):  # "tick" every 0.1 s from the encrypting member
        for command in (["join", group], ["send", group, "plain words"]):  # each on both at once
            runs = [subprocess.Popen([RMP, "--socket", str(d.socket), *command], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for d in signing]
            for run in runs:
                _, stderr = run.communicate(timeout=60)
                said = one_line(stderr)
                assert run.returncode != 0
                assert "encryption-mismatch" in said and "is encrypted" in said and "--encrypt" in said, said
        assert all(d.status()["groups"] == [] for d in signing)
    datagrams = captured(capture)
    capture.close()

    assert encrypting.members(group) == [encrypting.pid]
    status = encrypting.status()
    assert status["auth"]["encrypt"]
    assert set(status["auth"]["mismatched_sources"]) == {d.pid for d in signing}  # their join requests
    assert status["counters"]["auth_rejected_encryption_mismatch"] > 0
    shown = one_line(encrypting.rmp("status").stdout)
    assert "group traffic encrypted" in shown and "refused: signed but not encrypted" in shown, shown
    from_encrypting = [data for data, src in datagrams if src == encrypting.pid]
    assert len(from_encrypting) > 10 and all(data[:2] == b"RE" for data in from_encrypting)
    assert not any(b"tick" in data or b"plain words" in data for data, _ in datagrams)
    for data, src in datagrams:  # the signing daemons sent only their (signed) join requests
        if src != encrypting.pid:
            assert src in {d.pid for d in signing}
            assert isinstance(decode(signed_body(data)), ListChangeRequest)


def test_an_encrypting_daemon_does_not_join_a_group_that_only_signs(daemons, tmp_path: Path) -> None:
    key = keygen(tmp_path / "group.key")
    group = unique("signed")
    signing = daemons("signing", extra=["--auth-key", str(key)])
    signing.rmp("join", group)
    encrypting = daemons("encrypting", extra=["--auth-key", str(key), "--encrypt"], config=patient_join(tmp_path))
    with Chatter(signing, group):
        result = encrypting.rmp("join", group, check=False, timeout=60)
    said = one_line(result.stderr)
    assert result.returncode != 0
    assert "encryption-mismatch" in said and "signed but not encrypted" in said, said
    status = encrypting.status()
    assert status["groups"] == [] and status["auth"]["encrypt"]
    assert signing.members(group) == [signing.pid]


async def test_an_embedded_node_without_the_key_is_told_the_group_needs_one(daemons, tmp_path: Path) -> None:
    import trio

    import rmpd

    d = daemons(extra=["--auth-key", str(keygen(tmp_path / "group.key"))])
    group = unique("keyed")
    d.rmp("join", group)
    with trio.fail_after(60):
        async with rmpd.Node(interface="lo", port=0,  # a 3 s join, which surely hears the group's Alives
                             config=EngineConfig(request_interval=0.2, join_retries=4)) as node:
            with pytest.raises(rmpd.RmpdError) as refused:
                await node.join(group)  # not only --existing: it must not found a second group beside the first
            assert refused.value.code == "auth-required", refused.value
            assert node.pid not in d.members(group)
