"""Links with a rate: ``rmp bench --netns --rate`` transfers a given size from one sender to four members that only
receive, over namespace hosts whose every link tbf holds to 10 Mb/s both ways, and reports each destination's share
of the wire, its transfer time, and data transmissions per packet beside the ideal; with ``--probe``, the latency of
small total-order messages sent meanwhile.

The transfer needs root (as in CI, where it must run, not skip).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rmpd.bench.daemons import RMP
from rmpd.bench.transfer import ideal_transmissions, parse_rate, parse_size

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs this as root)")

TRANSFER = 300_000
SIZE = 1000


@needs_root
def test_a_transfer_to_four_destinations_over_10_mbit_links_completes_and_is_reported() -> None:
    env = {**os.environ, "RMP_BENCH_NETNS_PREFIX": f"rmpr{os.getpid() % 1000}x"}
    result = subprocess.run([RMP, "bench", "--netns", "--rate", "10mbit", "--members", "5", "--transfer",
                             f"{TRANSFER}B", "--size", str(SIZE), "--timeout", "60", "--probe", "10", "--json"],
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["complete"] and report["destinations"] == 4 and report["senders"] == 1
    assert report["sent"] == [TRANSFER // SIZE] and report["undelivered"] == 0
    assert report["rate_bytes_per_s"] == 10e6 / 8
    destinations = report["per_destination"]
    assert [d["member"] for d in destinations] == [2, 3, 4, 5]
    for d in destinations:
        assert d["complete"] and d["received"] == TRANSFER // SIZE
        # No destination can take in more than its link carries.
        assert 0 < d["wire_fraction"] <= 1.0
        assert d["goodput_bytes_per_s"] == pytest.approx(d["wire_fraction"] * report["rate_bytes_per_s"])
        assert d["seconds"] >= TRANSFER / report["rate_bytes_per_s"] * 0.95
        # Its link carried the payload and more (headers, control), and counted what its queue dropped.
        assert d["wire_bytes_per_payload_byte"] > 1.0 and d["link_drops"] >= 0
    assert report["data_packets"] > 0 and report["data_transmissions"] >= report["data_packets"]
    assert report["transmissions_per_packet"] >= 1.0
    assert report["ideal_transmissions_per_packet"] == 1.0  # no loss asked for
    assert report["sender_send_dropped"] >= 0 and report["reformations_started"] >= 0 and report["link_drops"] >= 0
    assert len(report["daemon_counters"]) == len(report["daemon_cpu_s"]) == 5
    assert len(report["client_cpu_s"]) == 6  # the transfer's five and the probe's
    assert 0 < report["busiest_cpu_fraction"] <= report["cpu_cores_used"]
    # The probe: 10 messages a second from the transfer's start, which takes at least 0.24 s at the rate: each
    # destination times at least the one sent 0.1 s in.
    assert report["probe_rate"] == 10 and report["probe_member"] == 2 and report["probes_sent"] >= 2
    assert report["probes_timed"] >= len(destinations) and report["probes_missing"] >= 0
    for figures in (report, *destinations):
        assert 0 < figures["probe_p50_ms"] <= figures["probe_p99_ms"] <= figures["probe_max_ms"]
    for d in destinations:
        assert d["probes"] >= 1 and 0 <= d["probes_missing"] < d["probes"]


@needs_root
def test_the_delay_window_fills_a_10_mbit_link_without_overflowing_it_or_reforming(tmp_path) -> None:
    """``congestion = "delay"``: 1 MB to four destinations completes with nothing dropped anywhere, neither by a
    link's queue (the window keeps it short) nor by the sender's socket (back-pressure), with no reformation, and
    hardly a resend."""
    config = tmp_path / "delay.toml"
    config.write_text('[timers]\ncongestion = "delay"\n')
    env = {**os.environ, "RMP_BENCH_NETNS_PREFIX": f"rmpq{os.getpid() % 1000}x"}
    transfer = 1_000_000
    result = subprocess.run([RMP, "bench", "--netns", "--rate", "10mbit", "--members", "5", "--transfer",
                             f"{transfer}B", "--size", str(SIZE), "--timeout", "60", "--daemon-config", str(config),
                             "--json"], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["complete"] and report["undelivered"] == 0
    assert [d["received"] for d in report["per_destination"]] == [transfer // SIZE] * 4
    assert report["link_drops"] == 0 and report["sender_send_dropped"] == 0 and report["reformations_started"] == 0
    assert report["transmissions_per_packet"] < 1.1, report["daemon_counters"]


@needs_root
def test_a_transfer_the_link_cannot_carry_in_time_fails_with_one_line_saying_how_far_it_got() -> None:
    """300 KB need 2.4 s at 1 Mb/s: with 1 s allowed the bench says so and exits non-zero, with what it saw."""
    env = {**os.environ, "RMP_BENCH_NETNS_PREFIX": f"rmpr{os.getpid() % 1000}y"}
    result = subprocess.run([RMP, "bench", "--netns", "--rate", "1mbit", "--members", "2", "--transfer", "300KB",
                             "--timeout", "1", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    report = json.loads(result.stdout.strip().splitlines()[-1])
    [destination] = report["per_destination"]
    assert not report["complete"] and not destination["complete"] and destination["seconds"] is None
    assert destination["received"] < 300
    assert report["transmissions_per_packet"] is None  # distinct packets are known once every destination has all
    last = result.stderr.strip().splitlines()[-1]
    assert "not complete after 1 s" in last and f"received {destination['received']}" in last


def test_an_unknown_rate_is_refused_before_anything_starts() -> None:
    result = subprocess.run([RMP, "bench", "--netns", "--rate", "10 furlongs"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "10 furlongs" in result.stderr


def test_a_probe_without_a_transfer_is_refused_before_anything_starts() -> None:
    result = subprocess.run([RMP, "bench", "--probe", "10"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--probe" in result.stderr


def test_rates_and_sizes_read_as_tc_and_people_write_them() -> None:
    assert parse_rate("10mbit") == parse_rate("10Mbit") == 1.25e6
    assert parse_rate("125kbps") == 125e3  # tc's bps is bytes per second
    assert parse_size("5MB") == 5_000_000 and parse_size("1MiB") == 1 << 20 and parse_size("300000") == 300_000
    for bad in ("fast", "10", "-1mbit", "0mbit"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_the_ideal_is_one_transmission_without_loss_and_grows_with_the_group_under_loss() -> None:
    assert ideal_transmissions(8, 0.0) == 1.0
    # One receiver: each transmission reaches it with probability 1 - loss, so 1 / (1 - loss) of them.
    assert ideal_transmissions(1, 0.2) == pytest.approx(1.25)
    # More receivers need more, but fewer than if each lost packets on its own: a drop on the sender's way out
    # is lost to all at once.
    independent = sum(1 - (1 - 0.2**k) ** 4 for k in range(60))
    assert ideal_transmissions(2, 0.2) < ideal_transmissions(4, 0.2) < independent
