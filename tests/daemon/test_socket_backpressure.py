"""The runtime's sender on a real link with a rate: a full socket is back-pressure, never a dropped datagram, and a
control datagram overtakes the data waiting behind it.

Two network-namespace hosts (scripts/netns) with every link at 1 Mb/s (tbf, a queue deep enough to drop nothing):
host 1 hands 120 datagrams of 1,000 bytes of data to a ``DatagramSender`` whose socket has the smallest send
buffer, then one control datagram, and host 2 records the order they arrive in.  Needs root (as in CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NETNS = str(ROOT / "scripts" / "netns")
DATA = 120
PORT = 47123

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs this as root)")

RECEIVER = f"""
import json, socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
sock.bind(("10.77.0.2", {PORT}))
sock.settimeout(30)
print("ready", flush=True)
order = []
while len(order) < {DATA + 1}:
    data, _ = sock.recvfrom(65535)
    order.append(data[:1].decode())
print(json.dumps(order), flush=True)
"""

SENDER = f"""
import json, socket
from collections import Counter
import trio
from rmpd.runtime.sockets import DatagramSender

async def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.bind(("10.77.0.1", 0))
    sock.setblocking(False)
    stats = Counter()
    sender = DatagramSender(sock, stats)
    busy = []
    sender.on_busy = busy.append
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.flush_forever)
        for _ in range({DATA}):
            sender.send(b"d" * 1000, ("10.77.0.2", {PORT}), bulk=True)
        waiting = len(sender.waiting_data)
        sender.send(b"c" * 40, ("10.77.0.2", {PORT}))
        with trio.fail_after(30):
            while sender.waiting_data or sender.waiting_control:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    print(json.dumps({{"stats": dict(stats), "waiting": waiting, "busy": busy}}), flush=True)

trio.run(main)
"""


@pytest.fixture
def hosts():
    env = {**os.environ, "RMP_NETNS_PREFIX": f"rmps{os.getpid() % 1000}x"}
    subprocess.run([NETNS, "up", "2"], check=True, env=env, capture_output=True)
    try:
        subprocess.run([NETNS, "rate", "1mbit"], check=True, env=env, capture_output=True)
        yield env["RMP_NETNS_PREFIX"]
    finally:
        subprocess.run([NETNS, "down"], env=env, check=False, capture_output=True)


def test_a_full_socket_holds_data_and_lets_control_go_first(hosts: str) -> None:
    receiver = subprocess.Popen(["ip", "netns", "exec", f"{hosts}2", sys.executable, "-c", RECEIVER],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready", receiver.stderr.read() if receiver.stderr else ""
        sent = subprocess.run(["ip", "netns", "exec", f"{hosts}1", sys.executable, "-c", SENDER],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert sent.returncode == 0, sent.stderr
        report = json.loads(sent.stdout.strip().splitlines()[-1])
        out, err = receiver.communicate(timeout=40)
        assert receiver.returncode == 0, err
    finally:
        if receiver.poll() is None:
            receiver.kill()
    order = json.loads(out.strip().splitlines()[-1])
    stats = report["stats"]
    assert report["waiting"] > 10  # the socket refused most of it at once: it waited in the sender
    assert stats.get("send_dropped", 0) == 0 and stats.get("send_errors", 0) == 0
    assert stats["datagrams_sent"] == DATA + 1 and order.count("d") == DATA  # nothing lost
    assert order.index("c") < DATA - 10  # the control datagram went ahead of the data still waiting
    assert report["busy"] == [True, False]  # the process is told once each way
