"""Three real daemons on loopback form one ring over real UDP multicast and deliver one total order."""

from __future__ import annotations

import json
import random
import socket
import subprocess
from pathlib import Path

from rmpd.protocol.naming import group_address

from .harness import RMP, wait_for


def start_listener(daemon, group: str, count: int, out: Path) -> subprocess.Popen[bytes]:
    """`rmp listen --json` in the background; returns once its join is done (it says so on stderr)."""
    err = out.with_suffix(".err")
    proc = subprocess.Popen([RMP, "--socket", str(daemon.socket), "listen", group, "--count", str(count), "--json"],
                            stdout=out.open("wb"), stderr=err.open("wb"))
    wait_for(lambda: "listening on" in err.read_text() or proc.poll() is not None, 30, f"listener at {daemon.name}")
    assert proc.poll() is None, err.read_text()
    return proc


def test_three_daemons_deliver_two_senders_in_one_identical_order(daemons, tmp_path: Path) -> None:
    ds = [daemons() for _ in range(3)]
    for d in ds:
        d.rmp("join", "order")
    wait_for(lambda: all(len(d.members("order")) == 3 for d in ds), 20, "a three-member view at every daemon")
    listeners = [start_listener(d, "order", 2000, tmp_path / f"listen-{d.name}.jsonl") for d in ds]
    senders = [
        subprocess.Popen([RMP, "--socket", str(d.socket), "send", "order", "--stdin", "--qos", "total"],
                         stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        for d in ds[:2]
    ]
    for prefix, sender in zip("ab", senders, strict=True):  # both send at once: lines fit in the pipe buffer
        sender.stdin.write("".join(f"{prefix}{i}\n" for i in range(1000)).encode())
        sender.stdin.close()
    for sender in senders:
        assert sender.wait(120) == 0, sender.stderr.read()
    for proc in listeners:
        assert proc.wait(120) == 0

    sequences = []
    for d in ds:
        rows = [json.loads(line) for line in (tmp_path / f"listen-{d.name}.jsonl").read_text().splitlines()]
        sequences.append([(r["src"], r["seq"], r["ts"], r["payload"]) for r in rows])
        assert {r["qos"] for r in rows} == {"total"}
    assert sequences[0] == sequences[1] == sequences[2]
    payloads = [p for _, _, _, p in sequences[0]]
    assert len(payloads) == len(set(payloads)) == 2000
    assert [p for p in payloads if p[0] == "a"] == [f"a{i}" for i in range(1000)]
    assert [p for p in payloads if p[0] == "b"] == [f"b{i}" for i in range(1000)]
    timestamps = [ts for _, _, ts, _ in sequences[0]]
    assert timestamps == sorted(timestamps)
    sources = {src for src, _, _, _ in sequences[0]}
    assert sources == {ds[0].pid, ds[1].pid}


def dropped(counters: dict[str, int]) -> int:
    """Hostile datagrams counted: undecodable ones, and (a random datagram starting "RA" or "RE") sealed-looking
    ones this keyless daemon cannot verify."""
    return counters.get("malformed", 0) + counters.get("auth_unverifiable", 0)


def test_random_datagrams_at_every_port_are_counted_and_dropped(daemons) -> None:
    d = daemons()
    d.rmp("join", "fuzz")
    before = d.counters()
    group_ip, group_port = group_address("fuzz")
    ip, port = d.pid.split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    rng = random.Random(10_000)
    targets = [(ip, int(port)), (group_ip, group_port)]
    sent = 0
    for batch in range(100):
        for i in range(100):
            size = rng.choice([0, 1, 2, 3, 4, 5, 16, 100, 1400, rng.randrange(0, 9000)])
            data = rng.randbytes(size)
            if i % 10 == 0 and size >= 4:
                data = b"RM\x01" + data[3:]  # a valid header on hostile contents
            sock.sendto(data, targets[(batch + i) % 2])
            sent += 1
        if batch % 25 == 24:  # let the daemon catch up, so the kernel's receive buffer never overflows
            wait_for(lambda n=sent: dropped(d.counters()) - dropped(before) >= n, 20,
                     f"{sent} malformed datagrams counted", interval=0.05)
    after = wait_for(lambda: dropped(c := d.counters()) - dropped(before) >= 10_000 and c,
                     20, "10,000 malformed datagrams counted")
    received = sum(after.get(k, 0) - before.get(k, 0)
                   for k in ("datagrams_received_unicast", "datagrams_received_multicast"))
    own_alives = after.get("own_echo", 0) - before.get("own_echo", 0)  # its own Alives, looped back each second
    assert received - own_alives == 10_000
    assert dropped(after) - dropped(before) == 10_000
    assert d.proc.poll() is None
    assert d.members("fuzz") == [d.pid]
    d.rmp("send", "fuzz", "still alive")


def test_a_member_that_cannot_receive_multicast_gets_unicast_copies(daemons, tmp_path: Path) -> None:
    no_multicast = tmp_path / "no-multicast.toml"
    no_multicast.write_text("multicast = false\n[timers]\nrequest_interval = 0.1\njoin_retries = 3\n")
    a = daemons()
    b = daemons(config=no_multicast)
    a.rmp("join", "uni")
    b.rmp("join", "uni", "--existing-only")
    view = a.rmp_json("members", "uni")
    assert view["members"] == [a.pid, b.pid]
    assert a.rmp("members", "uni").stdout.count("(unicast only)") == 1
    listener = start_listener(b, "uni", 3, tmp_path / "uni.jsonl")
    for text, qos in (("one", "total"), ("two", "safe"), ("three", "source")):
        a.rmp("send", "uni", text, "--qos", qos)
    assert listener.wait(60) == 0
    rows = [json.loads(line) for line in (tmp_path / "uni.jsonl").read_text().splitlines()]
    assert [(r["payload"], r["qos"]) for r in rows] == [("one", "total"), ("two", "safe"), ("three", "source")]
    counters = b.counters()
    assert counters.get("datagrams_received_multicast", 0) == 0
    assert counters["datagrams_received_unicast"] > 0
