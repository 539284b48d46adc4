"""The report of a run: built from what the run measured, the tally and the audit, and shown as one table."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from .cluster import Options
from .faults import FaultRecord
from .tally import percentile


def build(options: Options, result: dict[str, Any], messages: dict[str, Any], verdict: dict[str, Any], *,
          started: float, workdir: Path, load: tuple[tuple[float, ...], tuple[float, ...]]) -> dict[str, Any]:
    """The report of a run: what the orchestration measured (``result``, whose fault records are taken out of it),
    each message's outcome (``messages``, the tally), the audit's ``verdict``, and the load average before and
    after; ``ok`` when the hosts ended in one view, nothing was lost without a report and the audit is clean."""
    load_before, load_after = load
    records: list[FaultRecord] = result.pop("faults")
    recoveries = [r.recovered_after for r in records[:-1] if r.recovered_after is not None]
    split = [r.recovered_after for r in records[:-1] if r.recovered_after is not None and r.split]
    convergence = result["convergence_seconds"]
    one_view = convergence is not None and result["one_view_at_end"]
    report = {
        "seed": options.seed, "hosts": options.hosts, "seconds": options.seconds, "loss": options.loss,
        "rate": options.rate, "faults": dict(Counter(r.kind for r in records)),
        "one_view": one_view, **result,
        "recovery_between_faults": {"faults": len(records) - 1, "recovered": len(recoveries),
                                    "p50": percentile(recoveries, 50), "max": max(recoveries, default=None),
                                    "split": len([r for r in records[:-1] if r.split]), "split_recovered": len(split),
                                    "split_p50": percentile(split, 50), "split_max": max(split, default=None)},
        "last_fault": {"kind": records[-1].kind, "split": records[-1].split} if records else None,
        "messages": messages, "audit": verdict,
        "fault_log": [asdict(r) for r in records],
        "elapsed_seconds": round(time.monotonic() - started, 1), "workdir": str(workdir),
        "netns_prefix": options.prefix,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after],
                         "cores": os.cpu_count()},
    }
    if messages.get("exactly_once"):
        report["exactly_once"] = True
        report["min_partition"] = options.min_partition
        accounted = messages["keys_lost"] == 0 and messages["keys_delivered_twice"] == 0
    else:
        accounted = messages["lost_unreported"] == 0
    report["ok"] = bool(one_view and accounted and verdict["ok"] is not False)
    return report


def _message_rows(messages: dict[str, Any]) -> list[tuple[str, str]]:
    """Each message's outcome (one message, one send)."""
    return [
        ("messages sent (seq returned)", str(messages["sent"])),
        ("  delivered to the sender", str(messages["delivered"])),
        ("  reported: Undelivered", str(messages["reported_undelivered"])),
        ("  reported: connection lost", str(messages["connection_lost"])),
        ("  lost without a report", str(messages["lost_unreported"])),
        ("sends refused (raised) / unanswered", f"{messages['refused']} / {messages['unanswered']}"),
        ("delivery to the sender p50 / p99", f"{messages['delivery_seconds_p50']} s / "
                                             f"{messages['delivery_seconds_p99']} s"),
        ("duplicates / seq mismatches", f"{messages['duplicates']} / {messages['seq_mismatches']}"),
    ]


def _key_rows(messages: dict[str, Any]) -> list[tuple[str, str]]:
    """Each key's outcome (--exactly-once: a key sent until confirmed)."""
    journals = "" if messages["journals_read"] else " (journals not read)"
    return [
        ("keys sent (a send returned a seq)", f"{messages['keys_sent']} (copies {messages['copies_sent']}, "
                                              f"{messages['copies_resent']} sent again)"),
        ("  confirmed: own delivery / AlreadyDelivered", f"{messages['keys_confirmed']}: "
                                                         f"{messages['confirmed_by_delivery']} / "
                                                         f"{messages['confirmed_by_already_delivered']}"),
        ("  not confirmed at the end", str(messages["keys_unconfirmed"])),
        ("  lost (delivered nowhere)", f"{messages['keys_lost']}{journals}"),
        ("  delivered twice anywhere", f"{messages['keys_delivered_twice']} (client logs "
                                       f"{messages['twice_in_client_logs']}, journals "
                                       f"{messages['twice_in_journals']})"),
        ("keys made, never sent", str(messages["keys_not_sent"])),
        ("sends refused (raised) / unanswered", f"{messages['refused']} / {messages['unanswered']}"),
        ("confirmation p50 / p99 (from the first send)", f"{messages['confirm_seconds_p50']} s / "
                                                          f"{messages['confirm_seconds_p99']} s"),
    ]


def _audit_text(verdict: dict[str, Any]) -> str:
    if verdict["ok"] is None:
        return "not run"
    if not verdict["ok"]:
        return f"VIOLATED {verdict.get('violations') or ''} (exit {verdict['exit']})"
    once = verdict.get("exactly_once")
    return "clean" if once is None else f"clean (exactly-once over {once['judged']})"


def summary(report: dict[str, Any]) -> Table:
    """The run at a glance."""
    messages, verdict = report["messages"], report["audit"]
    table = Table(title=f"nemesis: seed {report['seed']}, {report['hosts']} hosts, {report['seconds']:.0f} s, "
                        f"{report['loss']:.0%} loss between faults", show_header=False)
    table.add_column("what")
    table.add_column("value")
    convergence = report["convergence_seconds"]
    between = report["recovery_between_faults"]
    rows = [
        ("faults", ", ".join(f"{k} x{v}" for k, v in sorted(report["faults"].items()))),
        ("one view of all hosts", "yes" if report["one_view"] else "NO"),
        ("convergence after the last heal", ("never" if convergence is None else f"{convergence:.2f} s")
         + (f" (last fault {report['last_fault']['kind']}, "
            f"{'broke the view' if report['last_fault']['split'] else 'view never broken'})"
            if report["last_fault"] else "")),
        ("recovered between faults", f"{between['recovered']} of {between['faults']}"
                                     + (f", p50 {between['p50']:.2f} s, max {between['max']:.2f} s"
                                        if between["recovered"] else "")),
        ("  of those that broke the view", f"{between['split_recovered']} of {between['split']}"
                                           + (f", p50 {between['split_p50']:.2f} s, max {between['split_max']:.2f} s"
                                              if between["split_recovered"] else "")),
        *(_key_rows(messages) if messages.get("exactly_once") else _message_rows(messages)),
        ("audit", _audit_text(verdict)),
        ("load average (1 min) before / after", f"{report['load_average']['before'][0]} / "
                                                f"{report['load_average']['after'][0]} on "
                                                f"{report['load_average']['cores']} cores"),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
        ("files", report["workdir"]),
    ]
    for what, value in rows:
        table.add_row(what, value)
    return table
