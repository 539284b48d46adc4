"""Check the journals real daemons wrote with the simulator's invariant checker (rmpd/sim/checker.py).

The checker was built for the simulator, which feeds it every record as it happens on one clock.  Real hosts write
one journal each; here they are merged by wall-clock time (all test hosts share one kernel clock), each sender's
own data sends are announced to the checker first, and each record is observed as the simulator observes it (the
journal carries no payloads, so payloads are not compared).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from rmpd.protocol.qos import QoS
from rmpd.sim.checker import InvariantChecker, SentMessage, Violation
from rmpd.sim.observations import from_record


def read_journals(directory: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # kill -9 may leave half a line at the end
                records.append(json.loads(line))
    return records


def check_journals(directory: Path, group: str) -> tuple[InvariantChecker, list[Violation]]:
    records = [r for r in read_journals(directory) if r.get("group") == group]
    checker = InvariantChecker()
    announced = set()
    for rec in records:
        if rec["event"] == "send" and rec.get("packet") == "data" and rec["src"] == rec["node"]:
            key = (rec["src"], rec["seq"], rec["qos"] != "unreliable")
            if key not in announced:
                announced.add(key)
                keys = tuple(bytes.fromhex(key) for key in rec.get("keys", ()))
                payload = tuple(b"" for _ in keys) if len(keys) > 1 else b""
                checker.on_send(SentMessage(rec["src"], rec["seq"], QoS.parse(rec["qos"]), payload, keys))
    for rec in sorted(records, key=lambda r: r["wall"]):
        observation = from_record(rec["node"], rec)
        if observation is not None:
            checker.observe(observation)
    checker.finish()
    return checker, checker.violations
