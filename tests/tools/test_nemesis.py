"""scripts/nemesis: its fault schedule depends on the seed alone, every message gets exactly one outcome from the
clients' logs, and (as root) a short run on namespace hosts ends in one view with every message accounted for; with
--exactly-once, every key is confirmed, none is lost and none delivered twice."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from tools.nemesis.plan import KILL, RESTART_ALL, WHOLE_GROUP, plan
from tools.nemesis.tally import tally
from tools.nemesis.tally_keys import tally_keys

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


@pytest.mark.parametrize("hosts", [3, 5])
def test_an_exactly_once_schedule_never_stops_every_host_at_once(hosts: int) -> None:
    for seed in range(1, 30):
        faults = plan(seed, hosts, 180.0, whole_group=False)
        assert faults and not [f for f in faults if f.kind in WHOLE_GROUP]
        assert all(a.end <= b.at for a, b in itertools.pairwise(faults))
        assert faults[-1].end == pytest.approx(180.0)


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


def test_every_key_is_confirmed_lost_or_delivered_twice_by_the_logs_and_journals(tmp_path: Path) -> None:
    one = _log(tmp_path / "h1.jsonl",
               {"e": "sent", "id": "h1-1", "conn": 1, "seq": 10, "copy": 1},   # confirmed by its delivery
               {"e": "d", "id": "h1-1", "key": "h1-1", "src": "a", "seq": 10},
               {"e": "sent", "id": "h1-2", "conn": 1, "seq": 11, "copy": 1},   # lost with the connection ...
               {"e": "lost", "conn": 1, "error": "connection-lost"},
               {"e": "sent", "id": "h1-2", "conn": 2, "seq": 12, "copy": 2},   # ... sent again: already delivered
               {"e": "already", "key": "h1-2", "ts": 5, "view": "v", "conn": 2},
               {"e": "sent", "id": "h1-3", "conn": 2, "seq": 13, "copy": 1},   # never confirmed; in a journal only
               {"e": "sent", "id": "h1-4", "conn": 2, "seq": 14, "copy": 1},   # never confirmed, delivered nowhere
               {"e": "refused", "id": "h1-5", "conn": 2, "copy": 1, "error": "not-member"},  # never sent
               {"e": "d", "id": "h2-1", "key": "h2-1", "src": "b", "seq": 3},
               {"e": "d", "id": "h2-1", "key": "h2-1", "src": "b", "seq": 3})  # one host delivered it twice
    two = _log(tmp_path / "h2.jsonl",
               {"e": "sent", "id": "h2-1", "conn": 1, "seq": 3, "copy": 1},
               {"e": "d", "id": "h2-1", "key": "h2-1", "src": "b", "seq": 3},
               {"e": "sent", "id": "h2-2", "conn": 1, "seq": 4, "copy": 1},
               {"e": "d", "id": "h2-2", "key": "h2-2", "src": "b", "seq": 4},
               {"e": "sent", "id": "h2-2", "conn": 1, "seq": 5, "copy": 2},
               {"e": "d", "id": "h2-2", "key": "h2-2", "src": "b", "seq": 5},  # two messages of one key
               {"e": "d", "id": "h1-2", "key": "h1-2", "src": "a", "seq": 11})
    journal = tmp_path / "journal" / "h3"
    journal.mkdir(parents=True)
    (journal / "n.0.jsonl").write_text(json.dumps(
        {"node": "c", "event": "deliver", "src": "a", "seq": 13, "keys": [b"h1-3".hex()]}) + "\n")
    counts = tally_keys({1: one, 2: two}, [journal])
    assert (counts["keys_made"], counts["keys_sent"], counts["keys_not_sent"], counts["copies_sent"],
            counts["copies_resent"]) == (7, 6, 1, 8, 2)
    assert (counts["keys_confirmed"], counts["confirmed_by_delivery"], counts["confirmed_by_already_delivered"],
            counts["keys_unconfirmed"]) == (4, 3, 1, 2)
    assert (counts["keys_lost"], counts["lost_examples"]) == (1, ["h1-4"])
    assert counts["keys_delivered_twice"] == 2 and set(counts["twice_examples"]) == {"h2-1", "h2-2"}
    assert tally_keys({1: one, 2: two})["lost_examples"] == ["h1-3", "h1-4"]  # without the journals


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


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs this as root)")
def test_a_short_exactly_once_run_confirms_every_key_once_with_none_lost_or_twice(tmp_path: Path) -> None:
    done = subprocess.run([str(ROOT / "scripts" / "nemesis"), "--exactly-once", "--hosts", "3", "--seconds", "12",
                           "--seed", "7", "--drain", "10", "--no-audit", "--json", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["one_view"] and report["ok"], done.stderr[-3000:]
    assert report["min_partition"] == "majority"
    assert report["faults"].get(KILL), report["faults"]  # a daemon was killed under its sending client
    keys = report["messages"]
    assert keys["keys_sent"] > 0 and keys["journals_read"]
    assert (keys["keys_confirmed"], keys["keys_unconfirmed"], keys["keys_lost"], keys["keys_not_sent"]) == (
        keys["keys_sent"], 0, 0, 0), keys
    assert keys["keys_delivered_twice"] == 0, keys["twice_examples"]
    assert keys["keys_in_journals"] == keys["keys_sent"]
