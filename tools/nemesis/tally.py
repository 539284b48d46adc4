"""What every message became, from the clients' logs alone."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """A client log's records; a last line cut short by a kill is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            with suppress(json.JSONDecodeError):
                yield json.loads(line)


def tally(logs: dict[int, Path]) -> dict[str, Any]:
    """Each message's outcome from every client's log.

    A message whose ``send`` returned a seq is *delivered* when its sender's client saw it delivered, else
    *reported undelivered* when an Undelivered event of its connection named its seq, else *connection lost* when
    its connection to the daemon ended before either (the daemon was killed: the program was told, by
    ConnectionLost, that it cannot know), else *lost without a report*.  A send that raised is *refused*: no seq
    was returned, and the program knows."""
    sent: dict[str, tuple[int, int, int]] = {}
    refused: Counter[str] = Counter()
    delivered: dict[int, Counter[str]] = {}
    delivered_seq: dict[tuple[int, str], int] = {}
    undelivered: set[tuple[int, int, int]] = set()
    ended: dict[tuple[int, int], str] = {}
    unanswered = 0
    events: Counter[str] = Counter()
    sent_at: dict[str, float] = {}
    latency: list[float] = []
    undelivered_event = False
    for host, path in logs.items():
        seen: Counter[str] = Counter()
        delivered[host] = seen
        for record in read_log(path):
            kind = record["e"]
            if kind == "d":
                seen[record["id"]] += 1
                if record["id"].startswith(f"h{host}-"):
                    delivered_seq.setdefault((host, record["id"]), int(record["seq"]))
                    if record["id"] in sent_at and seen[record["id"]] == 1:
                        latency.append(record["t"] - sent_at[record["id"]])
            elif kind == "sent":
                sent[record["id"]] = (host, int(record["conn"]), int(record["seq"]))
                sent_at[record["id"]] = record["t"]
            elif kind == "unanswered":
                unanswered += 1
            elif kind == "refused":
                refused[str(record["error"])] += 1
            elif kind in ("rejoining", "view", "attach", "down"):
                events[kind] += 1
            elif kind == "undelivered":
                events[kind] += 1
                undelivered.update((host, int(record["conn"]), int(s)) for s in record["seqs"])
            elif kind == "lost":
                ended[(host, int(record["conn"]))] = str(record["error"])
            elif kind == "start":
                undelivered_event = undelivered_event or bool(record.get("undelivered_event"))
    outcome: Counter[str] = Counter()
    cut_by: Counter[str] = Counter()
    elsewhere: Counter[str] = Counter()
    lost_examples: list[dict[str, Any]] = []
    mismatched = 0
    for message, (host, conn, seq) in sent.items():
        if delivered[host][message]:
            outcome["delivered"] += 1
            mismatched += delivered_seq.get((host, message), seq) != seq
            continue
        if (host, conn, seq) in undelivered:
            kind = "reported_undelivered"
        elif (host, conn) in ended:
            kind = "connection_lost"
            cut_by[ended[(host, conn)]] += 1
        else:
            kind = "lost_unreported"
            if len(lost_examples) < 20:
                lost_examples.append({"id": message, "host": host, "conn": conn, "seq": seq})
        outcome[kind] += 1
        if any(delivered[h][message] for h in delivered if h != host):
            elsewhere[kind] += 1
    duplicates = sum(count - 1 for seen in delivered.values() for count in seen.values() if count > 1)
    return {
        "attempted": len(sent) + sum(refused.values()) + unanswered,
        "refused": sum(refused.values()),
        "refused_by_error": dict(refused),
        "sent": len(sent),
        "delivered": outcome["delivered"],
        "reported_undelivered": outcome["reported_undelivered"],
        "connection_lost": outcome["connection_lost"],
        "connection_lost_by_error": dict(cut_by),
        "unanswered": unanswered,
        "reported_failed": outcome["reported_undelivered"] + outcome["connection_lost"],
        "lost_unreported": outcome["lost_unreported"],
        "delivered_elsewhere": dict(elsewhere),
        "duplicates": duplicates,
        "seq_mismatches": mismatched,
        "delivery_seconds_p50": _rounded(percentile(latency, 50)),
        "delivery_seconds_p99": _rounded(percentile(latency, 99)),
        "lost_examples": lost_examples,
        "undelivered_event": undelivered_event,
        "client_events": dict(events),
    }


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
