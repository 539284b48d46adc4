"""One whole run: the hosts formed, the faults done, everything healed and stopped (whatever happens), then the
tally, the audit and the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

from rmpd.bench.daemons import RMP

from .cluster import Cluster, Options
from .faults import run_faults
from .monitor import Monitor
from .plan import plan
from .report import build
from .tally import tally
from .tally_keys import tally_keys

SETTLE = 60.0
"""With --exactly-once, seconds a fault waits at most for one view of all hosts after the previous one
(``run_faults``), so that a majority stays in the group."""


async def orchestrate(cluster: Cluster, options: Options, say: Any) -> dict[str, Any]:
    """Everything from the empty namespaces to the stopped daemons; what the report needs besides the logs."""
    result: dict[str, Any] = {}
    await trio.to_thread.run_sync(cluster.create)
    begun = trio.current_time()
    async with trio.open_nursery() as nursery:
        for host in cluster.hosts:
            nursery.start_soon(trio.to_thread.run_sync, cluster.start, host)
    await trio.to_thread.run_sync(cluster.join)
    monitor = Monitor(cluster)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        formed = await monitor.wait_one_view(begun, 120.0)
        if formed is None:
            raise RuntimeError("the hosts never formed one view of all of them at the start")
        result["initial_view_seconds"] = round(formed - begun, 2)
        say(f"one view of {cluster.n} hosts after {formed - begun:.1f} s; base loss {options.loss:.0%}, clients on")
        await trio.to_thread.run_sync(cluster.set_loss, options.loss)
        cluster.start_clients()
        faults = plan(options.seed, cluster.n, options.seconds, whole_group=not options.exactly_once)
        records, t0, last_fault = await run_faults(cluster, monitor, faults, say,
                                                   settle=SETTLE if options.exactly_once else 0.0)
        await trio.to_thread.run_sync(cluster.heal, 0.0)
        last_heal = trio.current_time()
        say(f"{last_heal - t0:6.1f}s  faults over: everything healed, waiting for one view")
        seen = await monitor.wait_one_view(last_heal, options.converge_timeout)
        if records:
            records[-1].recovered_after = None if seen is None else round(seen - last_fault, 2)
            records[-1].split = monitor.split(t0 + records[-1].began, trio.current_time() if seen is None else seen)
        result["convergence_seconds"] = None if seen is None else round(seen - last_heal, 2)
        say(f"{trio.current_time() - t0:6.1f}s  " + (f"one view of all {cluster.n} hosts {seen - last_heal:.2f} s "
                                                    f"after the last heal" if seen is not None else
                                                    f"no one view within {options.converge_timeout:.0f} s"))
        await trio.sleep(2.0)  # the clients go on a little in the healed group
        say("stopping the clients (drain)")
        result["client_exits"] = await trio.to_thread.run_sync(cluster.stop_clients)
        end = await monitor.look()
        result["one_view_at_end"] = end.one_view
        result["views_at_end"] = [None if v is None else {"view": v[0], "members": list(v[1])} for v in end.views]
        result["fault_seconds"] = round(last_heal - t0, 1)
        nursery.cancel_scope.cancel()
    result["faults"] = records
    await trio.to_thread.run_sync(cluster.stop_daemons)
    return result


class Interrupted(Exception):
    """The run was told to stop (SIGTERM or SIGINT) before it was over."""


async def orchestrate_until_told(cluster: Cluster, options: Options, say: Any) -> dict[str, Any]:
    """``orchestrate``, ended by SIGTERM or SIGINT as by an error: the caller's cleanup then removes the daemons,
    the clients and the namespaces.  (Raised from a trio task, not from a signal handler that would interrupt trio
    itself wherever it is.)"""
    result: dict[str, Any] = {}
    try:
        async with trio.open_nursery() as nursery:

            async def told() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        raise Interrupted(signal.Signals(signum).name)

            nursery.start_soon(told)
            result = await orchestrate(cluster, options, say)
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise single_error(group) from None
    return result


def single_error(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside nested groups of one, else the group itself."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def audit(journals: list[Path], workdir: Path, master: str) -> dict[str, Any]:
    """``rmp audit`` over every host's journal: its exit status and, per invariant, the violations."""
    report = workdir / "audit.json"
    with (workdir / "audit.log").open("w") as out:
        done = subprocess.run([RMP, "audit", *map(str, journals), "--master", master, "--json", str(report)],
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    verdict: dict[str, Any] = {"exit": done.returncode, "ok": done.returncode == 0}
    if report.exists():
        data = json.loads(report.read_text())
        verdict["records"] = data.get("records")
        verdict["violations"] = {i["name"]: i["violations"] for i in data.get("invariants", []) if i["violations"]}
        once = [i for i in data.get("invariants", []) if i["name"] == "exactly-once"]
        if once:
            verdict["exactly_once"] = {"holds": once[0]["holds"], "checked": once[0]["checked"],
                                       "violations": once[0]["violations"], "judged": once[0].get("note")}
    return verdict


def run(options: Options, console: Console) -> dict[str, Any]:
    """One whole run; the report (also written to the working directory as report.json)."""
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="rmp-nemesis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def say(message: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)

    say(f"nemesis: {options.hosts} hosts, {options.seconds:.0f} s, seed {options.seed}, loss {options.loss:.0%} "
        f"between faults; files in {workdir}")
    cluster = Cluster(options, workdir, say)
    load_before = os.getloadavg()
    try:
        result = trio.run(orchestrate_until_told, cluster, options, say)
    finally:
        cluster.close()
    load_after = os.getloadavg()
    logs = {h: cluster.client_log(h) for h in cluster.hosts}
    messages = (tally_keys(logs, [cluster.journal(h) for h in cluster.hosts]) if options.exactly_once
                else tally(logs))
    verdict: dict[str, Any] = {"exit": None, "ok": None}
    if options.audit:
        say("auditing the journals")
        verdict = audit([cluster.journal(h) for h in cluster.hosts], workdir, options.master)
    report = build(options, result, messages, verdict, started=started, workdir=workdir,
                   load=(load_before, load_after))
    (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
