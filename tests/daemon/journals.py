"""Check the journals real daemons wrote with the simulator's invariant checker (rmpd/sim/checker.py).

The checker was built for the simulator, which feeds it every record as it happens on one clock.  Real hosts write
one journal each; here they are merged by wall-clock time (all test hosts share one kernel clock), each sender's
own data sends are announced to the checker first (the journal carries no payloads, so payloads are not compared),
and (for the checker that predates per-view histories) a New List is given as the ACK it also is: it takes one
timestamp and passes the token.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from pathlib import Path
from typing import Any

from rmpd.protocol.qos import QoS
from rmpd.sim.checker import InvariantChecker, SentMessage, Violation


def read_journals(directory: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # kill -9 may leave half a line at the end
                records.append(json.loads(line))
    return records


def check_journals(directory: Path, group: str) -> tuple[InvariantChecker, list[Violation]]:
    records = [r for r in read_journals(directory) if r.get("group") == group]
    nodes = sorted({r["node"] for r in records})
    per_view = "view" in inspect.signature(InvariantChecker.on_record).parameters or len(
        inspect.signature(InvariantChecker.__init__).parameters) == 1
    if per_view:  # the checker that knows views: it takes the node with each record
        checker = InvariantChecker()
        feed = lambda rec: checker.on_record(rec["node"], rec, None)  # noqa: E731
    else:
        largest_view = max((len(r["members"]) for r in records if r["event"] == "view"), default=len(nodes))
        checker = InvariantChecker(nodes, largest_view)  # type: ignore[call-arg]
        feed = lambda rec: checker.on_record(rec, None)  # type: ignore[call-arg]  # noqa: E731
    announced = set()
    for rec in records:
        if rec["event"] == "send" and rec.get("packet") == "data" and rec["src"] == rec["node"]:
            key = (rec["src"], rec["seq"], rec["qos"] != "unreliable")
            if key not in announced:
                announced.add(key)
                checker.on_send(SentMessage(rec["src"], rec["seq"], QoS.parse(rec["qos"]), b""))
    for rec in sorted(records, key=lambda r: r["wall"]):
        if not per_view and rec["event"] in ("send", "recv") and rec.get("packet") == "new_list":
            rec = {**rec, "packet": "ack", "orders": []}
        feed(rec)
    checker.finish()
    return checker, checker.violations
