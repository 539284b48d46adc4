"""`rmp sim`: run the protocol engine over a simulated faulty network for many seeds and check every invariant."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rmpd.sim import QOS_CHOICES

if TYPE_CHECKING:  # the engine and simulator are imported when a simulation runs, not for every `rmp` command
    from rmpd.sim.runner import SeedResult, SimConfig

sim_app = typer.Typer()


def _probability(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise typer.BadParameter("must be a probability between 0 and 1")
    return value


def _qos(value: str) -> str:
    if value not in QOS_CHOICES:
        raise typer.BadParameter(f"must be one of {', '.join(QOS_CHOICES)}")
    return value


@sim_app.command("sim")
def sim(
    members: Annotated[int, typer.Option(min=1, max=200, help="Processes in the group.")] = 5,
    senders: Annotated[
        int | None, typer.Option(min=0, help="How many members send (the first K) [default: min(3, members)].")
    ] = None,
    messages: Annotated[int, typer.Option(min=0, help="Messages per sender.")] = 100,
    size: Annotated[int, typer.Option(min=0, max=16 * 1024 * 1024, help=(
        "Payload bytes per message; above 16 KiB reliable messages travel as fragments."))] = 100,
    loss: Annotated[float, typer.Option(callback=_probability, help="Per-link datagram loss probability.")] = 0.0,
    dup: Annotated[float, typer.Option(callback=_probability, help="Per-link duplication probability.")] = 0.0,
    reorder: Annotated[float, typer.Option(callback=_probability, help="Per-link probability of extra delay.")] = 0.0,
    qos: Annotated[str, typer.Option(callback=_qos, help=f"One of {', '.join(QOS_CHOICES)}.")] = "total",
    crash: Annotated[int, typer.Option(min=0, help="Members that crash (and restart as new members).")] = 0,
    restarts: Annotated[int, typer.Option(min=0, help=(
        "Members that crash and start again on the same process ID (a new incarnation)."))] = 0,
    simultaneous: Annotated[bool, typer.Option("--simultaneous", help=(
        "The first members found the group by joining at the same moment."))] = False,
    partition: Annotated[bool, typer.Option("--partition", help="Partition the group once, then heal it.")] = False,
    joins: Annotated[int, typer.Option(min=0, help="Processes that join during the run.")] = 0,
    leaves: Annotated[int, typer.Option(min=0, help="Members that leave during the run.")] = 0,
    locks: Annotated[bool, typer.Option("--locks", help="Random lock and unlock requests.")] = False,
    calls: Annotated[int, typer.Option(min=0, help="Calls from a non-member to handler 0 (held by member 1).")] = 0,
    call_dup: Annotated[int, typer.Option(min=1, help="Copies of each call datagram put on the wire.")] = 1,
    congestion: Annotated[str | None, typer.Option(
        help="The members' congestion control: rmp, fixed or delay [default: the engine's].")] = None,
    keys: Annotated[bool, typer.Option("--keys", help=(
        "Key every totally ordered message and resend what is not delivered; check exactly-once."))] = False,
    seeds: Annotated[int, typer.Option(min=1, help="Run seeds 1..S.")] = 1,
    seed: Annotated[int | None, typer.Option(help="Run exactly this one seed (replays a failure).")] = None,
    journal: Annotated[Path | None, typer.Option(help="Write journals to DIR/seed-<n>/.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="End with one JSON object on stdout.")] = False,
    workers: Annotated[int, typer.Option(min=0, help="Worker processes (0: one per CPU).")] = 0,
) -> None:
    """Simulate a group under loss, duplication and reordering; exit 1 if any invariant is violated."""
    err = Console(stderr=True)
    if senders is None:
        senders = min(3, members)
    if senders > members:
        raise typer.BadParameter("--senders cannot exceed --members", param_hint="--senders")
    if leaves >= members:
        raise typer.BadParameter("--leaves must leave at least one member", param_hint="--leaves")
    from rmpd.protocol.flow import CONGESTION_CONTROLS

    if congestion is not None and congestion not in CONGESTION_CONTROLS:
        raise typer.BadParameter(f"one of {', '.join(CONGESTION_CONTROLS)}", param_hint="--congestion")
    from rmpd.sim.runner import SimConfig

    config = SimConfig(members=members, senders=senders, messages=messages, size=size, loss=loss, dup=dup,
                       reorder=reorder, qos=qos, crash=crash, partition=partition, joins=joins, leaves=leaves,
                       locks=locks, calls=calls, call_dup=call_dup, restarts=restarts, simultaneous=simultaneous,
                       congestion=congestion, keys=keys)
    seed_list = [seed] if seed is not None else list(range(1, seeds + 1))
    started = time.monotonic()
    results = _run_all(config, seed_list, journal, workers or os.cpu_count() or 1, err)
    elapsed = time.monotonic() - started

    failures = []
    for r in results:
        for v in r.violations:
            failures.append({"seed": r.seed, "invariant": v["invariant"], "detail": v["detail"],
                             "replay": config.replay_command(r.seed)})
        if not r.liveness:
            failures.append({"seed": r.seed, "invariant": "liveness",
                             "detail": f"delivered {r.delivered} of {r.expected} reliable deliveries owed",
                             "replay": config.replay_command(r.seed)})
        if r.calls and not config.membership_faults and not config.loss and r.calls_replied != r.calls:
            failures.append({"seed": r.seed, "invariant": "call-liveness",
                             "detail": f"{r.calls_replied} of {r.calls} calls replied ({r.calls_failed})",
                             "replay": config.replay_command(r.seed)})
        if r.quiescent and not r.one_view:
            failures.append({"seed": r.seed, "invariant": "one-view",
                             "detail": "the live processes did not end in one view of all of them",
                             "replay": config.replay_command(r.seed)})
        if not r.quiescent:
            failures.append({"seed": r.seed, "invariant": "quiescence",
                             "detail": f"ring still busy after {config.max_time} simulated seconds",
                             "replay": config.replay_command(r.seed)})
    detections = [d for r in results for d in r.detections]
    convergence = sorted(r.convergence_seconds for r in results)
    summary = {
        "seeds": len(results),
        "violations": sum(r.violation_count for r in results),
        "delivered": sum(r.delivered for r in results),
        "expected": sum(r.expected for r in results),
        "quiescent": all(r.quiescent for r in results),
        "quiescent_seeds": sum(r.quiescent for r in results),
        "liveness": all(r.liveness for r in results),
        "one_view_seeds": sum(r.one_view for r in results),
        "convergence_p50_seconds": _percentile(convergence, 0.50),
        "convergence_p99_seconds": _percentile(convergence, 0.99),
        "views_installed": sum(r.views_installed for r in results),
        "reformations": sum(r.reformations for r in results),
        "detection_seconds": max((r.detection_seconds for r in results), default=0.0),
        "detection_p50_seconds": round(statistics.median(detections), 3) if detections else 0.0,
        "crashes_untimed": sum(r.crashes_untimed for r in results),
        "datagrams": sum(r.datagrams for r in results),
        "max_sim_seconds": max((r.sim_time for r in results), default=0.0),
        "max_ack_slots": max((r.max_ack_slots for r in results), default=0),
        "calls": sum(r.calls for r in results),
        "calls_replied": sum(r.calls_replied for r in results),
        "calls_failed": sum(sum(r.calls_failed.values()) for r in results),
        "keys_sent": sum(r.keys_sent for r in results),
        "keys_delivered": sum(r.keys_delivered for r in results),
        "keys_resent": sum(r.keys_resent for r in results),
        "keys_already_delivered": sum(r.keys_already_delivered for r in results),
        "keys_abandoned": sum(r.keys_abandoned for r in results),
        "elapsed_seconds": round(elapsed, 3),
        "failures": failures,
    }
    _print_summary(Console(stderr=json_out), config, summary)
    if json_out:
        typer.echo(json.dumps(summary))
    if failures:
        raise typer.Exit(1)


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nearest rank), 0 for none."""
    if not values:
        return 0.0
    return round(values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))], 3)


def _run_all(config: SimConfig, seeds: list[int], journal: Path | None, workers: int,
             err: Console) -> list[SeedResult]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rmpd.sim.runner import run_seed

    results: list[SeedResult] = []
    with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("seeds", total=len(seeds))
        if workers <= 1 or len(seeds) == 1:
            for s in seeds:
                results.append(run_seed(config, s, journal))
                progress.advance(task)
        else:
            with ProcessPoolExecutor(max_workers=min(workers, len(seeds))) as pool:
                futures = [pool.submit(run_seed, config, s, journal) for s in seeds]
                for future in as_completed(futures):
                    results.append(future.result())
                    progress.advance(task)
    return sorted(results, key=lambda r: r.seed)


def _print_summary(console: Console, config: SimConfig, summary: dict) -> None:
    """One line per measure, the measure's name beside its value: reads whole at 80 columns, where a table with a
    column per measure would cut its headers and numbers."""
    from rich.table import Table

    console.print(f"rmp sim: {config.members} members, {config.senders} senders x {config.messages} messages, "
                  f"qos {config.qos}, loss {config.loss}, dup {config.dup}, reorder {config.reorder}", highlight=False)
    table = Table()
    table.add_column("measure")
    table.add_column("value", justify="right", no_wrap=True)
    ok = summary["violations"] == 0
    seeds = summary["seeds"]
    rows = [
        ("seeds", str(seeds)),
        ("violations", f"[{'green' if ok else 'red'}]{summary['violations']}[/]"),
        ("delivered / expected", f"{summary['delivered']} / {summary['expected']}"),
        *([("keys delivered / keys sent", f"{summary['keys_delivered']} / {summary['keys_sent']}"),
           ("keyed copies resent / already delivered",
            f"{summary['keys_resent']} / {summary['keys_already_delivered']}")] if config.keys else []),
        ("quiescent seeds", f"{summary['quiescent_seeds']} / {seeds}"),
        ("seeds ending in one view", f"{summary['one_view_seeds']} / {seeds}"),
        ("converged p50 / p99 (s)", f"{summary['convergence_p50_seconds']} / {summary['convergence_p99_seconds']}"),
        ("datagrams", str(summary["datagrams"])),
        ("max OrderingQ ACKs", str(summary["max_ack_slots"])),
        ("wall time (s)", f"{summary['elapsed_seconds']:.1f}"),
    ]
    for measure, value in rows:
        table.add_row(measure, value)
    console.print(table)
    for f in summary["failures"][:10]:
        console.print(f"[red]seed {f['seed']}[/] {f['invariant']}: {f['detail']}\n  replay: {f['replay']}")
    if len(summary["failures"]) > 10:
        console.print(f"... and {len(summary['failures']) - 10} more failures")
