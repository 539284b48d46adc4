"""Stopping and reloading a daemon: SIGTERM tells its clients ``shutting-down``; SIGHUP reloads what it can and
says what it could not, and leaves the daemon and its groups running."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path

from .conftest import FAST_JOIN
from .harness import RMP, Daemon, unique, wait_for


def clients_of(daemon: Daemon, group: str) -> int:
    return next((g["clients"] for g in daemon.status()["groups"] if g["group"] == group), 0)


def test_sigterm_tells_a_listening_client_shutting_down_in_one_line(daemons, tmp_path: Path) -> None:
    d = daemons("stopping")
    group = unique("chat")
    out, err = tmp_path / "listen.out", tmp_path / "listen.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        listen = subprocess.Popen([RMP, "--socket", str(d.socket), "listen", group], stdout=stdout, stderr=stderr)
    try:
        wait_for(lambda: clients_of(d, group) == 1 and d.members(group) == [d.pid], 20, "rmp listen in a view")
        d.rmp("send", group, "before the stop")
        wait_for(lambda: "before the stop" in out.read_text(), 10, "rmp listen to print the message")
        assert d.stop(signal.SIGTERM) == 0
        assert listen.wait(10) == 1
    finally:
        if listen.poll() is None:
            listen.kill()
    lines = err.read_text().splitlines()
    assert lines[-1] == "error: shutting-down: the daemon is shutting down (SIGTERM)", lines
    assert [line for line in lines if "error" in line] == lines[-1:], lines


def groups_of(daemon: Daemon) -> dict[str, dict]:
    return {g["group"]: g for g in daemon.status()["groups"]}


def test_sighup_applies_the_log_level_and_kept_groups_and_keeps_the_daemon_and_its_groups(daemons,
                                                                                           tmp_path: Path) -> None:
    stays, dropped, added, talk = unique("stays"), unique("dropped"), unique("added"), unique("talk")
    config = tmp_path / "reload.toml"
    config.write_text(f"log_level = 'info'\nttl = 1\ngroups = ['{stays}', '{dropped}']\n" + FAST_JOIN)
    d = daemons("reloading", config=config, log_level=None)  # the config's log level, not a flag's
    peer = daemons("peer")
    for daemon in (d, peer):
        daemon.rmp("join", talk)
    wait_for(lambda: sorted(d.members(talk)) == sorted([d.pid, peer.pid]) and d.members(stays) == [d.pid]
             and d.members(dropped) == [d.pid], 20, "the kept groups and a view of two")
    views = {group: groups_of(d)[group]["view"] for group in (stays, talk)}

    config.write_text(f"log_level = 'warning'\nttl = 2\ngroups = [{{name = '{stays}', min_partition = 'majority'}}, "
                      f"'{added}']\nmetrics = '127.0.0.1:0'\n" + FAST_JOIN)
    d.proc.send_signal(signal.SIGHUP)
    report = wait_for(lambda: d.status()["reload"], 10, "the reload")
    assert (report["applied"], report["errors"]) == (["log_level", "groups", "metrics"], [])
    assert report["not_applied"] == ["ttl", f"groups: {stays}'s min_partition or ttl (at its next join)"]
    with urllib.request.urlopen(f"http://{d.status()['metrics']}/metrics", timeout=10) as scraped:
        assert b"rmpd_hub_events" in scraped.read()
    wait_for(lambda: d.members(added) == [d.pid] and dropped not in groups_of(d), 20, "the new kept groups")
    assert d.proc.poll() is None
    assert {group: groups_of(d)[group]["view"] for group in (stays, talk)} == views  # not left, not rejoined
    assert sorted(peer.members(talk)) == sorted([d.pid, peer.pid])
    counters = d.counters()
    assert (counters["hub_reloads"], counters["hub_reload_not_applied"]) == (1, 2)
    log = d.log_path.read_text()
    assert "reload: not applied, changed keys that need a restart of rmpd: ttl" in log
    d.status()  # a new client is logged at info: no longer, at warning
    assert "connected" not in d.log_path.read_text()[len(log):]

    config.write_text("port = \n")  # a config that cannot be read changes nothing
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: d.counters()["hub_reloads"] == 2, 10, "the second reload")
    (error,) = d.status()["reload"]["errors"]
    assert "config not reloaded, nothing changed" in error and str(config) in error
    assert {stays, added, talk} == groups_of(d).keys() and d.proc.poll() is None
    assert d.stop(signal.SIGTERM) == 0
