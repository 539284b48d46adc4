"""State transfer (rmpd.client.state): a joiner's state plus the deliveries after it equal what the old members have,
through embedded nodes and through daemons, with members writing at full rate and a provider killed mid-transfer."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import pytest
import trio

import rmpd
import rmpd.client.state
from rmpd.client.events import Event
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.view import LIBRARY_HANDLER

from .harness import Daemon, unique

NODE = EngineConfig(request_interval=0.05, join_retries=2, fail_after=1.5)
"""Groups formed at once and a killed member noticed in 1.5 s: the test is about the transfer, not the timers."""

BLOB = 4 * 1024 * 1024
"""Bytes of the replicated dictionary's largest value: the state is large enough to be sent in many chunks."""

CHUNK = 32 * 1024

DAEMON_CONFIG = "[timers]\nrequest_interval = 0.1\njoin_retries = 3\nfail_after = 1.5\n"


@dataclass
class Replica:
    """A replicated dictionary: each delivery sets one key, and counts and chains what was applied; a State
    replaces the whole."""

    group: rmpd.Group
    data: dict[str, object] = field(default_factory=dict)
    states: list[rmpd.State] = field(default_factory=list)
    applied: int = 0
    batched: bool = False
    """Read with ``Group.batches()`` instead of iterating the group."""

    def snapshot(self) -> bytes:
        return msgpack.packb(self.data)

    async def run(self) -> None:
        with contextlib.suppress(rmpd.RmpdError):
            if self.batched:
                async for batch in self.group.batches():
                    for event in batch:
                        self.apply(event)
            else:
                async for event in self.group:
                    self.apply(event)

    def apply(self, event: Event) -> None:
        if isinstance(event, rmpd.State):
            self.states.append(event)
            if event.data is not None:  # None: alone in the group, the program's own state stands
                self.data = msgpack.unpackb(event.data)
        elif isinstance(event, rmpd.Delivery):
            key, value = msgpack.unpackb(event.payload)
            self.data[key] = value
            # Not idempotent, and order-sensitive: a cut one delivery off, or a delivery out of order, shows.
            self.data["applied"] = self.data.get("applied", 0) + 1
            self.data["chain"] = hashlib.blake2b(self.data.get("chain", b"") + event.payload, digest_size=8).digest()
            self.applied += 1


async def write(group: rmpd.Group, writer: str, stop: trio.Event, progress: dict[str, int]) -> None:
    """Set keys as fast as the group accepts them, one after the other, until ``stop``; ``progress[writer]``: the
    writes made so far."""
    count = 0
    while not stop.is_set():
        await group.send(msgpack.packb([f"{writer}-{count % 50}", count]))
        count += 1
        progress[writer] = count


async def wait_until(condition: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.01)
        return
    pytest.fail(f"timed out after {timeout} s: {what()}")


@dataclass
class Member:
    kill: Callable[[], None] = lambda: None
    pid: str = ""


async def start_member(nursery: trio.Nursery, start_daemon: Callable[[], Daemon] | None, name: str, *,
                       blob: bool = False, settled: bool = True, batched: bool = False,
                       shared: Daemon | None = None) -> tuple[Replica, Member]:
    """A program in the group, on an embedded node, on a daemon of its own, or connected to the ``shared`` daemon,
    with a replica that asked for the state and provides it (``start_daemon`` and ``shared`` None: on a node);
    returned once it has its state, or just joined (``settled`` False); ``batched``: it reads with
    ``Group.batches()``.  ``member.kill()`` crashes its process: the node without a leave, its own daemon with
    SIGKILL (a program of a shared daemon closes its connection)."""
    ready = trio.Event()
    member = Member()
    holder: list[Replica] = []

    async def serve(client: rmpd.Client | rmpd.Node, pid: str) -> None:
        group = await client.join(name, state=True)
        replica = Replica(group, batched=batched)
        if blob:
            replica.data["blob"] = b"x" * BLOB
        group.provide_state(replica.snapshot, chunk_size=CHUNK)
        holder.append(replica)
        member.pid = pid
        async with trio.open_nursery() as reading:
            reading.start_soon(replica.run)
            if settled:
                await wait_until(lambda: bool(replica.states), 30, lambda: f"no state at {pid}")
            ready.set()
            await trio.sleep_forever()

    async def on_node() -> None:
        with trio.CancelScope() as scope:
            member.kill = scope.cancel
            async with rmpd.Node(interface="lo", port=0, config=NODE) as node:
                await serve(node, node.pid)

    async def on_daemon() -> None:
        assert start_daemon is not None
        daemon = await trio.to_thread.run_sync(start_daemon)
        member.kill = daemon.proc.kill
        with contextlib.suppress(rmpd.RmpdError):
            async with rmpd.connect(daemon.socket) as client:
                await serve(client, daemon.pid)

    async def on_shared() -> None:
        assert shared is not None
        with trio.CancelScope() as scope, contextlib.suppress(rmpd.RmpdError):
            member.kill = scope.cancel
            async with rmpd.connect(shared.socket) as client:
                await serve(client, shared.pid)

    nursery.start_soon(on_shared if shared is not None else on_node if start_daemon is None else on_daemon)
    await ready.wait()
    return holder[0], member


async def test_a_joiner_gets_the_state_then_what_follows_through_embedded_nodes(loopback_multicast) -> None:
    name = unique("st-basic")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            first, first_member = await start_member(nursery, None, name, blob=True)
            await first.group.send(msgpack.packb(["a", 1]))
            await wait_until(lambda: first.data.get("a") == 1, 10, lambda: str(first.data.keys()))
            assert [s.data for s in first.states] == [None]  # alone: it starts the state
            joiner, _ = await start_member(nursery, None, name)
            await first.group.send(msgpack.packb(["b", 2]))
            await wait_until(lambda: joiner.data.get("b") == 2, 20,
                             lambda: f"joiner has {sorted(joiner.data)} after {joiner.states}")
            assert [s.provider for s in joiner.states] == [first_member.pid]
            assert joiner.data == first.data
            with pytest.raises(rmpd.RmpdError, match="library"):  # the library's own messages are not a program's
                await joiner.group.send(b"x", handler=LIBRARY_HANDLER)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("backend", ["node", "daemon"])
async def test_replicas_end_equal_while_three_write_two_join_and_the_sender_is_killed(
        loopback_multicast, daemons, tmp_path, backend: str) -> None:
    name = unique("st-kv")
    config = tmp_path / "state.toml"
    config.write_text(DAEMON_CONFIG)
    names = itertools.count()
    start_daemon = None if backend == "node" else lambda: daemons(f"m{next(names)}", config=config)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            # The old members read in batches, the joiners one event at a time: both ways of reading are cut alike.
            writers = [await start_member(nursery, start_daemon, name, blob=index == 0, batched=True)
                       for index in range(3)]
            written: dict[str, int] = {}
            stop, flushed = trio.Event(), trio.Semaphore(0)

            async def writing(index: int, replica: Replica) -> None:
                with contextlib.suppress(rmpd.RmpdError):
                    await write(replica.group, f"w{index}", stop, written)
                flushed.release()

            for index, (replica, _) in enumerate(writers):
                nursery.start_soon(writing, index, replica)
            sent_before = {m.pid: r.group.statistics().state_chunks_sent for r, m in writers}
            joining = [start_member(nursery, start_daemon, name, settled=False) for _ in range(2)]
            joiners: list[tuple[Replica, Member]] = []

            async def join_one(start: Awaitable[tuple[Replica, Member]]) -> None:
                joiners.append(await start)

            async with trio.open_nursery() as joins:
                for start in joining:
                    joins.start_soon(join_one, start)
                # The first old member seen sending chunks is killed mid-transfer.
                killed = None
                with trio.move_on_after(30):
                    while killed is None:
                        killed = next((m for r, m in writers if 0 < r.group.statistics().state_chunks_sent
                                       - sent_before[m.pid] < BLOB // CHUNK), None)
                        await trio.sleep(0.001)
                assert killed is not None, "no old member sent state chunks"
                killed.kill()
            survivors = [(r, m) for r, m in writers if m is not killed]
            # A joiner not admitted at once founds the group alone (no state) and merges: it is given the state then.
            await wait_until(lambda: all(r.states and r.states[-1].data is not None for r, _ in joiners), 30,
                             lambda: f"states {[[(s.provider, s.view) for s in r.states] for r, _ in joiners]}")
            stop.set()
            for _ in writers:
                await flushed.acquire()
            live = [r for r, _ in survivors + joiners]
            last = {f"{w}-{(count - 1) % 50}": count - 1 for w, count in written.items()
                    if w in {f"w{i}" for i, (_, m) in enumerate(writers) if m is not killed}}
            await wait_until(lambda: all(r.data.get(key) == value for r in live for key, value in last.items()), 60,
                             lambda: f"last writes {last}; " + "; ".join(
                                 f"{r.applied} applied, {[r.data.get(key) for key in last]}" for r in live))
            reference = survivors[0][0].data
            assert all(r.data == reference for r in live)
            providers = {s.provider for r, _ in joiners for s in r.states}
            assert providers - {killed.pid}, f"every joiner's state came from the killed member: {providers}"
            nursery.cancel_scope.cancel()


async def test_a_64_mib_state_reaches_a_joiner_whole(loopback_multicast) -> None:
    name = unique("st-large")
    state = bytes(range(256)) * (64 * 1024 * 1024 // 256)
    with trio.fail_after(60):
        async with rmpd.Node(interface="lo", port=0, config=NODE) as old, \
                rmpd.Node(interface="lo", port=0, config=NODE) as new:
            provider = await old.join(name)
            provider.provide_state(lambda: state)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain, provider)
                joiner = await new.join(name, state=True)
                first = await joiner.__anext__()
                assert isinstance(first, rmpd.State) and first.provider == old.pid
                assert first.data == state
                nursery.cancel_scope.cancel()


async def drain(group: rmpd.Group) -> None:
    async for _ in group:
        pass


async def test_a_joiner_whose_only_provider_dies_mid_transfer_is_told_state_unavailable(
        loopback_multicast, monkeypatch) -> None:
    monkeypatch.setattr(rmpd.client.state, "STATE_TIMEOUT", 1.0)
    name = unique("st-gone")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            provider, member = await start_member(nursery, None, name, blob=True)
            async with rmpd.Node(interface="lo", port=0, config=NODE) as new:
                joiner = await new.join(name, state=True)
                await wait_until(lambda: provider.group.statistics().state_chunks_sent > 0, 10, lambda: "no chunk")
                member.kill()
                with pytest.raises(rmpd.RmpdError) as error:
                    await joiner.__anext__()
                assert error.value.code == "state-unavailable"
                with pytest.raises(rmpd.RmpdError):  # it left the group: a state it cannot have, it cannot follow
                    await joiner.send(b"x")
            nursery.cancel_scope.cancel()


def operations_example() -> dict[str, object]:
    """The replicated dictionary of docs/operations.md, "State transfer", as written there."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = text[text.index("## State transfer"):]
    code = section[section.index("```python") + len("```python"):]
    namespace: dict[str, object] = {"__name__": "kv_example"}
    exec(compile(code[:code.index("```")], "operations.md", "exec"), namespace)
    return namespace


async def test_the_replicated_dictionary_of_the_docs_gives_a_joiner_the_keys_set_before_it(loopback_multicast) -> None:
    replicated_dict = operations_example()["ReplicatedDict"]
    name = unique("st-docs")
    with trio.fail_after(30):
        async with rmpd.Node(interface="lo", port=0, config=NODE) as a, \
                rmpd.Node(interface="lo", port=0, config=NODE) as b, trio.open_nursery() as nursery:
            old, new = replicated_dict(), replicated_dict()  # type: ignore[operator]
            nursery.start_soon(old.follow, await a.join(name, state=True))
            writer = await a.join(name)
            for key in range(100):
                await writer.send(msgpack.packb([str(key), "before"]))
            nursery.start_soon(new.follow, await b.join(name, state=True))
            await writer.send(msgpack.packb(["last", "after"]))
            await wait_until(lambda: new.data.get("last") == "after", 20, lambda: f"{len(new.data)} keys")
            assert new.data == old.data and len(new.data) == 101
            nursery.cancel_scope.cancel()


def operations_example_source(group: str) -> str:
    """The replicated dictionary of docs/operations.md as a program file, joining ``group`` instead of "kv" (daemons
    on loopback hear every test run's groups of one name)."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = text[text.index("## State transfer"):]
    code = section[section.index("```python") + len("```python"):]
    return code[:code.index("```")].replace('client.join("kv"', f"client.join({group!r}")


class Program:
    """A client program run as its own process, its output read line by line."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            self.lines += [line.decode() for line in done]


async def run_program(nursery: trio.Nursery, script: Path, daemon: Daemon, *args: str) -> Program:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-u", str(script), *args], stdout=subprocess.PIPE,
        env={**os.environ, "RMPD_SOCKET": str(daemon.socket)})
    program = Program(process)
    nursery.start_soon(program.read)
    return program


async def test_the_docs_dictionary_as_programs_on_one_daemon_each_take_the_others_state(
        daemons, tmp_path) -> None:
    """The second program attached to a daemon already in the group is not alone: it gets the first one's state,
    and so does the third, whichever of the two provides it."""
    name = unique("st-one-daemon")
    script = tmp_path / "kv.py"
    script.write_text(operations_example_source(name))
    daemon = daemons("kv")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            programs: list[Program] = []
            try:
                for index, (key, value) in enumerate([("a", "1"), ("b", "2"), ("c", "3")]):
                    programs.append(await run_program(nursery, script, daemon, key, value))
                    # Every program so far prints the new key with every key set so far: a program that started
                    # from no state would print fewer.
                    line = f"{key} = {value}  ({index + 1} keys)"
                    await wait_until(lambda line=line: all(p.lines and p.lines[-1] == line for p in programs), 20,
                                     lambda line=line: f"expected {line!r} from each: {[p.lines for p in programs]}")
            finally:
                for program in programs:
                    program.process.kill()
            nursery.cancel_scope.cancel()


async def test_three_programs_on_one_daemon_and_two_on_another_end_equal_under_full_rate_writes(
        daemons, tmp_path) -> None:
    """Each program (a connection of its own) is a participant: the ones attached to a daemon already in the group
    are cut at their own request, with writers on both daemons at full rate meanwhile."""
    name = unique("st-shared")
    config = tmp_path / "state.toml"
    config.write_text(DAEMON_CONFIG)
    first, second = daemons("s1", config=config), daemons("s2", config=config)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            written: dict[str, int] = {}
            stop, flushed = trio.Event(), trio.Semaphore(0)
            writers = 0

            async def writing(writer: str, replica: Replica) -> None:
                with contextlib.suppress(rmpd.RmpdError):
                    await write(replica.group, writer, stop, written)
                flushed.release()

            replicas: list[Replica] = []
            # On s1: the first program starts the state and writes; the next two join while it writes (the second
            # writes too, once in); then s2 joins with two programs, the first of which writes.
            for index, (daemon, writes) in enumerate([(first, True), (first, True), (first, False),
                                                      (second, True), (second, False)]):
                replica, _ = await start_member(nursery, None, name, batched=index % 2 == 0, shared=daemon)
                replicas.append(replica)
                if writes:
                    writers += 1
                    nursery.start_soon(writing, f"w{index}", replica)
                await wait_until(lambda writers=writers: len(written) == writers and all(written.values()), 10,
                                 lambda: f"writes so far {written}")
            assert [s.data is None for s in replicas[0].states] == [True]  # alone: it started the state
            assert all(r.states and r.states[-1].data is not None for r in replicas[1:])
            going_on = sum(written.values()) + 300  # the writers go on after the last join, then stop
            await wait_until(lambda: sum(written.values()) >= going_on, 20, lambda: f"writes so far {written}")
            stop.set()
            for _ in range(writers):
                await flushed.acquire()
            last = {f"{w}-{(count - 1) % 50}": count - 1 for w, count in written.items()}
            await wait_until(lambda: all(r.data.get(key) == value for r in replicas for key, value in last.items()),
                             30, lambda: f"last writes {last}; " + "; ".join(
                                 f"{r.applied} applied, {[r.data.get(key) for key in last]}" for r in replicas))
            reference = replicas[0].data
            assert reference["applied"] == sum(written.values())
            assert all(r.data == reference for r in replicas), [
                (r.data.get("applied"), len(r.data)) for r in replicas]
            nursery.cancel_scope.cancel()


async def test_a_program_that_leaves_mid_transfer_while_its_daemon_stays_is_followed_by_the_next_offer(
        daemons, tmp_path) -> None:
    """Two programs of one daemon provide the state; the one sending it to a joiner on another daemon closes its
    connection mid-transfer.  The view does not change, yet the other program sends the state, as when a member
    leaves the view."""
    name = unique("st-program-gone")
    config = tmp_path / "state.toml"
    config.write_text(DAEMON_CONFIG)
    shared, other = daemons("s1", config=config), daemons("s2", config=config)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            providers = [await start_member(nursery, None, name, blob=True, shared=shared) for _ in range(2)]
            sent_before = [r.group.statistics().state_chunks_sent for r, _ in providers]
            await providers[0][0].group.send(msgpack.packb(["a", 1]))
            joiner, _ = await start_member(nursery, None, name, settled=False, shared=other)
            sending = None
            with trio.move_on_after(20):
                while sending is None:
                    sending = next((index for index, (r, _) in enumerate(providers)
                                    if 0 < r.group.statistics().state_chunks_sent - sent_before[index] < BLOB // CHUNK),
                                   None)
                    await trio.sleep(0.001)
            assert sending is not None, "no provider sent state chunks"
            providers[sending][1].kill()
            survivor = providers[1 - sending][0]
            await wait_until(lambda: bool(joiner.states), 20, lambda: "the joiner has no state")
            assert joiner.states[0].data is not None
            await survivor.group.send(msgpack.packb(["b", 2]))
            await wait_until(lambda: joiner.data.get("b") == 2 and survivor.data.get("b") == 2, 10,
                             lambda: f"joiner {sorted(joiner.data)}, survivor {sorted(survivor.data)}")
            assert joiner.data == survivor.data and joiner.data["a"] == 1
            nursery.cancel_scope.cancel()
