"""Exactly once across a partition: the sending host is cut off into the minority of a group kept with
``--min-partition majority`` while `rmp send --key-prefix` streams; the minority delivers nothing, its sends come
back undelivered when it rejoins after the heal, and the command sends them again: every member delivers each line
exactly once, in one order (docs/protocol.md, "Exactly once: keys").  Three network-namespace hosts.

Needs root (as in CI, where it must run, not skip).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from .harness import RMP, wait_for
from .journals import check_journals, read_journals
from .test_netns import NETNS, hosts, membership_story, start_daemons

__all__ = ["hosts"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs this as root)")

LINES = 300


def keys_delivered(journal: Path, pid: str) -> Counter[str]:
    """How often the daemon ``pid`` delivered each key, over all its memberships (its journal's deliver records)."""
    return Counter(key for record in read_journals(journal)
                   if record.get("node") == pid and record["event"] == "deliver" and record.get("group") == "ring"
                   for key in record.get("keys", ()))


def test_a_sender_cut_off_into_the_minority_resends_after_the_heal_and_each_line_is_delivered_once(
        hosts, tmp_path: Path) -> None:
    env, started = hosts
    journal = tmp_path / "journal"
    ds = start_daemons(env, started, tmp_path, journal, 3)
    for d in ds:
        d.rmp("join", "ring", "--min-partition", "majority", timeout=120)
    pids = sorted(d.pid for d in ds)
    sender = None
    try:
        wait_for(lambda: all(sorted(d.members("ring")) == pids for d in ds), 60, "a view of three")
        sender = subprocess.Popen(
            [RMP, "--socket", str(ds[2].socket), "send", "ring", "--stdin", "--key-prefix", "run1", "--timeout", "120"],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert sender.stdin is not None
        lines = iter(range(1, LINES + 1))

        def feed(count: int) -> None:
            assert sender is not None and sender.stdin is not None
            sender.stdin.write("".join(f"line {next(lines)}\n" for _ in range(count)).encode())
            sender.stdin.flush()

        feed(100)
        subprocess.run([NETNS, "partition", "3", "--", "1", "2"], check=True, env=env)
        feed(100)  # sent into the minority: not delivered there, undelivered once it rejoins
        wait_for(lambda: all(sorted(d.members("ring")) == sorted([ds[0].pid, ds[1].pid]) for d in ds[:2]), 60,
                 "hosts 1 and 2 in a view of two")
        feed(50)
        subprocess.run([NETNS, "heal"], check=True, env=env)
        feed(50)
        sender.stdin.close()
        assert sender.wait(timeout=150) == 0, sender.stderr.read().decode() if sender.stderr else ""
        wait_for(lambda: all(sorted(d.members("ring")) == pids for d in ds), 60, "one view of three after the heal")
        wait_for(lambda: all(len(keys_delivered(journal, d.pid)) == LINES for d in ds), 30,
                 "every line delivered at every member")
    except AssertionError:
        print(membership_story(journal, ds))
        print("keys delivered per daemon:", {d.name: len(keys_delivered(journal, d.pid)) for d in ds})
        raise
    finally:
        if sender is not None and sender.poll() is None:
            sender.kill()
    every_key = {f"run1:{n}".encode().hex() for n in range(1, LINES + 1)}
    for d in ds:
        delivered = keys_delivered(journal, d.pid)
        assert set(delivered) == every_key and max(delivered.values()) == 1, (d.name, delivered.most_common(3))
    orders = {d.pid: [json.dumps(r["keys"]) for r in read_journals(journal)
                      if r.get("node") == d.pid and r["event"] == "deliver" and r.get("keys")] for d in ds[:2]}
    assert orders[ds[0].pid] == orders[ds[1].pid]  # hosts 1 and 2 were in every view: one order
    # Keyed messages are delivered once a majority holds them: each delivery says how many members the deliverer
    # knew to hold it.  (The journal checker's own count of holders is left out: it merges the hosts' journals by
    # the wall time of each record, which is taken after a step's work, so a sender's send can sort after a receipt
    # it caused elsewhere.)
    keyed = [r for r in read_journals(journal) if r["event"] == "deliver" and r.get("keys")]
    assert keyed and all(r["qos"] == "majority" and r["holders"] >= r["need"] == 2 for r in keyed)
    _, violations = check_journals(journal, "ring")
    assert [v for v in violations if v.invariant != "k-resilience"] == []
