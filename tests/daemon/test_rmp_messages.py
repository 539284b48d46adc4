"""`rmp send` and `rmp listen` with what people actually send: bytes that are not UTF-8, packed messages, names
and sizes at the limits; the daemon and the client library refuse what the group cannot carry with the same words."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
import trio

import rmpd
from rmpd.protocol.config import EngineConfig

from .harness import RMP, RMPD, unique, wait_for
from .test_local_api import RawClient, assert_error


def start_listener(daemon, group: str, count: int, out: Path) -> subprocess.Popen[bytes]:
    """`rmp listen --json` in the background, returned once it has joined (it says so on stderr)."""
    err = out.with_suffix(".err")
    proc = subprocess.Popen([RMP, "--socket", str(daemon.socket), "listen", group, "--count", str(count), "--json"],
                            stdout=out.open("wb"), stderr=err.open("wb"))
    wait_for(lambda: "listening on" in err.read_text() or proc.poll() is not None, 30, "the listener's join")
    assert proc.poll() is None, err.read_text()
    return proc


def payload_of(row: dict) -> bytes:
    """The delivered bytes, as docs/operations.md says to read them back."""
    assert ("payload" in row) != ("payload_b64" in row), row
    return row["payload"].encode() if "payload" in row else base64.b64decode(row["payload_b64"], validate=True)


def test_bytes_that_are_not_utf8_go_out_and_come_back_exactly(daemons, tmp_path: Path) -> None:
    d = daemons()
    group = unique("bytes")
    out = tmp_path / "listen.jsonl"
    listener = start_listener(d, group, 4, out)
    sent = [b"caf\xe9", b"\xff", b"\\xff", "café".encode()]  # Latin-1, a lone 0xFF, its escape as text, UTF-8
    seqs = []
    for payload in sent:  # as a shell passes "$(printf 'caf\xe9')": the argument's bytes, whatever they are
        result = subprocess.run([RMP.encode(), b"--socket", bytes(d.socket), b"send", group.encode(), payload,
                                 b"--json"], capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        answer = json.loads(result.stdout)
        assert answer["sent"] == 1 and answer["first_seq"] == answer["last_seq"] and "seqs" not in answer
        seqs.append(answer["first_seq"])
    assert listener.wait(60) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [payload_of(r) for r in rows] == sent
    assert [r["seq"] for r in rows] == seqs
    assert rows[0]["payload_b64"] == "Y2Fm6Q==" and rows[2]["payload"] == "\\xff" and rows[3]["payload"] == "café"


def test_packed_messages_are_told_apart_by_their_index(daemons, tmp_path: Path) -> None:
    """Posted in a burst, small messages travel many to a packet and share its seq; (src, seq, index) names each."""
    d = daemons()
    group = unique("packed")
    total = 400
    out = tmp_path / "listen.jsonl"
    listener = start_listener(d, group, total, out)

    async def burst() -> None:
        async with rmpd.connect(d.socket) as client:
            handle = await client.join(group)
            for i in range(total):
                await handle.post(f"m{i}".encode())
            await handle.flush()

    trio.run(burst)
    assert listener.wait(60) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["payload"] for r in rows] == [f"m{i}" for i in range(total)]
    names = [(r["src"], r["seq"], r["index"]) for r in rows]
    assert len(set(names)) == total
    assert len({(src, seq) for src, seq, _ in names}) < total, "the burst was never packed: nothing to tell apart"

    counted = json.loads(d.rmp("send", group, "x", "--count", "3", "--json").stdout)
    assert counted["sent"] == 3 and counted["first_seq"] < counted["last_seq"]


def test_a_bare_k_is_refused_by_rmp_and_the_daemon_naming_the_valid_levels(daemons) -> None:
    d = daemons()
    group = unique("qos")
    d.rmp("join", group)
    refused = d.rmp("send", group, "x", "--qos", "k", check=False)
    assert refused.returncode == 2 and "k1..k65535" in refused.stderr, refused.stderr
    client = RawClient(d.socket)
    reply = client.request({"op": "send", "id": 1, "group": group, "payload": b"x", "qos": "k"})
    assert_error(reply, "bad-request")
    assert "k1..k65535" in reply["message"] and "safe" in reply["message"], reply
    assert client.request({"op": "send", "id": 2, "group": group, "payload": b"x", "qos": "k1"})["ok"]
    assert d.rmp("send", group, "x", "--qos", "k2").returncode == 0


def test_a_message_over_the_limit_is_refused_naming_the_limit(daemons) -> None:
    d = daemons()
    group = unique("big")
    d.rmp("join", group)
    limit = EngineConfig().max_message
    assert limit == 16 * 1024 * 1024
    result = d.rmp("send", group, "--stdin", input="x" * 20_000_000 + "\n", check=False)
    assert result.returncode == 1
    assert f"at most {limit} bytes" in result.stderr and "message-too-large" in result.stderr, result.stderr


BAD_NAMES = ["two\nlines", "tab\tbed", "nul\x00", "del\x7f", "nel\x85", "sep\u2028"]
"""A C0 control, DEL, a C1 control and a Unicode line separator: each would split or forge a log or status line."""


def test_a_group_name_with_a_control_character_is_refused(daemons) -> None:
    d = daemons()
    client = RawClient(d.socket)
    for name in BAD_NAMES:
        for op in ({"op": "join", "group": name}, {"op": "send", "group": name, "payload": b"x"},
                   {"op": "call", "group": name, "payload": b"x"}):
            reply = client.request({**op, "id": 1})
            assert_error(reply, "bad-request")
            assert "control characters" in reply["message"], reply

    async def library() -> None:  # through the daemon and embedded: refused before anything is asked
        async with rmpd.connect(d.socket) as lib, rmpd.Node(interface="lo", port=0) as node:
            for name in BAD_NAMES:
                for attempt in (lambda: lib.join(name), lambda: lib.call(name, b"x", timeout=1),  # noqa: B023
                                lambda: node.join(name), lambda: node.call(name, b"x", timeout=1)):  # noqa: B023
                    with pytest.raises(rmpd.RmpdError) as refused:
                        await attempt()
                    assert refused.value.code == "bad-request" and "control characters" in refused.value.message

    trio.run(library)
    cli = d.rmp("join", "two\nlines", check=False)
    assert cli.returncode == 1 and "bad-request" in cli.stderr and "control characters" in cli.stderr, cli.stderr
    assert client.request({"op": "status", "id": 2})["groups"] == []
    assert d.proc.poll() is None and d.counters()["hub_requests_refused"] >= 3 * len(BAD_NAMES) + 1


def test_a_config_group_with_a_control_character_stops_rmpd_at_start(tmp_path: Path) -> None:
    config = tmp_path / "rmpd.toml"
    config.write_text('groups = ["two\\nlines"]\n')
    result = subprocess.run([RMPD, "--config", str(config), "--port", "0", "--socket", str(tmp_path / "d.sock"),
                             "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "groups[0]" in result.stderr and "control characters" in result.stderr, result.stderr
