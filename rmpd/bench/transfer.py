"""A transfer of a given size over links with a rate: the RMP paper's section 5 test (figure 5.2).

One sender, or several at once, transfers a given number of bytes, as messages of one size, to a group in which
the other members only receive (the destinations).  Per destination the bench reports its goodput as a fraction
of the wire (payload bytes delivered over the link's bytes per second, the rate that tbf holds every link to) and
its transfer time, from the first send to its last delivery; for the case, data transmissions per data packet
beside the ideal for the group's size and loss, and what the daemons counted meanwhile (datagrams the senders'
daemons dropped, reformations started).

Data transmissions are counted where they leave: every daemon's ``rmpd_datagrams_total{direction="out",
type="data"}`` (the metrics endpoint, served on each daemon's own loopback), first sends, retransmissions on a
timeout and answers to NACKs alike, as they are handed to the socket (one it refuses counts too).  Distinct data
packets are what a destination's engine delivered (``delivered`` counts packets, a packet carrying many packed
messages).  With a rate, tbf's own counters say what each link carried and what its queue dropped.

With a probe, one more client, on the first destination's host (a member that does not send the transfer), sends
small total-order messages at a steady rate while the transfer runs, each stamped with its send time; every
destination times each one from that stamp to its delivery there (one machine, one clock).  Only probes sent while
the transfer was running count: from its first send to that destination's last delivery of it.  A probe sent then
and never delivered there is counted as missing, not timed.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from .daemons import DaemonProcess
from .run import Bench, BenchError, Worker, percentile

RATE_UNITS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "kibit": 1 << 10, "mibit": 1 << 20, "gibit": 1 << 30,
    "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "kibps": 8 << 10, "mibps": 8 << 20, "gibps": 8 << 30,
}
"""tc's rate units, in bits per second (tc's ``bps`` is bytes per second)."""
SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20,
              "gib": 1 << 30}
COUNTERS = ("send_dropped", "send_errors", "reformations_started", "reformations_aborted", "data_retransmits",
            "nacks_answered", "nack_resends_suppressed", "nack_resends_held", "nacks_sent", "tail_nacks_sent",
            "gap_nacks_sent", "window_halved_nack", "window_halved_timeout", "ack_retransmits", "ack_copies",
            "delivered", "datagrams_sent")
"""The daemons' counters a transfer reports (their growth during it)."""
PROBE_SIZE = 100
"""Bytes of a probe's message: small, as a control or chat message beside a bulk transfer."""
START_DELAY = 0.5
"""Seconds between telling the workers when to begin and the beginning, so that all begin together."""
DATA_OUT = re.compile(r'^rmpd_datagrams_total\{direction="out",type="data"\} (\S+)$', re.MULTILINE)
SCRAPE = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"


def parse_rate(spec: str) -> float:
    """Bytes per second of a tc rate such as ``10mbit``; ValueError naming the mistake."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", spec.strip().lower())
    if match is None or match.group(2) not in RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"a rate is a number and one of tc's units ({', '.join(RATE_UNITS)}), e.g. 10mbit; "
                         f"got {spec!r}")
    return float(match.group(1)) * RATE_UNITS[match.group(2)] / 8


def parse_size(spec: str) -> int:
    """Bytes of ``5MB`` (decimal units: 1 MB is 10^6 bytes; MiB binary); ValueError naming the mistake."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", spec.strip().lower())
    if match is None or match.group(2) not in SIZE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"a size is a number and B, KB, MB, GB, KiB, MiB or GiB, e.g. 5MB; got {spec!r}")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])


def ideal_transmissions(receivers: int, loss: float) -> float:
    """Expected transmissions of one packet until each of ``receivers`` has it, for the bench's loss: ``loss``
    end to end, made as a drop with probability q = 1 - sqrt(1 - loss) on the way out of the sender (lost to
    everyone) and another on the way in at each receiver (independent).

    E[T] = sum over k >= 0 of P(someone lacks it after k transmissions), and after k transmissions, j of which
    left the sender (binomial), every receiver has it with probability (1 - q^j)^receivers.  For independent loss
    p at each receiver alone this would be sum (1 - (1 - p^k)^receivers); with no loss it is 1."""
    if receivers <= 0 or loss <= 0:
        return 1.0
    q = 1 - math.sqrt(1 - loss)
    expected = 0.0
    for k in range(10_000):
        have_all = sum(math.comb(k, j) * (1 - q) ** j * q ** (k - j) * (1 - q**j) ** receivers
                       for j in range(k + 1))
        expected += 1 - have_all
        if 1 - have_all < 1e-9:
            break
    return expected


@dataclass(frozen=True)
class TransferCase:
    members: int
    senders: int
    size: int
    qos: str
    transfer: int
    """Payload bytes in all, over every sender."""

    @property
    def destinations(self) -> int:
        return self.members - self.senders

    @property
    def messages(self) -> int:
        return -(-self.transfer // self.size)

    def label(self) -> str:
        return (f"{self.destinations} destination(s), {self.senders} sender(s), {self.transfer:,} B as "
                f"{self.size} B {self.qos}")


def default_timeout(transfer: int, rate_bytes: float | None) -> float:
    """Four times the transfer's time at the link's rate (at 1 Gb/s without one), plus 30 s."""
    return 4 * transfer / (rate_bytes or 125e6) + 30


class TransferBench:
    """Transfer cases on daemons that ``bench`` starts for each (with their metrics on their own loopback)."""

    def __init__(self, bench: Bench, *, rate: str | None, timeout: float | None, probe: float | None = None) -> None:
        """``probe``: messages a second of the light stream sent beside each transfer (None: no probe)."""
        self.bench = bench
        self.probe = probe
        self.rate = rate
        self.rate_bytes = parse_rate(rate) if rate else None
        self.timeout = timeout
        self._groups = 0

    def run(self, case: TransferCase) -> dict[str, Any]:
        bench = self.bench
        if case.senders >= case.members:
            raise BenchError(f"{case.members} members and {case.senders} senders leave no destination")
        self._groups += 1
        group = f"transfer-{bench.run_id}-{self._groups}"
        daemons = bench.fresh_daemons(case.members)
        common = ["--group", group, "--members", str(case.members), "--qos", case.qos, "--size", str(case.size)]
        shares = [case.messages // case.senders + (i < case.messages % case.senders) for i in range(case.senders)]
        specs = [("transfer", i, [*common, "--socket", str(daemons[i].socket), "--send-count", str(shares[i])])
                 for i in range(case.senders)]
        probing = ["--probes"] if self.probe else []
        specs += [("transfer", i, [*common, "--socket", str(daemons[i].socket), "--expect", str(case.messages),
                                   *probing]) for i in range(case.senders, case.members)]
        if self.probe:
            specs.append(("probe", case.senders, ["--group", group, "--members", str(case.members), "--qos", "total",
                                                  "--size", str(PROBE_SIZE), "--probe-rate", str(self.probe),
                                                  "--socket", str(daemons[case.senders].socket)]))
        bench.progress(f"{case.label()}: joining")
        workers = bench.group_workers(specs)
        timeout = self.timeout or default_timeout(case.transfer, self.rate_bytes)
        try:
            for w in workers:
                w.ready()
            before = [self._counters(i, d) for i, d in enumerate(daemons)]
            cpu_before = [d.cpu_seconds() for d in daemons]
            begin = time.time() + START_DELAY
            deadline = begin + timeout
            for w in workers:
                w.start(begin, deadline)
            bench.progress(f"{case.label()}: transferring (at most {timeout:.0f} s)")
            arrived = [w.result(timeout=deadline - time.time() + 30)
                       for w in workers[case.senders:case.members]]
            cpu = [after - earlier for after, earlier in zip([d.cpu_seconds() for d in daemons], cpu_before,
                                                             strict=True)]
            after = [self._counters(i, d) for i, d in enumerate(daemons)]
            sent = [self._sender_result(w) for w in workers[:case.senders]]
            probed = [self._sender_result(w) for w in workers[case.members:]]
        finally:
            for w in workers:
                w.kill()
        report = self._report(case, begin, timeout, sent, arrived, before, after, cpu)
        if self.probe:
            report.update(self._probe_report(report, arrived, probed[0]))
        return report

    @staticmethod
    def _sender_result(worker: Worker) -> dict[str, Any]:
        """The sender's line (written once the group accepted all it posted, or at the deadline; the probe's once
        it stopped), once its stdin is closed, which lets it leave the group."""
        worker.close_input()
        return worker.result(timeout=30)

    def _counters(self, i: int, daemon: DaemonProcess) -> dict[str, int]:
        """The daemon's counters of interest, its data datagrams sent (from its metrics endpoint) and, with a
        rate, what its host's links carried and dropped (``up_bytes``, ``down_drops``, ...)."""
        status = daemon.status()
        counters = {name: status["counters"].get(name, 0) for name in COUNTERS}
        counters["data_out"] = self._data_out(i, status.get("metrics"))
        for way, link in (self.bench.hosts.link_counters(i) or {}).items():
            counters.update({f"{way}_{name}": value for name, value in link.items()})
        return counters

    def _data_out(self, i: int, address: str | None) -> int:
        if address is None:
            raise BenchError("a daemon serves no metrics: the transfer counts data datagrams there")
        result = subprocess.run([*self.bench.hosts.prefix(i), sys.executable, "-c", SCRAPE,
                                 f"http://{address}/metrics"], capture_output=True, text=True, timeout=30)
        match = DATA_OUT.search(result.stdout)
        if result.returncode != 0 or match is None:
            raise BenchError(f"could not read data datagrams from daemon {i + 1}'s metrics: {result.stderr[-500:]}")
        return int(float(match.group(1)))

    def _report(self, case: TransferCase, begin: float, timeout: float, sent: list[dict[str, Any]],
                arrived: list[dict[str, Any]], before: list[dict[str, int]], after: list[dict[str, int]],
                cpu: list[float]) -> dict[str, Any]:
        grew = [{name: a[name] - b[name] for name in a} for a, b in zip(after, before, strict=True)]
        first_send = min((s["first_send"] for s in sent if s.get("first_send")), default=begin)
        destinations = []
        for i, result in enumerate(arrived):
            # A destination that did not complete is measured over all the time it was given.
            seconds = result["last_delivery"] - first_send if result["complete"] else None
            over = seconds or begin + timeout - first_send
            payload = result["received"] * case.size
            link = grew[case.senders + i]
            destinations.append({
                "member": case.senders + i + 1,
                "received": result["received"],
                "complete": result["complete"],
                "seconds": seconds,
                "goodput_bytes_per_s": payload / over,
                "wire_fraction": payload / over / self.rate_bytes if self.rate_bytes else None,
                # What its link carried to it per payload byte delivered (headers, repairs, control), and the
                # datagrams (or fragments) its link's queue dropped.
                "wire_bytes_per_payload_byte": link["down_bytes"] / payload if "down_bytes" in link and payload
                else None,
                "link_drops": link.get("down_drops"),
            })
        complete = all(d["complete"] for d in destinations)
        elapsed = max(r["last_delivery"] or 0.0 for r in arrived) - begin if complete else timeout
        # Distinct data packets: what every destination delivered, once all have everything.
        packets = max(grew[case.senders + i]["delivered"] for i in range(case.destinations)) if complete else None
        data_out = sum(g["data_out"] for g in grew)
        loss = self.bench.hosts.loss
        return {
            **asdict(case), "destinations": case.destinations, "messages": case.messages,
            "rate": self.rate, "rate_bytes_per_s": self.rate_bytes, "loss": loss, "timeout": timeout,
            "begin": begin, "first_send": first_send,
            "complete": complete,
            "sent": [s["sent"] for s in sent],
            "undelivered": sum(s["undelivered"] for s in sent),
            "per_destination": destinations,
            "data_packets": packets,
            "data_transmissions": data_out,
            "transmissions_per_packet": data_out / packets if packets else None,
            "ideal_transmissions_per_packet": ideal_transmissions(case.members - 1, loss),
            "sender_send_dropped": sum(g["send_dropped"] for g in grew[:case.senders]),
            "link_drops": sum(g.get("up_drops", 0) + g.get("down_drops", 0) for g in grew) if self.rate else None,
            "reformations_started": max(g["reformations_started"] for g in grew),
            "daemon_counters": grew,
            "daemon_cpu_s": cpu,
            "client_cpu_s": [r["cpu_s"] for r in [*sent, *arrived]],
            # The busiest process's share of one core over the transfer: near 1.0, a core rather than the link
            # may be the limit.
            "busiest_cpu_fraction": max([*cpu, *(r["cpu_s"] for r in [*sent, *arrived])]) / elapsed,
            # Cores the transfer's processes kept busy together: near the machine's count, the cores are the limit.
            "cpu_cores_used": (sum(cpu) + sum(r["cpu_s"] for r in [*sent, *arrived])) / elapsed,
        }

    def _probe_report(self, report: dict[str, Any], arrived: list[dict[str, Any]],
                      probe: dict[str, Any]) -> dict[str, Any]:
        """The probe's latency while the transfer ran: per destination (added to its entry) and over all of them
        (``probe_p50_ms``, ``probe_p99_ms``, ``probe_max_ms``)."""
        first_send = report["first_send"]
        everyone: list[float] = []
        missing = 0
        for destination, result in zip(report["per_destination"], arrived, strict=True):
            until = result["last_delivery"] if result["complete"] else report["begin"] + report["timeout"]
            due = [t for t in probe["sent_at"] if first_send <= t <= until]
            timed = {sent_at: latency * 1000 for sent_at, latency in result["probes"] if first_send <= sent_at <= until}
            latencies = sorted(timed.values())
            everyone += latencies
            missing += len(due) - len(timed)
            destination.update({"probes": len(due), "probes_missing": len(due) - len(timed),
                                **probe_figures(latencies)})
        return {"probe_rate": self.probe, "probe_size": PROBE_SIZE, "probe_member": report["senders"] + 1,
                "probes_sent": len(probe["sent_at"]),
                "probes_timed": len(everyone), "probes_missing": missing, **probe_figures(everyone),
                "client_cpu_s": [*report["client_cpu_s"], probe["cpu_s"]]}


def probe_figures(latencies_ms: list[float]) -> dict[str, float | None]:
    """p50, p99 and maximum of probe latencies (None without any): the same figures per destination and per case."""
    return {"probe_p50_ms": percentile(latencies_ms, 0.5), "probe_p99_ms": percentile(latencies_ms, 0.99),
            "probe_max_ms": max(latencies_ms, default=None)}


__all__ = ["TransferBench", "TransferCase", "default_timeout", "ideal_transmissions", "parse_rate", "parse_size"]
