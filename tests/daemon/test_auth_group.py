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

from rmpd.protocol.ids import ViewId
from rmpd.protocol.naming import group_address
from rmpd.protocol.packets import Data, encode
from rmpd.protocol.qos import QoS

from .harness import RMP, RMPD, Daemon, wait_for
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


@pytest.mark.parametrize("outsider_key", ["none", "another"])
def test_a_daemon_without_the_group_key_cannot_enter(daemons, tmp_path: Path, outsider_key: str) -> None:
    ds = keyed_group(daemons, keygen(tmp_path / "group.key"), "secure")
    view = ds[0].status()["groups"][0]["view"]
    extra = ["--auth-key", str(keygen(tmp_path / "other.key"))] if outsider_key == "another" else []
    # The outsider's join lasts about 3 s (not the suite's 0.7 s), so the chatter's traffic (ten messages and three
    # Alives a second) surely reaches it.
    patient = tmp_path / "patient-join.toml"
    patient.write_text("[timers]\nrequest_interval = 0.2\njoin_retries = 4\n")
    outsider = daemons("outsider", extra=extra, config=patient)
    with Chatter(ds[0], "secure"):
        started = time.monotonic()
        result = outsider.rmp("join", "secure", "--existing", check=False, timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < 30
    assert "join-failed" in result.stderr and "could not verify" in result.stderr, result.stderr
    assert all(len(d.members("secure")) == 3 and d.status()["groups"][0]["view"] == view for d in ds)
    assert outsider.status()["groups"] == []
    seen = outsider.status()
    assert set(seen["auth"]["unverified_sources"]) & {d.pid for d in ds}
    reason = "auth_unverifiable" if outsider_key == "none" else "auth_rejected_unknown_key"
    assert seen["counters"][reason] > 0
    dropped = ds[0].counters()  # the outsider's join requests reached the members and were dropped there
    assert dropped.get("auth_rejected_unsigned" if outsider_key == "none" else "auth_rejected_unknown_key", 0) > 0


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
