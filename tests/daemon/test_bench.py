"""`rmp bench` end to end: real daemons, client and embedded members, the raw baseline, one JSON object."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rmpd.bench.daemons import RMP
from rmpd.bench.run import Bench, Case


def test_bench_measures_daemons_and_embedded_members_beside_the_baseline(loopback_multicast: None) -> None:
    result = subprocess.run([RMP, "bench", "--members", "2", "--size", "100", "--qos", "total", "--seconds", "1",
                             "--embedded", "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    cases = report["cases"]
    assert [c["embedded"] for c in cases] == [False, True]
    for case in cases:
        assert case["msgs_per_s"] > 0 and case["baseline_msgs_per_s"] > 0
        assert case["ratio"] == case["msgs_per_s"] / case["baseline_msgs_per_s"]
        assert len(case["delivered"]) == 2 and min(case["delivered"]) > 0
        assert case["received"] == [case["sent"]] * 2 and case["complete"], "every member received everything sent"
        assert case["latency_samples"] > 0 and 0 < case["p50_ms"] <= case["p99_ms"]
        assert case["cpu_s_per_msg"] > 0
    assert len(cases[0]["peak_rss_kib"]) == 2 and min(cases[0]["peak_rss_kib"]) > 0
    assert report["machine"]["cpus"] >= 1


def test_bench_refuses_an_unknown_qos() -> None:
    result = subprocess.run([RMP, "bench", "--qos", "fastest"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "fastest" in result.stderr


def test_each_case_runs_on_daemons_started_for_it(loopback_multicast: None, tmp_path: Path) -> None:
    """A case never shares a daemon with the groups of an earlier one, which may still be leaving."""
    bench = Bench(tmp_path, seconds=0.5)
    try:
        first = bench.run(Case(2, 1, 100, "total"))
        earlier = [daemon.proc for daemon in bench.daemons]
        second = bench.run(Case(2, 1, 100, "total+key"))
        assert first["complete"] and second["complete"]
        assert all(proc.poll() is not None for proc in earlier), "the first case's daemons were stopped"
        assert not {proc.pid for proc in earlier} & {daemon.proc.pid for daemon in bench.daemons}
        first_group = f"bench-{bench.run_id}-1"
        assert not [group for group in bench.daemons[0].status()["groups"] if group["group"] == first_group]
    finally:
        bench.close()
