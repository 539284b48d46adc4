"""`rmp bench`: goodput, latency and CPU cost of real rmpd processes beside raw UDP multicast, in one run."""

from __future__ import annotations

import itertools
import json
import platform
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rmpd.bench.run import Hosts

bench_app = typer.Typer()
Runner = TypeVar("Runner")

QOS_SWEEP = ("unordered", "source", "total", "safe")
SIZE_SWEEP = (100, 1000, 8000)
MEMBER_SWEEP = (2, 3, 4, 5)
GUARDS = ("none", "mac", "encrypt")


def member_counts(values: list[str] | None) -> list[int] | None:
    """``--members``: each value one group size or several separated by commas (``2,3,5,9``)."""
    if not values:
        return None
    counts = []
    for value in values:
        for part in value.split(","):
            try:
                count = int(part)
            except ValueError:
                raise typer.BadParameter(f"{part!r} is not a group size", param_hint="--members") from None
            if not 1 <= count <= 16:
                raise typer.BadParameter(f"{count} is not in 1..16", param_hint="--members")
            counts.append(count)
    return counts


def plan(members: list[int], sizes: list[int], qos: list[str], senders: list[int], embedded: bool) -> list[Any]:
    """The cases asked for: every combination; senders default to 1 and 'all members' (only 1 for one case)."""
    from rmpd.bench.run import Case

    single = len(members) == len(sizes) == len(qos) == 1
    cases = []
    for m, size, q in itertools.product(members, sizes, qos):
        counts = senders or ([1] if single else sorted({1, m}))
        for k in counts:
            cases.append(Case(m, k, size, q))
            if embedded:
                cases.append(Case(m, k, size, q, embedded=True))
    return cases


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def delivered_all(result: dict[str, Any]) -> str:
    """"yes", or how many messages the member that received fewest is short of what was sent."""
    if result["complete"]:
        return "yes"
    return f"[red]no: {result['sent'] - min(result['received']):,} missing[/red]"


def render(results: list[dict[str, Any]], console: Console) -> None:
    from rich.table import Table

    table = Table(title="rmp bench: messages delivered per second per member (goodput) vs raw UDP multicast")
    for column in ("members", "senders", "size", "qos", "where", "raw msg/s", "rmpd msg/s", "ratio",
                   "p50 ms", "p99 ms", "CPU µs/msg", "raw CPU µs/msg", "daemon peak RSS MiB", "all delivered"):
        table.add_column(column, justify="right")
    for r in results:
        cpu = r["cpu_s_per_msg"] * 1e6 if r["cpu_s_per_msg"] is not None else None
        raw_cpu = r["baseline_cpu_s_per_msg"] * 1e6 if r["baseline_cpu_s_per_msg"] is not None else None
        rss = max(r["peak_rss_kib"]) / 1024 if r["peak_rss_kib"] else None
        table.add_row(str(r["members"]), str(r["senders"]), str(r["size"]), r["qos"],
                      "embedded" if r["embedded"] else "daemons", fmt(r["baseline_msgs_per_s"]),
                      fmt(r["msgs_per_s"]), fmt(r["ratio"], 2), fmt(r["p50_ms"], 2), fmt(r["p99_ms"], 2),
                      fmt(cpu, 1), fmt(raw_cpu, 1), fmt(rss, 1), delivered_all(r))
    console.print(table)


def render_transfers(results: list[dict[str, Any]], console: Console) -> None:
    """One row per destination; the case's figures on its first row."""
    from rich.table import Table

    first = results[0]
    rate = f"links at {first['rate']}" if first["rate"] else "unshaped links"
    loss = f", {first['loss']:.0%} loss" if first["loss"] else ""
    table = Table(title=f"rmp bench: transfers over {rate}{loss}: goodput per destination as a fraction of the wire")
    probing = "probe_p99_ms" in first
    for column in ("dest", "senders", "bytes", "size", "qos", "member", "received", "seconds", "KB/s", "of wire",
                   "wire B/B", "tx/packet", "ideal", "link drops", "send dropped", "reformations", "CPU max",
                   *(("probes", "probe p50 ms", "probe p99 ms", "probe max ms") if probing else ())):
        table.add_column(column, justify="right")
    for r in results:
        for i, d in enumerate(r["per_destination"]):
            case = [str(r["destinations"]), str(r["senders"]), f"{r['transfer']:,}", str(r["size"]), r["qos"]] \
                if i == 0 else [""] * 5
            totals = [fmt(r["transmissions_per_packet"], 3), fmt(r["ideal_transmissions_per_packet"], 3),
                      fmt(r["link_drops"]), f"{r['sender_send_dropped']:,}", str(r["reformations_started"]),
                      f"{r['busiest_cpu_fraction']:.0%}"] if i == 0 else [""] * 6
            received = f"{d['received']:,}"
            if not d["complete"]:
                received = f"[red]{received} of {r['messages']:,}[/red]"
            rate_kb = d["goodput_bytes_per_s"] / 1000 if d["goodput_bytes_per_s"] is not None else None
            probes = (probe_cells(r) if i == 0 else [""] * 4) if probing else []
            table.add_row(*case, str(d["member"]), received, fmt(d["seconds"], 2), fmt(rate_kb),
                          fmt(d["wire_fraction"], 3), fmt(d["wire_bytes_per_payload_byte"], 3), *totals, *probes)
    console.print(table)


def probe_cells(result: dict[str, Any]) -> list[str]:
    """The case's probe: messages timed over every destination (and those missing), p50, p99, max."""
    timed = f"{result['probes_timed']:,}"
    if result["probes_missing"]:
        timed += f" [red]({result['probes_missing']:,} missing)[/red]"
    return [timed, *(fmt(result[name], 1) for name in ("probe_p50_ms", "probe_p99_ms", "probe_max_ms"))]


def incomplete(result: dict[str, Any]) -> str:
    """One line: a transfer that did not complete in time, and how far each destination got."""
    got = ", ".join(f"{d['received']:,}" for d in result["per_destination"])
    return (f"transfer to {result['destinations']} destination(s) not complete after {result['timeout']:.0f} s: "
            f"of {result['messages']:,} messages they received {got}")


@bench_app.command("bench")
def bench(
    members: Annotated[list[str] | None, typer.Option(
        "--members", help="Group size; repeat or separate with commas for several (default: 2 3 4 5; with a "
                          "transfer, one destination).")] = None,
    size: Annotated[list[int] | None, typer.Option(
        "--size", min=1, max=60000, help="Message size in bytes; repeat (default: 100 1000 8000).")] = None,
    qos: Annotated[list[str] | None, typer.Option(
        "--qos", help="unordered, source, total, safe, k2, majority...; with +key (total+key) each message carries "
        "a key of its own; repeat (default: the first four).")] = None,
    senders: Annotated[list[int] | None, typer.Option(
        "--senders", min=1, help="Sending clients; repeat (default: 1 and one per member; 1 for a single case).")]
    = None,
    seconds: Annotated[float, typer.Option(min=0.5, help="Counting window per case, after 1 s of warm-up.")] = 5.0,
    embedded: Annotated[bool, typer.Option(
        "--embedded", help="Also measure each case with embedded-engine members instead of daemons.")] = False,
    guard: Annotated[str, typer.Option(
        help="Group key on every datagram: none, mac (BLAKE2b) or encrypt (ChaCha20-Poly1305).")] = "none",
    bind: Annotated[str, typer.Option(help="Address the daemons and the baseline use (without --netns).")]
    = "127.0.0.1",
    netns: Annotated[bool, typer.Option(
        "--netns", help="One network namespace per member on a bridge (scripts/netns; needs root).")] = False,
    loss: Annotated[float, typer.Option(
        min=0.0, max=0.9, help="With --netns: drop this fraction of datagrams at random (iptables).")] = 0.0,
    rate: Annotated[str | None, typer.Option(
        help="With --netns: every link at this rate both ways (tbf; tc's units, e.g. 10mbit), and measure a "
             "transfer instead of a window.")] = None,
    transfer: Annotated[str | None, typer.Option(
        help="Measure a transfer of this many payload bytes in all (e.g. 5MB) from the senders to the other "
             "members (default with --rate: 5MB).")] = None,
    timeout: Annotated[float | None, typer.Option(
        min=1.0, help="Seconds a transfer may take (default: 4 times its time at the rate, plus 30).")] = None,
    probe: Annotated[float | None, typer.Option(
        min=0.1, max=1000.0, help="With a transfer: a client on the first destination's host sends this many "
                                  "100-byte total-order messages a second meanwhile; report their latency.")] = None,
    daemon_config: Annotated[Path | None, typer.Option(
        "--daemon-config", exists=True, dir_okay=False,
        help="The daemons' config file (e.g. [timers] max_packet); the bench's join timers override its own.")]
    = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="End with one JSON object: the case's figures, or {'cases': [...]} for several.")] = False,
) -> None:
    """Measure rmpd against raw UDP multicast through the same socket layer, in one run.

    Starts real rmpd daemons on loopback (new ones for each case, so that no case runs beside the groups of the
    one before), clients that join through the client library, and, per case: goodput
    (messages per second per member, counted in the clients), its ratio to the raw baseline, latency p50/p99 as half
    a ping-pong round trip at light load, CPU seconds per delivered message of all processes, and each daemon's
    peak resident memory.

    With --rate or --transfer, the RMP paper's transfer test instead: the senders transfer the given size to the
    members that do not send; per destination its goodput as a fraction of the wire and its transfer time, and
    data transmissions per packet beside the ideal for the group's size and loss.  With --probe, the latency of
    a light stream of small total-order messages sent meanwhile.
    """
    from rmpd.bench.run import Bench
    from rmpd.bench.worker import parse_qos

    err = Console(stderr=True)
    for q in qos or []:
        try:
            parse_qos(q)
        except ValueError as exc:
            err.print(f"[red]error:[/red] --qos {q}: {exc}")
            raise typer.Exit(2) from None
    if guard not in GUARDS:
        err.print(f"[red]error:[/red] --guard must be one of {', '.join(GUARDS)}")
        raise typer.Exit(2)
    if loss and not netns:
        err.print("[red]error:[/red] --loss needs --netns (loss is made with iptables inside namespaces)")
        raise typer.Exit(2)
    if rate is not None and not netns:
        err.print("[red]error:[/red] --rate needs --netns (the rate is set with tbf inside namespaces)")
        raise typer.Exit(2)
    if probe is not None and rate is None and transfer is None:
        err.print("[red]error:[/red] --probe goes with a transfer (--rate or --transfer)")
        raise typer.Exit(2)
    if rate is not None or transfer is not None:
        transfer_bench(members=member_counts(members) or [max(senders or [1]) + 1], sizes=size or [1000],
                       qos=qos or ["total"], senders=senders or [1], bind=bind, netns=netns, loss=loss, rate=rate,
                       transfer=transfer or "5MB", timeout=timeout, probe=probe, daemon_config=daemon_config,
                       guard=guard, json_out=json_out)
        return
    cases = plan(member_counts(members) or list(MEMBER_SWEEP), size or list(SIZE_SWEEP), qos or list(QOS_SWEEP),
                 senders or [], embedded)

    def start(workdir: Path, hosts: Hosts, progress: Callable[[str], None]) -> Bench:
        return Bench(workdir, seconds=seconds, guard=guard, hosts=hosts, daemon_config=daemon_config,
                     progress=progress)

    results = run_cases(cases, start, lambda bench, case: bench.run(case), lambda bench: bench.close(), bind=bind,
                        netns=netns, loss=loss, rate=None, err=err)
    out = Console(stderr=json_out)
    render(results, out if out.is_terminal else Console(stderr=json_out, width=200))
    if json_out:
        print_json(results)


def run_cases(cases: Sequence[Any], start: Callable[[Path, Hosts, Callable[[str], None]], Runner],
              run: Callable[[Runner, Any], dict[str, Any]], close: Callable[[Runner], None], *, bind: str,
              netns: bool, loss: float, rate: str | None, err: Console) -> list[dict[str, Any]]:
    """Run ``cases`` one after another on hosts made for the largest, with a progress line: what both modes share.
    ``start`` makes the runner from a work directory, the hosts and a progress callback; a setup or run failure
    ends the command with exit status 1 and one line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rmpd.bench.run import BenchError, Hosts
    from rmpd.daemon.probe import multicast_loops

    if not netns and not multicast_loops(bind):
        err.print(f"[red]error:[/red] multicast does not loop back on {bind}; as root: ip route add 224.0.0.0/4 dev lo")
        raise typer.Exit(1)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rmp-bench-") as tmp, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as progress:
        task = progress.add_task("starting", total=len(cases))
        try:
            hosts = Hosts(bind=bind, netns=max(c.members for c in cases) if netns else 0, loss=loss, rate=rate)
        except BenchError as exc:
            err.print(f"[red]error:[/red] {exc}", soft_wrap=True)
            raise typer.Exit(1) from None
        runner = start(Path(tmp), hosts, lambda text: progress.update(task, description=text))
        try:
            for case in cases:
                results.append(run(runner, case))
                progress.advance(task)
        except BenchError as exc:
            err.print(f"[red]benchmark failed:[/red] {exc}", soft_wrap=True)
            raise typer.Exit(1) from None
        finally:
            close(runner)
    return results


def print_json(results: list[dict[str, Any]]) -> None:
    machine = {"cpus": _cpu_count(), "cpu": _cpu_model(), "python": platform.python_version()}
    body = results[0] if len(results) == 1 else {"cases": results}
    typer.echo(json.dumps({**body, "machine": machine}))


def transfer_bench(*, members: list[int], sizes: list[int], qos: list[str], senders: list[int], bind: str,
                   netns: bool, loss: float, rate: str | None, transfer: str, timeout: float | None,
                   probe: float | None, daemon_config: Path | None, guard: str, json_out: bool) -> None:
    """``rmp bench --rate`` / ``--transfer``: each case a transfer; exit 1 when one did not complete in time."""
    from rmpd.bench.run import Bench
    from rmpd.bench.transfer import TransferBench, TransferCase, parse_rate, parse_size

    err = Console(stderr=True)
    try:
        total = parse_size(transfer)
        if rate is not None:
            parse_rate(rate)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    cases = [TransferCase(m, k, s, q, total) for m, s, q, k in itertools.product(members, sizes, qos, senders)]
    for case in cases:
        if case.destinations < 1:
            err.print(f"[red]error:[/red] {case.members} members with {case.senders} sender(s) leave no "
                      "destination (a destination is a member that does not send)")
            raise typer.Exit(2)
    def start(workdir: Path, hosts: Hosts, progress: Callable[[str], None]) -> TransferBench:
        # Every daemon serves its metrics on its own host's loopback: data datagrams are counted there.
        bench = Bench(workdir, seconds=0, guard=guard, hosts=hosts, daemon_config=daemon_config,
                      daemon_args=["--metrics", "127.0.0.1:0"], progress=progress)
        return TransferBench(bench, rate=rate, timeout=timeout, probe=probe)

    results = run_cases(cases, start, lambda runner, case: runner.run(case), lambda runner: runner.bench.close(),
                        bind=bind, netns=netns, loss=loss, rate=rate, err=err)
    out = Console(stderr=json_out)
    render_transfers(results, out if out.is_terminal else Console(stderr=json_out, width=200))
    if json_out:
        print_json(results)
    failed = [r for r in results if not r["complete"]]
    for result in failed:
        err.print(f"[red]error:[/red] {incomplete(result)}", soft_wrap=True)
    if failed:
        raise typer.Exit(1)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
