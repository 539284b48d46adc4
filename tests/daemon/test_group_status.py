"""What `rmp status` tells of a group beyond its view (its multicast address and port, whether it is quorate or
blocked below its minimum partition, its local clients by process ID and user), and `rmp status G --all`: every
member's status, gathered through the group from one host."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections import Counter
from pathlib import Path

import msgpack
import pytest

from rmpd.daemon.group_status import read_report
from rmpd.keyfile import generate_key_file
from rmpd.localapi import BAD_REQUEST, RequestError, parse_request
from rmpd.protocol.events import StatusAsked, StatusGathered, Transmit
from rmpd.protocol.naming import group_address
from rmpd.protocol.outbox import OutputLists
from rmpd.protocol.packets import StatusQuery, StatusReport, decode, encode
from rmpd.protocol.statusquery import ANSWER_BURST, StatusQueries

from .harness import Daemon, unique, wait_for
from .test_local_api import RawClient
from .test_metrics import samples, scrape

FAST_FAILURE = """[timers]
request_interval = 0.1
join_retries = 3
fail_after = 1.0
fail_retries = 4
recovery_interval = 0.05
recovery_patience = 2
minority_attempts = 1
"""
"""A member alone below its minimum partition stops within about two seconds: a failure is declared after 1 s and one
reformation below the minimum stops the membership."""


SLOW_FAILURE = "[timers]\nrequest_interval = 0.1\njoin_retries = 3\nfail_after = 30\n"
"""A killed member stays in the view for the whole test: it is found failed only after 30 s."""


def group_of(daemon: Daemon, group: str) -> dict:
    return next(g for g in daemon.status()["groups"] if g["group"] == group)


# ----------------------------------------------------------------------------------------------------------------
# The query and its answers, without a daemon


def test_a_gathering_ends_when_every_member_answered_or_at_its_timeout() -> None:
    out, stats = OutputLists(), Counter()
    queries = StatusQueries("10.0.0.1:7000", out, stats)
    query = queries.ask("g", ("10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"), now=0.0, timeout=2.0)
    assert out.take_events() == [StatusAsked("g", "10.0.0.1:7000", query)]  # asked itself like any member
    sent = out.take_datagrams()
    assert [tx.dest for tx in sent] == ["10.0.0.2:7000", "10.0.0.3:7000"]
    assert decode(sent[0].data) == StatusQuery("g", "10.0.0.1:7000", query)
    queries.answer("10.0.0.1:7000", "g", query, b"me")
    queries.received_report(StatusReport("g", "10.0.0.2:7000", query, b"two"), "10.0.0.2:7000")
    queries.received_report(StatusReport("g", "10.0.0.3:7000", query, b"forged"), "10.0.0.9:7000")  # not its source
    queries.received_report(StatusReport("g", "10.0.0.4:7000", query, b"stranger"), "10.0.0.4:7000")  # not asked
    assert stats["status_reports_dropped"] == 2 and out.take_events() == []
    assert queries.get_timer() == 2.0
    queries.handle_timer(2.0)
    assert out.take_events() == [StatusGathered("g", query, ("10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"),
                                                (("10.0.0.1:7000", b"me"), ("10.0.0.2:7000", b"two")))]
    assert queries.get_timer() is None


def test_queries_are_answered_only_in_the_group_and_at_a_bounded_rate() -> None:
    out, stats = OutputLists(), Counter()
    queries = StatusQueries("10.0.0.1:7000", out, stats)
    queries.received_query(StatusQuery("other", "10.0.0.2:7000", 1), "10.0.0.2:7000", in_group=False, now=0.0)
    assert out.take_events() == [] and stats["status_queries_refused"] == 1
    for n in range(ANSWER_BURST + 5):
        queries.received_query(StatusQuery("g", "10.0.0.2:7000", n), "10.0.0.9:7000", in_group=True, now=0.0)
    asked = out.take_events()
    assert len(asked) == ANSWER_BURST and stats["status_queries_limited"] == 5
    assert asked[0] == StatusAsked("g", "10.0.0.9:7000", 0)  # answered to where the datagram came from
    queries.answer("10.0.0.9:7000", "g", 0, b"row")
    assert out.take_datagrams() == [Transmit("10.0.0.9:7000", encode(StatusReport("g", "10.0.0.1:7000", 0, b"row")))]
    queries.received_query(StatusQuery("g", "10.0.0.2:7000", 99), "10.0.0.2:7000", in_group=True, now=1.0)
    assert len(out.take_events()) == 1  # the allowance came back with time
    queries.answer("10.0.0.9:7000", "g", 99, bytes(70_000))  # over one datagram: dropped and counted
    assert out.take_datagrams() == [] and stats["status_reports_too_large"] == 1


@pytest.mark.parametrize("report", [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({1: 2})])
def test_a_report_that_is_no_map_is_unreadable(report: bytes) -> None:
    assert read_report(report) is None


def test_status_with_all_needs_a_group_and_a_bounded_timeout(daemons) -> None:
    client = RawClient(daemons().socket)
    for fields in ({"all": True}, {"all": True, "group": "g", "timeout": 3600}, {"all": "yes", "group": "g"}):
        assert client.request({"op": "status", "id": 1, **fields})["error"] == BAD_REQUEST, fields
    assert client.request({"op": "status", "id": 2, "all": True, "group": "g"})["error"] == "not-member"
    with pytest.raises(RequestError):
        parse_request({"op": "status", "id": 1, "all": 1})


# ----------------------------------------------------------------------------------------------------------------
# Real daemons


def test_status_shows_the_address_the_local_clients_and_that_the_group_is_quorate(daemons) -> None:
    group = unique("shown")
    d = daemons()
    client = RawClient(d.socket)
    assert "view" in client.request({"op": "join", "id": 1, "group": group})
    shown = group_of(d, group)
    address, port = group_address(group)
    assert shown["address"] == f"{address}:{port}"
    assert shown["quorum"] == {"state": "operational", "quorate": True, "members": 1, "needed": 1}
    assert [(c["pid"], c["uid"]) for c in shown["local_clients"]] == [(os.getpid(), os.getuid())]

    as_json = d.rmp_json("status", group)
    assert [g["group"] for g in as_json["groups"]] == [group]
    assert as_json["groups"][0]["local_clients"] == shown["local_clients"]
    text = d.rmp("status", group).stdout
    assert f"{address}:{port}" in text and "quorate" in text
    assert f"pid {os.getpid()}, uid {os.getuid()}" in text
    watched = d.rmp("status", "--watch", "--count", "1").stdout
    assert group in watched and "operational" in watched


def test_status_shows_a_group_blocked_below_its_minimum_partition(daemons, tmp_path: Path) -> None:
    """Two members that ask for all of their view: once one is killed, the other stops at its first reformation
    and waits for it, with no view; its status says it is blocked, and how many members it waits for."""
    config = tmp_path / "fast-failure.toml"
    config.write_text(FAST_FAILURE)
    group = unique("blocked")
    first, second = daemons(config=config, extra=["--metrics", "127.0.0.1:0"]), daemons(config=config)
    first.rmp("join", group, "--min-partition", "all")
    second.rmp("join", group)
    wait_for(lambda: all(len(d.members(group)) == 2 for d in (first, second)), 20, "a view of two")
    wait_for(lambda: group_of(first, group)["quorum"] == {"state": "operational", "quorate": True, "members": 2,
                                                          "needed": 2}, 10, "a quorate view of two")
    metrics = first.status()["metrics"]
    assert [value for labels, value in samples(scrape(metrics), "rmpd_group_quorate") if labels["group"] == group] \
        == [1.0]
    second.stop(signal.SIGKILL)
    blocked = wait_for(lambda: (g := group_of(first, group))["quorum"]["state"] == "blocked" and g, 20,
                       "the survivor blocked below its minimum partition")
    assert blocked["quorum"] == {"state": "blocked", "quorate": False, "members": 1, "needed": 2}
    assert blocked["view"] is None
    text = first.rmp("status", group).stdout
    assert "BLOCKED below the minimum partition" in " ".join(text.split())
    assert [value for labels, value in samples(scrape(metrics), "rmpd_group_quorate") if labels["group"] == group] \
        == [0.0]


def test_status_all_lists_every_member_and_marks_a_killed_one(daemons, tmp_path: Path) -> None:
    config = tmp_path / "slow-failure.toml"
    config.write_text(SLOW_FAILURE)
    group = unique("every")
    members = [daemons(config=config) for _ in range(3)]
    for d in members:  # one after the other: each later one joins the group the first founded
        assert "view" in d.request("join", group=group, persist=True)
    wait_for(lambda: all(len(d.members(group)) == 3 for d in members), 30, "a view of three")
    listener = RawClient(members[1].socket)
    assert "view" in listener.request({"op": "join", "id": 1, "group": group})

    gathered = members[0].rmp_json("status", group, "--all")
    assert gathered["asked"] == gathered["answered"] == 3
    rows = {row["pid"]: row for row in gathered["members"]}
    assert set(rows) == {d.pid for d in members}
    for d in members:
        row = rows[d.pid]
        assert row["answered"] and row["quorum"]["state"] == "operational" and row["quorum"]["quorate"]
        assert sorted(row["members"]) == sorted(m.pid for m in members)
        assert row["view"] == members[0].request("members", group=group)["view"]
    assert [(c["pid"], c["uid"]) for c in rows[members[1].pid]["local_clients"]] == [(os.getpid(), os.getuid())]
    text = members[0].rmp("status", group, "--all").stdout
    assert "3 of 3 member(s) answered" in text and all(d.pid in text for d in members)

    members[2].stop(signal.SIGKILL)  # found failed only after fail_after: the view still holds it
    result = members[0].rmp("status", group, "--all", "--timeout", "1", "--json", check=False)
    assert result.returncode == 1  # not every member answered
    gathered = json.loads(result.stdout)
    rows = {row["pid"]: row for row in gathered["members"]}
    assert gathered["asked"] == 3 and gathered["answered"] == 2
    assert rows[members[2].pid] == {"pid": members[2].pid, "answered": False}
    assert rows[members[0].pid]["answered"] and rows[members[1].pid]["answered"]


def test_a_status_query_is_answered_under_the_groups_key_only(daemons, tmp_path: Path) -> None:
    """A query is a datagram like the group's others: answered, to its source, by a daemon without a key; dropped
    unopened by a keyed one, whose members answer one another's sealed queries."""
    plain, keyed = unique("plain-query"), unique("keyed-query")
    open_daemon = daemons()
    assert "view" in open_daemon.request("join", group=plain, persist=True)
    key = tmp_path / "group.key"
    generate_key_file(key)
    members = [daemons(extra=["--auth-key", str(key)]) for _ in range(2)]
    for d in members:
        assert "view" in d.request("join", group=keyed, persist=True)
    wait_for(lambda: all(len(d.members(keyed)) == 2 for d in members), 30, "a keyed view of two")

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10)
        asker = "{}:{}".format(*sock.getsockname())
        ip, port = open_daemon.pid.rsplit(":", 1)
        sock.sendto(encode(StatusQuery(plain, asker, 7)), (ip, int(port)))
        report = decode(sock.recv(65536))
        assert isinstance(report, StatusReport)
        assert (report.group, report.src, report.query) == (plain, open_daemon.pid, 7)
        assert read_report(report.report)["pid"] == open_daemon.pid

        ip, port = members[0].pid.rsplit(":", 1)
        sock.sendto(encode(StatusQuery(keyed, asker, 8)), (ip, int(port)))
        wait_for(lambda: members[0].counters().get("auth_rejected_unsigned", 0) > 0, 10, "the plain query dropped")
    assert members[0].counters().get("status_queries_answered", 0) == 0

    gathered = members[1].rmp_json("status", keyed, "--all")
    assert gathered["answered"] == 2 and {row["pid"] for row in gathered["members"]} == {d.pid for d in members}
    assert members[0].counters()["status_queries_answered"] == 1
