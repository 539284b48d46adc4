"""A majority (or all) minimum partition named the same way everywhere: the CLI, the local API, the client library
and the embedded Node; what the view keeps is what `rmp status` shows."""

from __future__ import annotations

import pytest
import trio
from typer.testing import CliRunner

import rmpd
from cli.rmp_main import app
from rmpd.localapi import (
    BAD_REQUEST,
    RequestError,
    encode_frame,
    min_partition_name,
    parse_min_partition,
    parse_request,
)
from rmpd.protocol.reformation import MIN_PARTITION_ALL, MIN_PARTITION_MAJORITY

from .harness import unique, wait_for
from .test_client_library import FAST_NODE
from .test_local_api import RawClient


@pytest.mark.parametrize(("given", "encoded", "shown"), [
    ("majority", MIN_PARTITION_MAJORITY, "majority"),
    ("Majority", MIN_PARTITION_MAJORITY, "majority"),
    ("all", MIN_PARTITION_ALL, "all"),
    (3, 3, 3),
    ("3", 3, 3),
    (65534, 65534, 65534),
])
def test_the_public_form_maps_to_the_protocols_encoding_and_back(given: int | str, encoded: int,
                                                                 shown: int | str) -> None:
    assert parse_min_partition(given) == encoded
    assert min_partition_name(encoded) == shown
    request = parse_request({"op": "join", "id": 1, "group": "g", "min_partition": given})
    assert request.min_partition == encoded


@pytest.mark.parametrize("given", [0, "0", -1, 65535, "most", "", "9" * 5000, True, 2.5])
def test_a_bad_minimum_partition_is_one_clear_line(given: object) -> None:
    with pytest.raises(ValueError, match=r"^min_partition must be 'majority', 'all' or a whole number") as bad:
        parse_min_partition(given)  # type: ignore[arg-type]
    assert "\n" not in str(bad.value)
    with pytest.raises(RequestError) as refused:
        parse_request({"op": "join", "id": 1, "group": "g", "min_partition": given})
    assert refused.value.code == BAD_REQUEST and "min_partition" in refused.value.message


def test_zero_is_refused_with_the_word_to_use_instead() -> None:
    with pytest.raises(ValueError, match="say 'majority'"):
        parse_min_partition(0)


def test_rmp_join_refuses_a_bad_minimum_partition_before_asking_the_daemon(tmp_path) -> None:
    result = CliRunner().invoke(app, ["--socket", str(tmp_path / "none.sock"), "join", "g", "--min-partition",
                                      "most"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "min_partition must be 'majority', 'all' or a whole number" in lines[0], lines


def min_partition_at(daemon, group: str) -> int | str | None:
    return next((g["min_partition"] for g in daemon.status()["groups"] if g["group"] == group), None)


def test_rmp_join_majority_holds_when_a_member_joins_with_the_default(daemons) -> None:
    quorum, everyone = unique("quorum"), unique("everyone")
    first, second = daemons(), daemons()
    first.rmp("join", quorum, "--min-partition", "majority")
    assert min_partition_at(first, quorum) == "majority"
    second.rmp("join", quorum)  # asks for the default, 1
    wait_for(lambda: all(len(d.members(quorum)) == 2 for d in (first, second)), 20, "a view of two")
    assert [min_partition_at(d, quorum) for d in (first, second)] == ["majority", "majority"]
    first.rmp("join", everyone, "--min-partition", "all")
    assert min_partition_at(first, everyone) == "all"


async def test_the_client_library_and_a_node_take_majority_and_all(daemons) -> None:
    every, founded = unique("lib-all"), unique("node-majority")
    d = daemons()
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client, rmpd.Node(interface="lo", port=0, config=FAST_NODE) as node:
            await client.join(every, min_partition="all")
            assert min_partition_at(d, every) == "all"
            with pytest.raises(rmpd.RmpdError) as refused:
                await client.join("lib-bad", min_partition=0)
            assert refused.value.code == "bad-request" and "majority" in refused.value.message
            with pytest.raises(rmpd.RmpdError) as refused:
                await node.join("node-bad", min_partition="most")
            assert refused.value.code == "bad-request"

            await node.join(founded, min_partition="majority")  # the node founds it
            await client.join(founded)  # the daemon joins with the default and keeps the majority
            assert min_partition_at(d, founded) == "majority"


def test_a_join_asked_while_the_daemon_leaves_the_group_keeps_its_options(daemons) -> None:
    """A leave and a join in one write: the process is still on its way out of a group of two when the join comes,
    so the join is made once it has left, and must ask for what the client asked (here ``all``), not the
    defaults."""
    group = unique("leave-join")
    first, second = daemons(), daemons()
    client = RawClient(first.socket)
    assert "view" in client.request({"op": "join", "id": 1, "group": group})
    second.rmp("join", group)
    wait_for(lambda: all(len(d.members(group)) == 2 for d in (first, second)), 20, "a view of two")
    assert min_partition_at(first, group) == 1
    client.send_raw(encode_frame({"op": "leave", "id": 2, "group": group})
                    + encode_frame({"op": "join", "id": 3, "group": group, "min_partition": "all"}))
    answers = {reply["id"]: reply for reply in (client.answer(), client.answer())}
    assert "view" in answers[3], answers
    wait_for(lambda: all(len(d.members(group)) == 2 for d in (first, second)), 20, "the view of two again")
    assert [min_partition_at(d, group) for d in (first, second)] == ["all", "all"]
