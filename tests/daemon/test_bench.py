"""`rmp bench` end to end: real daemons, client and embedded members, the raw baseline, one JSON object."""

from __future__ import annotations

import json
import subprocess

from rmpd.bench.daemons import RMP


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
