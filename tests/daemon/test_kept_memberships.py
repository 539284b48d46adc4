"""Memberships that survive restarts: the config's groups and those joined with `rmp join` are rejoined by the
daemon itself when it starts again, with no client and no command typed; a group left with `rmp leave` is not."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from rmpd.daemon.memberships import Membership, MembershipFile, MembershipFileError
from rmpd.protocol.reformation import MIN_PARTITION_MAJORITY

from .conftest import FAST_JOIN
from .harness import RMPD, Daemon, unique, wait_for


def groups_of(daemon: Daemon) -> dict[str, dict]:
    """The daemon's groups as `rmp status --json` lists them (joining ones too), by name."""
    return {g["group"]: g for g in daemon.status()["groups"]}


def port_of(daemon: Daemon) -> int:
    return int(daemon.pid.rsplit(":", 1)[1])


def alone_in(daemon: Daemon, group: str, timeout: float = 20) -> None:
    """Wait until ``daemon`` is in a view of ``group`` (here: by itself, nobody else is in it)."""
    wait_for(lambda: daemon.members(group) == [daemon.pid], timeout, f"{daemon.name} in a view of {group}")


# ----------------------------------------------------------------------------------------------------------------
# The file


def test_the_file_round_trips_and_a_rewrite_leaves_no_temporary_behind(tmp_path: Path) -> None:
    kept = MembershipFile(tmp_path / "state" / "memberships-127.0.0.1_7000.json")
    assert kept.load() == {}
    memberships = [Membership("b", MIN_PARTITION_MAJORITY, 2), Membership("a")]
    kept.save(memberships)
    assert kept.load() == {"a": Membership("a"), "b": Membership("b", MIN_PARTITION_MAJORITY, 2)}
    assert json.loads(kept.path.read_text()) == {
        "version": 1, "groups": [{"name": "a"}, {"name": "b", "min_partition": "majority", "ttl": 2}]}
    kept.save([])
    assert kept.load() == {}
    assert sorted(p.name for p in kept.path.parent.iterdir()) == [kept.path.name]


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 2, "groups": []}', '{"version": 1, "groups": [3]}',
                                  '{"version": 1, "groups": [{"name": "g", "min_partition": 0}]}'])
def test_a_file_that_is_not_a_list_of_memberships_is_refused_not_guessed_at(tmp_path: Path, text: str) -> None:
    path = tmp_path / "memberships.json"
    path.write_text(text)
    with pytest.raises(MembershipFileError, match="fix it or remove it"):
        MembershipFile(path).load()


def test_rmpd_refuses_to_start_on_an_unreadable_file_in_one_line(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # a port that is free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = tmp_path / "state"
    state.mkdir()
    (state / f"memberships-127.0.0.1_{port}.json").write_text("not json")
    result = subprocess.run([RMPD, "--bind", "127.0.0.1", "--port", str(port), "--state-dir", str(state),
                             "--socket", str(tmp_path / "rmpd.sock")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "memberships-127.0.0.1_" in lines[0] and "fix it or remove it" in lines[0], lines


# ----------------------------------------------------------------------------------------------------------------
# Real daemons


def test_the_configs_groups_are_joined_at_start_with_no_client(daemons, tmp_path: Path) -> None:
    boot, quorum = unique("boot"), unique("boot-quorum")
    config = tmp_path / "groups.toml"
    config.write_text(f"groups = ['{boot}', {{name = '{quorum}', min_partition = 'majority'}}]\n" + FAST_JOIN)
    first = daemons("first", config=config)
    listed = groups_of(first)  # READY=1 came after the joins were under way
    assert {boot, quorum} <= listed.keys() and all(listed[g]["persistent"] for g in (boot, quorum))
    alone_in(first, boot)
    alone_in(first, quorum)
    assert groups_of(first)[quorum]["min_partition"] == "majority"
    # A second host with the same config finds the group the first formed: one view of two, nothing typed.
    second = daemons("second", config=config)
    wait_for(lambda: all(sorted(d.members(g)) == sorted([first.pid, second.pid])
                         for d in (first, second) for g in (boot, quorum)), 20, "views of two")
    assert groups_of(second)[quorum]["min_partition"] == "majority"


def test_a_group_joined_with_rmp_join_is_rejoined_after_kill_9(daemons) -> None:
    kept, passing = unique("kept"), unique("passing")
    d = daemons("keeper")
    d.rmp("join", kept, "--min-partition", "majority")
    d.rmp("send", passing, "x")  # a client's own join (not persistent): left when the client went away
    wait_for(lambda: passing not in groups_of(d), 20, "the daemon to leave the group its client left")
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)

    again = daemons("keeper", port=port_of(d))  # same config, state directory and process ID
    assert again.pid == d.pid
    assert groups_of(again).keys() == {kept}
    alone_in(again, kept)
    listed = groups_of(again)[kept]
    assert listed["persistent"] and listed["min_partition"] == "majority"
    assert f"rejoined {kept}" in again.log_path.read_text()


def test_a_group_left_is_not_rejoined_after_a_restart_and_a_configured_one_always_is(daemons, tmp_path) -> None:
    stays, goes, declared = unique("stays"), unique("goes"), unique("declared")
    config = tmp_path / "declared.toml"
    config.write_text(f"groups = ['{declared}']\n" + FAST_JOIN)
    d = daemons("leaver", config=config)
    for group in (stays, goes):
        d.rmp("join", group)
    alone_in(d, goes)
    d.rmp("leave", goes)
    d.rmp("leave", declared)  # until the next start: the config declares it
    wait_for(lambda: groups_of(d).keys() == {stays}, 20, "the daemon to leave the group left and the declared one")
    assert d.stop(signal.SIGTERM) == 0

    again = daemons("leaver", port=port_of(d), config=config)
    assert groups_of(again).keys() == {stays, declared}
    alone_in(again, stays)
    alone_in(again, declared)
    assert goes not in groups_of(again)


def test_a_persistent_join_the_state_directory_cannot_record_is_refused_and_changes_nothing(daemons) -> None:
    d = daemons("unwritable")
    moved = d.state_dir.with_name("moved.state")
    d.state_dir.mkdir(parents=True, exist_ok=True)
    d.state_dir.rename(moved)
    d.state_dir.write_text("a file where the directory was: no write gets through, even as root")
    group = unique("unrecorded")
    refused = d.rmp("join", group, check=False)
    assert refused.returncode == 1 and "state-unwritable" in refused.stderr
    assert group not in groups_of(d)
    d.state_dir.unlink()
    moved.rename(d.state_dir)
    d.rmp("join", group)
    assert MembershipFile(next(d.state_dir.glob("memberships-*.json"))).load() == {group: Membership(group)}

