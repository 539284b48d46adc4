"""`rmp sim-scmp`: the SCMP filter under skewed clocks, drifting lifetimes, duplicates and crashes, many seeds."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

sim_scmp_app = typer.Typer()


@sim_scmp_app.command("sim-scmp")
def sim_scmp(
    seeds: Annotated[int, typer.Option(min=1, help="Run seeds 1..S.")] = 100,
    seconds: Annotated[float, typer.Option(min=10, help="Simulated seconds per seed.")] = 240.0,
    clients: Annotated[int, typer.Option(min=1, help="Clients sending to the server.")] = 20,
    clock_offset: Annotated[float, typer.Option(min=0, help="Client clocks are off by up to this many s.")] = 2.0,
    dup: Annotated[float, typer.Option(min=0, max=1, help="Probability a message has 1-5 extra copies.")] = 0.2,
    crashes: Annotated[int, typer.Option(min=0, help="Server crashes per seed (recovery from latest).")] = 2,
    estimator: Annotated[str, typer.Option(help="limited, unlimited or fixed.")] = "limited",
    json_out: Annotated[bool, typer.Option("--json", help="End with one JSON object on stdout.")] = False,
) -> None:
    """Exit 1 if any seed accepted a duplicate or ended with an estimate of 2X or more, X being the true lifetime
    bound of the settled half (Condition 2 of the adaptive paper: the estimate converges below 2X)."""
    if estimator not in ("limited", "unlimited", "fixed"):
        raise typer.BadParameter("must be limited, unlimited or fixed", param_hint="--estimator")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from rmpd.sim.scmp_sim import ScmpSimConfig, run_scmp_seed

    err = Console(stderr=True)
    config = ScmpSimConfig(clients=clients, seconds=seconds, offset_ms=int(clock_offset * 1000), dup=dup,
                           crashes=crashes, estimator=estimator)
    results = []
    with Progress(TextColumn("seeds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                  transient=True) as progress:
        task = progress.add_task("seeds", total=seeds)
        for seed in range(1, seeds + 1):
            results.append(run_scmp_seed(config, seed))
            progress.advance(task)
    duplicates = sum(r.duplicates_accepted for r in results)
    off = [r.seed for r in results if r.estimate_ratio >= 2.0]
    sent = sum(r.sent for r in results)
    summary = {
        "seeds": seeds, "sent": sent, "duplicates_accepted": duplicates,
        "fresh_rejected_fraction": round(sum(r.fresh_rejected for r in results) / max(1, sent), 5),
        "out_of_order_fraction": round(sum(r.out_of_order for r in results) / max(1, sent), 5),
        "estimate_ratio_min": min(r.estimate_ratio for r in results),
        "estimate_ratio_max": max(r.estimate_ratio for r in results),
        "estimate_off_seeds": off, "estimator": estimator, "clock_offset_s": clock_offset,
    }
    table = Table(title=f"SCMP over {seeds} seeds ({estimator} horizon, clocks off by up to {clock_offset} s)")
    for key in ("sent", "duplicates_accepted", "fresh_rejected_fraction", "out_of_order_fraction",
                "estimate_ratio_min", "estimate_ratio_max"):
        table.add_row(key, str(summary[key]))
    err.print(table)
    if json_out:
        typer.echo(json.dumps(summary))
    if duplicates or off:
        raise typer.Exit(1)
