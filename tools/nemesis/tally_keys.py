"""What every key became in an ``--exactly-once`` run, from the clients' logs, with the daemons' journals as the
last word on whether a key was delivered anywhere.

A key is *confirmed* when its own client saw it delivered (a Delivery with the key) or heard ``AlreadyDelivered``
for a copy: either way its sender knows it is done.  A key sent (some ``send`` of it returned a seq) and not
confirmed when its client ended is *unconfirmed*; it is *lost* only when no host delivered it at all: in no
client's log and in no journal.  A key is *delivered twice* when some host delivered it more than once, or when two
different messages (``src``, ``seq``) carrying it were delivered anywhere (a key at two positions of the order);
both are counted from the clients' logs and from the journals (as ``rmp audit``'s ``exactly-once`` judges them)."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

from .tally import _rounded, percentile, read_log

EXAMPLES = 20


def owner(key: str) -> int | None:
    """The host whose client made ``key`` (``h<host>-<n>``)."""
    with suppress(ValueError, IndexError):
        return int(key[1:].split("-", 1)[0])
    return None


class Deliveries:
    """Every delivery of every key: how often each host delivered it, and the messages that carried it."""

    def __init__(self) -> None:
        self.at: dict[str, Counter[str]] = defaultdict(Counter)
        """Key -> host (or journal node) -> how many times it delivered the key."""
        self.messages: dict[str, set[tuple[str, int]]] = defaultdict(set)
        """Key -> the (src, seq) of the messages delivered with it."""

    def add(self, key: str, where: str, src: str, seq: int) -> None:
        self.at[key][where] += 1
        self.messages[key].add((src, seq))

    def twice(self) -> dict[str, str]:
        """Key -> why it counts as delivered twice (at one member, or at two positions of the order)."""
        found: dict[str, str] = {}
        for key, hosts in self.at.items():
            again = sorted(h for h, n in hosts.items() if n > 1)
            if again:
                found[key] = f"delivered more than once at {', '.join(again)}"
        for key, messages in self.messages.items():
            if len(messages) > 1:
                found.setdefault(key, f"at {len(messages)} positions: {sorted(messages)[:4]}")
        return found


def journal_deliveries(journals: list[Path]) -> Deliveries:
    """The keyed deliveries written in the journals (``deliver`` records' ``keys``, hex), by node."""
    found = Deliveries()
    for directory in journals:
        for record in _journal_records(directory):
            if record.get("event") != "deliver" or not record.get("keys"):
                continue
            where = f"{directory.name} ({record.get('node')})"
            for hexed in record["keys"]:
                key = bytes.fromhex(hexed).decode(errors="replace")
                found.add(key, where, str(record.get("src")), int(record.get("seq", -1)))
    return found


def _journal_records(directory: Path) -> Iterator[dict[str, Any]]:
    files = sorted(directory.glob("*.jsonl")) + sorted(directory.glob("*.jsonl.gz"))
    for path in files:
        with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz"
              else path.open(encoding="utf-8")) as lines:
            for line in lines:
                if '"keys"' in line:
                    with suppress(json.JSONDecodeError):
                        yield json.loads(line)


def tally_keys(logs: dict[int, Path], journals: list[Path] | None = None) -> dict[str, Any]:
    """Each key's outcome from every client's log (``tools/nemesis/keyed.py``) and, when given, the journals."""
    made: set[str] = set()
    sent: set[str] = set()
    copies = 0
    refused: Counter[str] = Counter()
    unanswered = 0
    first_sent: dict[str, float] = {}
    confirmed: dict[str, tuple[str, float]] = {}
    seen = Deliveries()
    events: Counter[str] = Counter()
    for host, path in logs.items():
        for record in read_log(path):
            kind = record["e"]
            if kind == "d":
                key = record.get("key")
                if key is None:
                    continue
                seen.add(key, f"h{host}", str(record["src"]), int(record["seq"]))
                if owner(key) == host:
                    confirmed.setdefault(key, ("delivery", record["t"]))
            elif kind == "already":
                events[kind] += 1
                if owner(record["key"]) == host:
                    confirmed.setdefault(record["key"], ("already", record["t"]))
            elif kind == "sent":
                made.add(record["id"])
                sent.add(record["id"])
                copies += 1
                first_sent.setdefault(record["id"], record["t"])
            elif kind == "refused":
                made.add(record["id"])
                refused[str(record["error"])] += 1
            elif kind == "unanswered":
                made.add(record["id"])
                unanswered += 1
            elif kind in ("rejoining", "view", "attach", "down", "undelivered", "lost"):
                events[kind] += 1
    unconfirmed = sorted(sent - set(confirmed), key=_order)
    undelivered = [k for k in unconfirmed if k not in seen.at]
    in_journals = journal_deliveries(journals) if journals is not None else None
    lost = [k for k in undelivered if in_journals is None or k not in in_journals.at]
    twice = seen.twice()
    journal_twice = in_journals.twice() if in_journals is not None else {}
    latency = [at - first_sent[k] for k, (_, at) in confirmed.items() if k in first_sent]
    return {
        "exactly_once": True,
        "keys_made": len(made),
        "keys_sent": len(sent),
        "keys_not_sent": len(made - sent),
        "copies_sent": copies,
        "copies_resent": copies - len(sent),
        "keys_confirmed": len(confirmed),
        "confirmed_by_delivery": sum(1 for how, _ in confirmed.values() if how == "delivery"),
        "confirmed_by_already_delivered": sum(1 for how, _ in confirmed.values() if how == "already"),
        "keys_unconfirmed": len(unconfirmed),
        "unconfirmed_examples": unconfirmed[:EXAMPLES],
        "keys_lost": len(lost),
        "lost_examples": lost[:EXAMPLES],
        "journals_read": in_journals is not None,
        "keys_delivered_twice": len(set(twice) | set(journal_twice)),
        "twice_in_client_logs": len(twice),
        "twice_in_journals": len(journal_twice),
        "twice_examples": dict(list({**journal_twice, **twice}.items())[:EXAMPLES]),
        "keys_in_journals": None if in_journals is None else len(in_journals.at),
        "refused": sum(refused.values()),
        "refused_by_error": dict(refused),
        "unanswered": unanswered,
        "confirm_seconds_p50": _rounded(percentile(latency, 50)),
        "confirm_seconds_p99": _rounded(percentile(latency, 99)),
        "client_events": dict(events),
    }


def _order(key: str) -> tuple[int, int]:
    host, _, number = key[1:].partition("-")
    with suppress(ValueError):
        return int(host), int(number)
    return (0, 0)
