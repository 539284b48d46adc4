"""Groups that heal themselves, with real rmpd processes on loopback: daemons told to join at the same moment end in
one view, and a quiet group drops a member killed with -9 within ``fail_after`` and a second (docs/protocol.md,
"Healing")."""

from __future__ import annotations

import signal
import subprocess
import time

import trio

import rmpd
from rmpd.protocol.config import EngineConfig

from .harness import RMP, unique, wait_for


def test_three_daemons_told_to_join_at_the_same_moment_end_in_one_view(daemons) -> None:
    group = unique("together")
    ds = [daemons() for _ in range(3)]
    joins = [subprocess.Popen([RMP, "--socket", str(d.socket), "join", group], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for d in ds]
    for join in joins:
        out, _ = join.communicate(timeout=60)
        assert join.returncode == 0, out
    pids = sorted(d.pid for d in ds)
    wait_for(lambda: all(sorted(d.members(group)) == pids for d in ds), 60, "one view of the three daemons")
    views = {d.rmp_json("members", group)["view"] for d in ds}
    assert len(views) == 1, views


def test_a_quiet_group_drops_a_member_killed_with_kill_9_within_fail_after_and_a_second(daemons) -> None:
    group = unique("quiet")
    a, b, c = daemons(), daemons(), daemons()
    a.rmp("join", group)
    b.rmp("join", group, "--existing-only")
    c.rmp("join", group, "--existing-only")
    wait_for(lambda: len(a.members(group)) == 3 and len(c.members(group)) == 3, 30, "a view of three")
    fail_after = EngineConfig().fail_after

    async def watch() -> float:
        async with rmpd.connect(a.socket) as client:
            watched = await client.join(group)
            await trio.sleep(2.0)  # the group is idle: nothing sent since the view formed
            killed_at = time.monotonic()
            c.proc.send_signal(signal.SIGKILL)
            with trio.fail_after(30):
                async for event in watched:
                    if isinstance(event, rmpd.ViewChange) and c.pid not in event.members:
                        return time.monotonic() - killed_at
        raise AssertionError("the view stream ended")

    took = trio.run(watch)
    assert took <= fail_after + 1.0, f"the killed member was dropped {took:.2f} s after the kill"
    assert sorted(b.members(group)) == sorted([a.pid, b.pid])


def test_a_member_killed_with_kill_9_is_back_in_one_view_of_three_with_nothing_typed(daemons) -> None:
    """A host under systemd's Restart=on-failure: the restarted daemon rejoins what `rmp join` recorded, and the
    others take it back as a new incarnation of the same process ID."""
    group = unique("ring")
    ds = [daemons(f"h{i}") for i in range(3)]
    ds[0].rmp("join", group)
    wait_for(lambda: ds[0].members(group) == [ds[0].pid], 20, "h0 in a view of its own")
    for d in ds[1:]:
        d.rmp("join", group)
    everyone = sorted(d.pid for d in ds)
    wait_for(lambda: all(sorted(d.members(group)) == everyone for d in ds), 30, "a view of three")
    victim = ds[2]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    ds[2] = daemons("h2", port=int(victim.pid.rsplit(":", 1)[1]))
    wait_for(lambda: all(sorted(d.members(group)) == everyone for d in ds), 30,
             "the restarted daemon back in one view of three")
    assert len({d.rmp_json("members", group)["view"] for d in ds}) == 1
