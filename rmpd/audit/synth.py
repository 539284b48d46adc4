"""Synthetic journals that satisfy every invariant by construction, for tests and scale benchmarks.

A ring of members passes the token round; each token site orders a batch of data messages with one ACK (the ACK
takes one timestamp, its data the next ones), every member delivers in timestamp order, and after ``rounds_per_view``
rounds the token site installs the next view with a New List.  Each view ends with one round of NULL ACKs so that
every resilient message is shown held by every member.  A keyed run gives every totally ordered (and above) message
a key, and sends the second ``total`` message of every eight again under the key of the first: every member drops
that copy (a ``deliver`` record with no message, the key under ``duplicates``).  Run ``python -m rmpd.audit.synth
--help`` to write files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

QOS_CYCLE = ("total", "source", "unordered", "k2", "majority", "safe", "total", "unreliable")
KEYED = ("total", "k2", "majority", "safe")
RESENT = 6
"""In a keyed run, the message at this place of ``QOS_CYCLE`` resends the key of the one at its place 0."""
EPOCH = 1_700_000_000.0

Record = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """Shape of a synthetic run."""

    nodes: int = 3
    group: str = "demo"
    views: int = 2
    rounds_per_view: int = 3
    batch: int = 4
    scmp_per_view: int = 1
    view_base: int = 1000
    """Counter of the first view ID; runs written side by side need distinct ones (view IDs are global)."""
    keyed: bool = False
    """Ordered messages carry keys (``docs/trace-format.md``), one resent key in every ``QOS_CYCLE``."""

    def members(self) -> list[str]:
        return [f"10.0.0.{i + 1}:7000" for i in range(self.nodes)]


def _base(node: str, group: str, event: str, view: str, t: float) -> Record:
    return {"v": 1, "node": node, "group": group, "event": event, "view": view, "ts": None, "src": None,
            "seq": None, "qos": None, "wall": EPOCH + t, "mono": t}


def key_of(plan: Plan, msg: int) -> str | None:
    """The key (hex) message number ``msg`` carries, or None; a resend carries the key of the message it repeats."""
    if not plan.keyed or QOS_CYCLE[msg % len(QOS_CYCLE)] not in KEYED:
        return None
    if msg % len(QOS_CYCLE) == RESENT:
        msg -= RESENT
    return f"{plan.group}:{msg}".encode().hex()


def _keys(key: str | None, resend: bool) -> Record:
    """Fields of a keyed ``deliver`` record: the message delivered, or its copy dropped as a duplicate."""
    if key is None:
        return {}
    return {"keys": [], "duplicates": [key], "parts": 0} if resend else {"keys": [key]}


def records(plan: Plan) -> Iterator[Record]:
    """Every record of the run, in the order the members wrote them."""
    members = plan.members()
    n = len(members)
    t = 0.0
    ts = 0
    seqs = dict.fromkeys(members, 0)
    msg = 0
    view = f"{members[0]}/{plan.view_base}"
    for m in members:
        yield _base(m, plan.group, "view", view, t) | {"ts": 0, "members": members}
    site = 0
    scmp_ts = 0
    for v in range(plan.views):
        last_round = v == plan.views - 1
        rounds = plan.rounds_per_view + n
        for r in range(rounds):
            t += 0.001
            sender = members[site]
            nxt = members[(site + 1) % n]
            null = r >= plan.rounds_per_view
            batch = []
            for _ in range(0 if null else plan.batch):
                src = members[msg % n]
                qos = QOS_CYCLE[msg % len(QOS_CYCLE)]
                key = key_of(plan, msg)
                resend = key is not None and msg % len(QOS_CYCLE) == RESENT
                msg += 1
                seqs[src] += 1
                batch.append((src, seqs[src], qos, key, resend))
                sent = {"packet": "data", "src": src, "seq": seqs[src], "qos": qos}
                yield _base(src, plan.group, "send", view, t) | sent | ({"keys": [key]} if key else {})
            ack_ts = ts + 1
            orders = [[s, q, o] for s, q, o, _, _ in batch if o != "unreliable"]
            ack = {"packet": "ack", "ts": ack_ts, "src": sender, "next": nxt, "orders": orders}
            yield _base(sender, plan.group, "send", view, t) | ack
            for m in members:
                if m != sender:
                    yield _base(m, plan.group, "recv", view, t) | ack
            ts = ack_ts + len(orders)
            yield _base(nxt, plan.group, "token", view, t) | {"ts": ts, "prev": sender}
            for m in members:
                at = ack_ts
                for s, q, o, key, resend in batch:
                    rec = _base(m, plan.group, "deliver", view, t) | {"src": s, "seq": q, "qos": o, "size": 100,
                                                                      "holders": 1} | _keys(key, resend)
                    if o != "unreliable":
                        at += 1
                        rec["ts"] = at
                    if o in ("k2", "majority", "safe"):
                        rec["holders"] = n
                    yield rec
            site = (site + 1) % n
        for _ in range(plan.scmp_per_view):
            scmp_ts += 1
            for m in members:
                yield _base(m, plan.group, "scmp", view, t) | {"conn": "10.9.9.9:5000", "msg_ts": scmp_ts,
                                                               "accepted": True}
        if last_round:
            break
        t += 0.001
        ts += 1
        new_view = f"{members[site]}/{plan.view_base + 1 + v}"
        nl = {"packet": "new_list", "ts": ts, "src": members[site], "next": members[(site + 1) % n],
              "orders": [], "members": members, "new_view": new_view}
        yield _base(members[site], plan.group, "send", view, t) | nl
        for m in members:
            if m != members[site]:
                yield _base(m, plan.group, "recv", view, t) | nl
        for m in members:
            yield _base(m, plan.group, "view", new_view, t) | {"ts": ts, "members": members}
        view = new_view
        site = (site + 1) % n


def by_node(recs: Iterator[Record]) -> dict[str, list[Record]]:
    """Split records into one list per writer, keeping each writer's order."""
    out: dict[str, list[Record]] = {}
    for rec in recs:
        out.setdefault(rec["node"], []).append(rec)
    return out


def file_name(node: str, rotation: int = 0, gz: bool = False) -> str:
    """Journal file name of ``docs/trace-format.md``."""
    return f"{node.replace(':', '_')}.{rotation}.jsonl" + (".gz" if gz else "")


def write(directory: str, recs: Iterator[Record], gz: bool = False, rotate: int = 0) -> int:
    """Write one file set per node into ``directory``; rotate after ``rotate`` records (0: never)."""
    os.makedirs(directory, exist_ok=True)
    files: dict[str, tuple[TextIO, int, int]] = {}
    total = 0
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    try:
        for rec in recs:
            node = rec["node"]
            out, rot, count = files.get(node, (None, 0, 0))
            if out is None or (rotate and count >= rotate):
                if out is not None:
                    out.close()
                    rot += 1
                path = os.path.join(directory, file_name(node, rot, gz))
                out = gzip.open(path, "wt", encoding="utf-8", compresslevel=1) if gz else open(  # noqa: SIM115
                    path, "w", encoding="utf-8", buffering=1 << 20
                )
                count = 0
            out.write(dumps(rec))
            out.write("\n")
            files[node] = (out, rot, count + 1)
            total += 1
    finally:
        for out, _, _ in files.values():
            out.close()
    return total


def plan_for(records_wanted: int, nodes: int, keyed: bool = False) -> Plan:
    """A plan with roughly ``records_wanted`` records (about 4 per message per member, plus ACK traffic)."""
    batch = 8
    per_round = batch * (1 + nodes) + nodes + 1
    rounds = max(1, records_wanted // per_round)
    views = max(1, rounds // 1000)
    return Plan(nodes=nodes, views=views, rounds_per_view=max(1, rounds // views), batch=batch, keyed=keyed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gen_journal", description="Write large valid RMP journals.")
    parser.add_argument("directory")
    parser.add_argument("--records", type=int, default=1_000_000, help="approximate number of records")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="write .jsonl.gz")
    parser.add_argument("--rotate", type=int, default=0, help="records per file before rotating (0: never)")
    parser.add_argument("--keyed", action="store_true", help="ordered messages carry keys, some resent")
    args = parser.parse_args(argv)
    plan = plan_for(args.records, args.nodes, args.keyed)
    total = write(args.directory, records(plan), gz=args.gzip, rotate=args.rotate)
    print(f"wrote {total} records to {args.directory}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
