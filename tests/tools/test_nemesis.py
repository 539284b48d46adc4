"""scripts/nemesis: its fault schedule depends on the seed alone, every message gets exactly one outcome from the
clients' logs, and (as root) a short run on namespace hosts ends in one view with every message accounted for."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from tools.nemesis.plan import KILL, RESTART_ALL, plan
from tools.nemesis.tally import tally

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("hosts", [3, 5])
def test_the_schedule_is_the_seeds_alone_one_fault_at_a_time_ending_at_the_last_second(hosts: int) -> None:
    for seed in range(1, 30):
        faults = plan(seed, hosts, 180.0)
        assert faults == plan(seed, hosts, 180.0)
        assert [f.kind for f in faults].count(RESTART_ALL) == 1
        assert all(a.end <= b.at for a, b in itertools.pairwise(faults))
        assert faults[-1].end == pytest.approx(180.0)
        assert all(1 <= h <= hosts for f in faults for h in f.hosts)
        assert all(len(f.hosts) == 1 for f in faults if f.kind == KILL)
    assert plan(1, hosts, 180.0) != plan(2, hosts, 180.0)


def _log(path: Path, *records: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps({"t": 0.0, **r}) + "\n" for r in records))
    return path


def test_every_message_sent_has_exactly_one_outcome(tmp_path: Path) -> None:
    one = _log(tmp_path / "h1.jsonl",
               {"e": "start", "undelivered_event": True},
               {"e": "sent", "id": "h1-1", "conn": 1, "seq": 10},     # delivered
               {"e": "d", "id": "h1-1", "src": "a", "seq": 10},
               {"e": "sent", "id": "h1-2", "conn": 1, "seq": 11},     # named by an Undelivered event
               {"e": "undelivered", "conn": 1, "seqs": [11]},
               {"e": "sent", "id": "h1-3", "conn": 1, "seq": 12},     # its connection was lost (daemon killed)
               {"e": "lost", "conn": 1, "error": "connection-lost"},
               {"e": "refused", "id": "h1-4", "conn": 2, "error": "not-member"},
               {"e": "sent", "id": "h1-5", "conn": 2, "seq": 11},     # same seq, later connection: no report
               {"e": "d", "id": "h2-1", "src": "b", "seq": 3},
               {"e": "d", "id": "h2-1", "src": "b", "seq": 3})        # delivered twice here
    two = _log(tmp_path / "h2.jsonl",
               {"e": "sent", "id": "h2-1", "conn": 1, "seq": 3},
               {"e": "d", "id": "h2-1", "src": "b", "seq": 3},
               {"e": "d", "id": "h1-5", "src": "a", "seq": 11})
    with one.open("a") as out:
        out.write('{"e": "sent", "id": "h1-6", "co')  # a last line cut short by a kill
    counts = tally({1: one, 2: two})
    assert (counts["sent"], counts["delivered"], counts["reported_undelivered"], counts["connection_lost"],
            counts["lost_unreported"], counts["refused"]) == (5, 2, 1, 1, 1, 1)
    assert counts["delivered_elsewhere"] == {"lost_unreported": 1}
    assert counts["duplicates"] == 1
    assert counts["lost_examples"] == [{"id": "h1-5", "host": 1, "conn": 2, "seq": 11}]


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs this as root)")
def test_a_short_run_ends_in_one_view_with_every_message_accounted_for(tmp_path: Path) -> None:
    done = subprocess.run([str(ROOT / "scripts" / "nemesis"), "--hosts", "3", "--seconds", "12", "--seed", "7",
                           "--drain", "5", "--no-audit", "--json", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["one_view"], done.stderr[-3000:]
    assert sum(report["faults"].values()) >= 1
    messages = report["messages"]
    assert messages["sent"] > 0
    assert messages["sent"] == (messages["delivered"] + messages["reported_undelivered"]
                                + messages["connection_lost"] + messages["lost_unreported"])
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert report["netns_prefix"] not in namespaces  # cleaned up
