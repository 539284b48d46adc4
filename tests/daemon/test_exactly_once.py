"""Exactly once (README, "Exactly once"): a keyed message is delivered at most once in the group's one order, at
every member, however often it is sent; the sender hears either its Delivery or AlreadyDelivered, and resending
whatever it has not heard of (after Undelivered, a lost connection, its daemon killed and restarted) delivers each
key exactly once.  Real daemons on loopback.  A sender cut off into the minority by a real partition:
test_exactly_once_partition.py (namespace hosts, where the majority goes on without it)."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

import rmpd
from rmpd import localapi

from .harness import RMP, Daemon, unique, wait_for
from .test_client_library import FAST_NODE

QUICK_FAILURE = "[timers]\nrequest_interval = 0.1\njoin_retries = 3\nfail_after = 1.5\n"
"""Daemons that find a killed member gone in 1.5 s: the tests are about what the sender does next."""


def quick(daemons: Callable[..., Daemon], tmp_path: Path, name: str, **kwargs: object) -> Daemon:
    config = tmp_path / "quick-failure.toml"
    config.write_text(QUICK_FAILURE)
    return daemons(name, config=config, **kwargs)


def group_of_three(daemons: Callable[..., Daemon], tmp_path: Path, group: str,
                   min_partition: str = "1") -> list[Daemon]:
    """Three daemons that keep ``group`` (``rmp join``: a daemon restarted rejoins it by itself)."""
    members = [quick(daemons, tmp_path, name) for name in ("a", "b", "c")]
    members[0].rmp("join", group, "--min-partition", min_partition)
    wait_for(lambda: members[0].members(group) == [members[0].pid], 20, "a in a view of its own")
    for d in members[1:]:
        d.rmp("join", group, "--existing-only")
    wait_for(lambda: all(len(d.members(group)) == 3 for d in members), 30, "a view of three")
    return members


@dataclass
class Listener:
    """A program at one member that records the keys of what its group delivers, in order, until the marker."""

    group: rmpd.Group
    keys: list[bytes] = field(default_factory=list)

    async def until(self, marker: bytes) -> None:
        async for event in self.group:
            if isinstance(event, rmpd.Delivery):
                if event.payload == marker:
                    return
                if event.key is not None:
                    self.keys.append(event.key)
        raise AssertionError("the group ended")


async def mark_end(listeners: list[Listener], via: rmpd.Group) -> None:
    """Send an unkeyed marker after everything else, and read every listener up to it: any copy of a key the
    group delivered would be in what they read."""
    marker = b"end-" + unique("m").encode()
    await via.send(marker)
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(listener.until, marker)


# ----------------------------------------------------------------------------------------------------------------
# Refusals


def test_a_key_below_total_order_or_too_long_is_refused_with_bad_key(daemons) -> None:
    d = daemons()
    group = unique("refused")
    d.rmp("join", group)
    for fields in ({"qos": "source", "key": b"k"}, {"qos": "unordered", "key": b"k"},
                   {"qos": "total", "key": b"k" * (localapi.MAX_KEY + 1)}, {"key": b""}):
        reply = d.request("send", group=group, payload=b"x", **fields)
        assert reply["error"] == localapi.BAD_KEY, (fields, reply)
    reply = d.request("send_batch", group=group, payloads=[b"x", b"y"], keys=[b"k1", b"k2"], qos="source")
    assert reply["error"] == localapi.BAD_KEY
    assert d.request("send_batch", group=group, payloads=[b"x", b"y"], keys=[b"k1"])["error"] == "bad-request"
    assert d.request("send", group=group, payload=b"x", key=b"k" * localapi.MAX_KEY)["seq"] > 0

    async def through_the_library() -> None:
        async with rmpd.connect(d.socket) as client:
            handle = await client.join(group)
            for qos, key in ((rmpd.QoS.UNRELIABLE, b"k"), (rmpd.QoS.SOURCE, b"k"), (rmpd.QoS.TOTAL, b"k" * 256)):
                with pytest.raises(rmpd.RmpdError) as refused:
                    await handle.send(b"x", qos=qos, key=key)
                assert refused.value.code == localapi.BAD_KEY
                with pytest.raises(rmpd.RmpdError) as refused:
                    await handle.post(b"x", qos=qos, key=key)
                assert refused.value.code == localapi.BAD_KEY

    trio.run(through_the_library)
    result = d.rmp("send", group, "x", "--qos", "source", "--key-prefix", "p", check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "bad-key" in result.stderr, result.stderr


# ----------------------------------------------------------------------------------------------------------------
# The same key twice


async def test_the_same_key_twice_is_delivered_once_at_every_member_and_the_copy_is_told_already_delivered(
        daemons, tmp_path) -> None:
    group = unique("twice")
    members = group_of_three(daemons, tmp_path, group)
    with trio.fail_after(30):
        async with rmpd.connect(members[0].socket) as one, rmpd.connect(members[1].socket) as two, \
                rmpd.connect(members[2].socket) as three:
            sender = await one.join(group)
            listeners = [Listener(await two.join(group)), Listener(await three.join(group))]
            await sender.send(b"first", key=b"order-42")
            first = await next_of(sender, rmpd.Delivery)
            assert (first.payload, first.key, first.source) == (b"first", b"order-42", members[0].pid)
            await sender.send(b"again", key=b"order-42", qos=rmpd.QoS.SAFE)
            copy = await next_of(sender, rmpd.AlreadyDelivered)
            assert copy == rmpd.AlreadyDelivered(b"order-42", first.timestamp, first.view, group)
            # A copy sent from another member's daemon is dropped too, and told to that sender.
            await listeners[0].group.send(b"from b", key=b"order-42")
            listeners[0].keys.clear()
            assert (await next_of(listeners[0].group, rmpd.AlreadyDelivered)).timestamp == first.timestamp
            sender_seen = Listener(sender)
            await mark_end([*listeners, sender_seen], sender)
    assert listeners[1].keys == [b"order-42"] and sender_seen.keys == []
    for d in members:
        status = next(g for g in d.status()["groups"] if g["group"] == group)
        assert status["buffers"]["own_pending"] == 0  # a message told AlreadyDelivered is owed to nobody
    assert members[0].counters()["hub_already_delivered"] == 1


async def next_of(group: rmpd.Group, kind: type) -> object:
    """The group's next event of ``kind`` (deliveries and views before it are passed over)."""
    async for event in group:
        if isinstance(event, kind):
            return event
    raise AssertionError("the group ended")


# ----------------------------------------------------------------------------------------------------------------
# Post: identities, and Undelivered naming them


async def test_post_returns_each_messages_identity_and_undelivered_names_them(daemons, tmp_path) -> None:
    group = unique("posted")
    a, b = quick(daemons, tmp_path, "a"), quick(daemons, tmp_path, "b")
    a.rmp("join", group, "--min-partition", "majority")
    wait_for(lambda: a.members(group) == [a.pid], 20, "a in a view of its own")
    b.rmp("join", group, "--existing-only")
    wait_for(lambda: all(len(d.members(group)) == 2 for d in (a, b)), 30, "a view of two")
    async with rmpd.connect(b.socket) as client:
        handle = await client.join(group)
        posted: dict[bytes | int, bytes] = {}
        for payload, key, ident in ((b"plain-1", None, 1), (b"keyed", b"k-0", b"k-0"), (b"plain-3", None, 3)):
            assert await handle.post(payload, key=key) == ident
            posted[ident] = payload
        await handle.flush()
        # The other member stops: b alone is below its minimum, and what it posts meanwhile is not delivered here.
        a.proc.send_signal(signal.SIGSTOP)
        delivered: set[bytes | int] = set()
        undelivered: list[rmpd.Undelivered] = []
        refused: list[bytes | int] = []
        try:
            with trio.fail_after(60):
                async def stream() -> None:
                    n = 0
                    while True:
                        payload = b"p%d" % n
                        try:
                            ident = await handle.post(payload, key=b"k%d" % n if n % 2 else None)
                        except rmpd.RmpdError as exc:
                            assert exc.code == "not-member", exc
                            refused.extend(exc.refused)  # posts the group refused: neither delivered nor named
                            return
                        posted[ident] = payload
                        n += 1
                        await trio.sleep(0.01)  # paces the stream; waits for nothing

                async def read() -> None:
                    async for event in handle:
                        if isinstance(event, rmpd.Delivery) and event.source == b.pid:
                            delivered.add(event.key if event.key is not None else
                                          next((i for i, p in posted.items() if p == event.payload), event.payload))
                        elif isinstance(event, rmpd.Undelivered):
                            undelivered.append(event)
                        elif isinstance(event, rmpd.Rejoining):
                            return

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream)
                    nursery.start_soon(read)
        finally:
            a.proc.send_signal(signal.SIGCONT)
    named = [ident for event in undelivered for ident in event.ids]
    assert named, "nothing was cut off: the test saw no Undelivered"
    assert any(type(i) is int for i in named) and any(type(i) is bytes for i in named)
    assert len(named) == len(set(named)) and set(named) <= set(posted)
    assert not set(named) & delivered
    assert not set(refused) & (delivered | set(named)) and set(refused) <= set(posted)
    assert set(posted) == (delivered & set(posted)) | set(named) | set(refused)


# ----------------------------------------------------------------------------------------------------------------
# The CLI run twice


def start_listener(daemon: Daemon, group: str, out: Path) -> subprocess.Popen[bytes]:
    """`rmp listen --json` in the background, returned once it has joined (it says so on stderr)."""
    err = out.with_suffix(".err")
    proc = subprocess.Popen([RMP, "--socket", str(daemon.socket), "listen", group, "--json"],
                            stdout=out.open("wb"), stderr=err.open("wb"))
    wait_for(lambda: "listening on" in err.read_text() or proc.poll() is not None, 30, "the listener's join")
    assert proc.poll() is None, err.read_text()
    return proc


def listened(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]


def test_rmp_send_with_a_key_prefix_run_twice_delivers_each_line_once_at_every_member(daemons, tmp_path) -> None:
    group = unique("cli-twice")
    members = group_of_three(daemons, tmp_path, group)
    outs = [tmp_path / f"listen-{d.name}.jsonl" for d in members]
    listeners = [start_listener(d, group, out) for d, out in zip(members, outs, strict=True)]
    try:
        lines = "".join(f"{n}\n" for n in range(1, 51))
        runs = [json.loads(members[0].rmp("send", group, "--stdin", "--key-prefix", "run1", "--json",
                                          input=lines).stdout) for _ in range(2)]
        assert runs[0]["delivered"] + runs[0]["already_delivered"] == 50 and runs[0]["sent"] == 50
        assert runs[1] == {**runs[1], "sent": 50, "delivered": 0, "already_delivered": 50}
        members[1].rmp("send", group, "end")
        for out in outs:
            wait_for(lambda out=out: any(r.get("payload") == "end" for r in listened(out)), 30, "the marker")
    finally:
        for listener in listeners:
            listener.terminate()
    for out in outs:
        rows = [r for r in listened(out) if "key" in r]
        assert [r["key"] for r in rows] == [f"run1:{n}" for n in range(1, 51)]
        assert [r["payload"] for r in rows] == [str(n) for n in range(1, 51)]


# ----------------------------------------------------------------------------------------------------------------
# The sender's daemon killed and restarted


def restart(daemons: Callable[..., Daemon], tmp_path: Path, victim: Daemon) -> Daemon:
    """Kill ``victim`` with -9 and start it again with the same config, state directory and process ID (the
    state directory's record of the groups joined with ``rmp join`` is the process's: it rejoins them)."""
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    return quick(daemons, tmp_path, victim.name, port=int(victim.pid.rsplit(":", 1)[1]))


@dataclass
class Resender:
    """The program the README describes: it sends every message with its key, and sends again each one it has
    not seen delivered (its Delivery, or AlreadyDelivered) whenever it may have been lost: named by Undelivered,
    or unconfirmed when the connection to its daemon was lost (it reconnects first).  A send refused while its
    daemon rejoins the group is made again after the next view."""

    socket: Path
    group: str
    total: int
    accepted: int = 0
    unconfirmed: dict[bytes, bytes] = field(default_factory=dict)
    seen: list[list[bytes]] = field(default_factory=list)
    """The keys delivered at the sender's daemon, per connection (its restarted process too)."""
    connections: int = 0
    undelivered: int = 0
    """Messages named by Undelivered events."""
    already: int = 0
    """Messages told AlreadyDelivered."""
    views: int = 0
    new_view: trio.Event = field(default_factory=trio.Event)

    def key(self, n: int) -> bytes:
        return b"order-%d" % n

    async def run(self) -> None:
        self.unconfirmed = {self.key(n): b"payload %d" % n for n in range(self.total)}
        while self.unconfirmed:
            try:
                await self.session()
            except* rmpd.RmpdError as lost:  # ConnectionLost, or no daemon while it restarts
                assert all(exc.code in ("connection-lost", "no-daemon") for exc in leaves(lost)), lost
                await trio.sleep(0.1)  # the program's back-off between attempts to reach its daemon

    async def session(self) -> None:
        async with rmpd.connect(self.socket) as client:
            self.connections += 1
            handle = await client.join(self.group)
            seen: list[bytes] = []
            self.seen.append(seen)
            again: trio.MemorySendChannel[bytes]
            again, to_resend = trio.open_memory_channel[bytes](self.total)

            async def watch() -> None:
                async for event in handle:
                    if isinstance(event, rmpd.Delivery) and event.key is not None:
                        seen.append(event.key)
                        self.unconfirmed.pop(event.key, None)
                    elif isinstance(event, rmpd.AlreadyDelivered):
                        self.already += 1
                        self.unconfirmed.pop(event.key, None)
                    elif isinstance(event, rmpd.Undelivered):
                        self.undelivered += len(event.ids)
                        for key in event.ids:
                            again.send_nowait(key)  # type: ignore[arg-type]
                    elif isinstance(event, rmpd.ViewChange):
                        self.views += 1
                        self.new_view.set()
                        self.new_view = trio.Event()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                for key in list(self.unconfirmed):  # everything not seen delivered, in order
                    await self.send(handle, key)
                    self.accepted += 1
                while self.unconfirmed:
                    key: bytes | None = None
                    with trio.move_on_after(0.5):  # then looks again whether everything is confirmed
                        key = await to_resend.receive()
                    if key is not None:
                        await self.send(handle, key)
                nursery.cancel_scope.cancel()

    async def send(self, group: rmpd.Group, key: bytes) -> None:
        """Send the message of ``key`` unless it is confirmed; refused while the daemon rejoins, again once the
        view that follows is in (it comes after the refusal)."""
        while key in self.unconfirmed:
            waited = self.new_view
            try:
                await group.send(self.unconfirmed[key], key=key)
                return
            except rmpd.RmpdError as exc:
                if exc.code != "not-member":
                    raise
            await waited.wait()


def leaves(group: BaseExceptionGroup) -> list[BaseException]:
    return [leaf for exc in group.exceptions
            for leaf in (leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])]


async def test_a_program_resends_across_its_daemon_killed_and_restarted_and_each_key_is_delivered_once(
        daemons, tmp_path) -> None:
    group = unique("killed")
    a, b, c = group_of_three(daemons, tmp_path, group)
    total = 1000
    sender = Resender(c.socket, group, total)
    with trio.fail_after(45):
        async with rmpd.connect(a.socket) as at_a, rmpd.connect(b.socket) as at_b:
            listeners = [Listener(await at_a.join(group)), Listener(await at_b.join(group))]

            async def kill_halfway() -> None:
                while sender.accepted < total // 2:
                    await trio.sleep(0.01)  # polls the program's progress; the protocol is not waited for
                await trio.to_thread.run_sync(restart, daemons, tmp_path, c)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_halfway)
                nursery.start_soon(sender.run)
            await mark_end(listeners, listeners[0].group)
    expected = {sender.key(n) for n in range(total)}
    assert sender.connections >= 2, "the daemon was killed after the program had finished"
    for listener in listeners:
        assert len(listener.keys) == total and set(listener.keys) == expected
    assert listeners[0].keys == listeners[1].keys  # one order
    for seen in sender.seen:
        assert len(seen) == len(set(seen))  # the restarted daemon delivers no key twice either


def test_rmp_send_with_its_daemon_killed_halfway_then_run_again_delivers_each_line_once(daemons, tmp_path) -> None:
    group = unique("cli-killed")
    a, b, c = group_of_three(daemons, tmp_path, group)
    outs = [tmp_path / f"listen-{d.name}.jsonl" for d in (a, b)]
    listeners = [start_listener(d, group, out) for d, out in zip((a, b), outs, strict=True)]
    command = [RMP, "--socket", str(c.socket), "send", group, "--stdin", "--key-prefix", "run1", "--json"]
    try:
        first = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert first.stdin is not None
        first.stdin.write("".join(f"{n}\n" for n in range(1, 301)).encode())
        first.stdin.flush()
        wait_for(lambda: len(listened(outs[0])) >= 150, 30, "half of the lines delivered")
        restart(daemons, tmp_path, c)
        first.stdin.write("".join(f"{n}\n" for n in range(301, 501)).encode())
        first.stdin.close()
        assert first.wait(60) == 0, first.stderr.read().decode()  # type: ignore[union-attr]
        again = subprocess.run(command, input="".join(f"{n}\n" for n in range(1, 501)).encode(), capture_output=True,
                               timeout=60)
        assert again.returncode == 0, again.stderr.decode()
        assert json.loads(again.stdout)["already_delivered"] == 500
        a.rmp("send", group, "end")
        for out_path in outs:
            wait_for(lambda out_path=out_path: any(r.get("payload") == "end" for r in listened(out_path)), 30,
                     "the marker")
    finally:
        for listener in listeners:
            listener.terminate()
    for out_path in outs:
        rows = [r for r in listened(out_path) if "key" in r]
        assert sorted(r["key"] for r in rows) == sorted(f"run1:{n}" for n in range(1, 501))
    assert [r["key"] for r in listened(outs[0]) if "key" in r] == [r["key"] for r in listened(outs[1]) if "key" in r]


# ----------------------------------------------------------------------------------------------------------------
# An embedded node keeps the same promises


async def test_an_embedded_node_delivers_a_key_once_and_tells_its_program_already_delivered(
        loopback_multicast) -> None:
    async with rmpd.Node(interface="lo", port=0, config=FAST_NODE) as node:
        group = await node.join(unique("node-keys"))
        with trio.fail_after(20):
            await group.send(b"first", key=b"k1")
            assert await group.post(b"second", key=b"k1", qos=rmpd.QoS.SAFE) == b"k1"
            assert await group.post(b"plain") == 2  # the node numbers posts as a daemon connection does
            await group.flush()
            first = await next_of(group, rmpd.Delivery)
            assert (first.payload, first.key) == (b"first", b"k1")
            assert await next_of(group, rmpd.AlreadyDelivered) == rmpd.AlreadyDelivered(b"k1", first.timestamp,
                                                                                         first.view, group.name)
            plain = await next_of(group, rmpd.Delivery)
            assert (plain.payload, plain.key) == (b"plain", None)
        with pytest.raises(rmpd.RmpdError) as refused:
            await group.send(b"x", qos=rmpd.QoS.SOURCE, key=b"k2")
        assert refused.value.code == localapi.BAD_KEY


def test_rmp_listen_json_shows_a_key_as_text_or_as_base64(daemons, tmp_path) -> None:
    d = daemons()
    group = unique("listen-keys")
    out = tmp_path / "listen.jsonl"
    listener = start_listener(d, group, out)
    try:
        for prefix in (b"run1", b"caf\xe9"):  # the second is not UTF-8: its key is shown as key_b64
            sent = subprocess.run([RMP.encode(), b"--socket", bytes(d.socket), b"send", group.encode(), b"x",
                                   b"--key-prefix", prefix], capture_output=True, timeout=60)
            assert sent.returncode == 0, sent.stderr.decode(errors="replace")
        d.rmp("send", group, "end")
        wait_for(lambda: any(r.get("payload") == "end" for r in listened(out)), 30, "the marker")
    finally:
        listener.terminate()
    rows = listened(out)
    assert rows[0]["key"] == "run1:1" and "key_b64" not in rows[0]
    assert base64.b64decode(rows[1]["key_b64"]) == b"caf\xe9:1" and "key" not in rows[1]
    assert "key" not in rows[2] and "key_b64" not in rows[2]

