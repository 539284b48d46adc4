"""The Prometheus endpoint of a real daemon, scraped over HTTP and parsed with prometheus_client's own parser, and
the embedded Node's registry: the delivery counters are what the programs received."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import rmpd

from .harness import RMPD, read_deliveries, unique
from .test_client_library import FAST_NODE

MESSAGES = 200
QOS_CYCLE = (rmpd.QoS.TOTAL, rmpd.QoS.SAFE, rmpd.QoS.SOURCE, rmpd.QoS.k(2))


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples called ``name`` in an exposition, as (labels, value)."""
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def deliveries_by_qos(text: str, group: str) -> Counter[str]:
    return Counter({labels["qos"]: int(value) for labels, value in samples(text, "rmpd_deliveries_total")
                    if labels["group"] == group})


def scrape(address: str, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


async def test_a_scrape_while_traffic_flows_counts_what_the_client_received(daemons, tmp_path: Path) -> None:
    d = daemons(extra=["--metrics", "127.0.0.1:0"])
    address = d.status()["metrics"]
    assert address and address.startswith("127.0.0.1:")
    name = unique("metrics")
    received: list[rmpd.Delivery] = []
    during = ""
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client:
            group = await client.join(name)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_deliveries, group, MESSAGES, received)
                for i in range(MESSAGES):
                    await group.send(b"m%d" % i, qos=QOS_CYCLE[i % len(QOS_CYCLE)])
                    if i == MESSAGES // 2:
                        during = await trio.to_thread.run_sync(scrape, address)
            after = await trio.to_thread.run_sync(scrape, address)

    got = Counter(delivery.qos.name() for delivery in received)
    assert sum(got.values()) == MESSAGES
    assert deliveries_by_qos(after, name) == got
    assert sum(deliveries_by_qos(during, name).values()) <= MESSAGES  # parsed, and counted as it went
    sent = dict(((labels["direction"], labels["type"]), value)
                for labels, value in samples(after, "rmpd_datagrams_total"))
    assert sent[("out", "data")] > 0 and sent[("out", "ack")] > 0
    latency = {labels["qos"]: value for labels, value in samples(after, "rmpd_delivery_latency_seconds_count")}
    assert sum(latency.values()) == MESSAGES  # one send request per message here, each seen delivered
    views = [value for labels, value in samples(after, "rmpd_views_installed_total") if labels["group"] == name]
    assert views == [1.0]
    members = [value for labels, value in samples(after, "rmpd_group_members") if labels["group"] == name]
    assert members == [1.0]
    engine = {labels["counter"]: value for labels, value in samples(after, "rmpd_engine_events_total")}
    assert engine and set(engine) <= set(d.counters())  # the very counters `rmp status` shows
    drops = {labels["reason"]: value for labels, value in samples(after, "rmpd_drops_total")}
    assert drops["malformed"] == 0 and "auth_rejected" in drops

    with pytest.raises(urllib.error.HTTPError) as wrong:
        await trio.to_thread.run_sync(scrape, address, "/nothing")
    assert wrong.value.code == 404


def test_a_taken_metrics_port_stops_the_daemon_naming_it(daemons, tmp_path: Path) -> None:
    d = daemons(extra=["--metrics", "127.0.0.1:0"])
    address = d.status()["metrics"]
    second = subprocess.run(
        [RMPD, "--bind", "127.0.0.1", "--port", "0", "--socket", str(tmp_path / "second.sock"),
         "--state-dir", str(tmp_path / "second.state"), "--metrics", address],
        capture_output=True, text=True, timeout=30,
    )
    assert second.returncode == 1
    assert f"cannot serve metrics on {address}" in second.stderr and "--metrics" in second.stderr
    bad = subprocess.run([RMPD, "--metrics", "9464"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "metrics must be HOST:PORT" in bad.stderr


async def test_an_embedded_node_counts_its_deliveries_in_its_registry() -> None:
    with trio.fail_after(30):
        async with rmpd.Node(interface="lo", port=0, config=FAST_NODE) as node:
            group = await node.join(unique("node-metrics"))
            received: list[rmpd.Delivery] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_deliveries, group, 20, received)
                for i in range(20):
                    await group.send(b"n%d" % i, qos=rmpd.QoS.TOTAL)
            text = generate_latest(node.metrics).decode()
    assert deliveries_by_qos(text, group.name) == Counter({"total": 20})


async def test_token_rotation_times_of_a_ring_of_two_are_a_histogram_within_fail_after(loopback_multicast) -> None:
    with trio.fail_after(30):
        async with rmpd.Node(interface="lo", port=0, config=FAST_NODE) as a, \
                rmpd.Node(interface="lo", port=0, config=FAST_NODE) as b:
            name = unique("rotations")
            first = await a.join(name)
            second = await b.join(name, existing_only=True)
            received: list[rmpd.Delivery] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_deliveries, second, 50, received)
                for i in range(50):
                    await first.send(b"r%d" % i)
            text = generate_latest(a.metrics).decode()
    buckets = {labels["le"]: value for labels, value in samples(text, "rmpd_token_rotation_seconds_bucket")
               if labels["group"] == name}
    [count] = [value for labels, value in samples(text, "rmpd_token_rotation_seconds_count") if labels["group"] == name]
    [total] = [value for labels, value in samples(text, "rmpd_token_rotation_seconds_sum") if labels["group"] == name]
    assert count > 0 and buckets["+Inf"] == count  # the token went round while messages were ordered
    assert 0 < total <= count * FAST_NODE.fail_after
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
