"""Prometheus metrics of one process loop, in a ``prometheus_client`` registry of their own.

The daemon serves the registry over HTTP (``metrics = "127.0.0.1:9464"``); an embedded ``rmpd.Node`` hands it to
the program (``node.metrics``), which can serve or push it however it likes.  What changes per message is counted
by the loop where it already passes (one list index per datagram, one counter per delivery batch); everything the
engine and the loop count already (``ProcessLoop.counters``) and each group's state are read when a scrape asks,
by a collector, so nothing is copied on the hot path and the numbers are the very ones ``rmp status`` shows.  A
registry of its own (not the library's global one) keeps two Nodes in one program, or a test, from colliding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from rmpd.protocol.packets import PacketType
from rmpd.protocol.qos import QoS
from rmpd.protocol.token import ROTATION_BOUNDS

if TYPE_CHECKING:
    from .loop import ProcessLoop

PACKET_NAMES: dict[int, str] = {t.value: t.name.lower() for t in PacketType}
"""Wire type byte -> the name a metric label carries; any other byte counts as ``other``."""

DROP_REASONS: dict[str, str] = {
    "malformed": "malformed",
    "other_view": "other_view",
    "other_group": "other_group",
    "beyond_horizon": "beyond_horizon",
    "fragments_before_join": "fragment_before_join",
    "bad_frames": "bad_client_frame",
    "transmit_bad_dest": "bad_destination",
    "transmit_without_group": "no_group",
    "receive_errors": "receive_error",
    "non_member": "non_member",
    "auth_rejected": "auth_rejected",
}
"""Counters of input dropped (or output not sent), by the reason label they are exported under."""

RETRANSMISSIONS: dict[str, str] = {
    "data_retransmits": "data", "ack_retransmits": "ack", "request_retransmits": "request",
}
NACKS: dict[str, str] = {
    "nacks_sent": "nack", "gap_nacks_sent": "gap", "tail_nacks_sent": "tail", "hint_nacks_sent": "hint",
    "recovery_nacks": "recovery",
}

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds; a ring on one LAN delivers in milliseconds, a reformation in seconds."""

SENT_TIMES_KEPT = 4096
"""Own sends whose delivery latency is still awaited, at most: the oldest is forgotten past this (a message that is
never delivered here, unreliable or undelivered, must not be remembered for ever)."""


class LoopMetrics:
    """The registry of one process loop, and the few counts only the loop can make as traffic passes.

    ``datagrams_in``/``datagrams_out`` are indexed by the wire type byte (0-255).  ``sent`` and ``delivered``
    are called by the loop; the collector reads the rest from the loop when scraped.
    """

    def __init__(self, loop: ProcessLoop) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.datagrams_in = [0] * 256
        self.datagrams_out = [0] * 256
        self._deliveries = PromCounter(
            "rmpd_deliveries", "Messages delivered to the application, by group and QoS.", ["group", "qos"],
            registry=self.registry,
        )
        self._views = PromCounter("rmpd_views_installed", "Views installed, by group.", ["group"],
                                  registry=self.registry)
        self._latency = Histogram(
            "rmpd_delivery_latency_seconds",
            "From a send of this process to its delivery here, by QoS (the last message of each send request).",
            ["qos"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self._children: dict[tuple[str, QoS], PromCounter] = {}
        self._sent_at: dict[tuple[str, int], tuple[float, QoS]] = {}
        self.registry.register(_LoopCollector(loop, self))
        self.extra: list[Callable[[], Iterable[Metric]]] = []
        """Further families read at each scrape (the daemon's hub adds its clients' queues)."""

    def sent(self, group: str, seq: int, qos: QoS, now: float) -> None:
        """This process accepted message ``seq`` (the last of one send request) at ``now``."""
        sent_at = self._sent_at
        if len(sent_at) >= SENT_TIMES_KEPT:
            del sent_at[next(iter(sent_at))]
        sent_at[(group, seq)] = (now, qos)

    def delivered(self, group: str, qos: QoS, count: int, own_seq: int | None, now: float) -> None:
        """``count`` messages of ``group`` were handed to the application; ``own_seq`` is the last one's sequence
        number when this process sent it."""
        child = self._children.get((group, qos))
        if child is None:
            child = self._children[(group, qos)] = self._deliveries.labels(group, qos.name())
        child.inc(count)
        if own_seq is not None:
            sent = self._sent_at.pop((group, own_seq), None)
            if sent is not None:
                self._latency.labels(sent[1].name()).observe(now - sent[0])

    def view_installed(self, group: str) -> None:
        self._views.labels(group).inc()


class _LoopCollector(Collector):
    """What the loop and its engines count already, and each group's state, read at scrape time."""

    def __init__(self, loop: ProcessLoop, metrics: LoopMetrics) -> None:
        self._loop = loop
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        loop, metrics = self._loop, self._metrics
        datagrams = CounterMetricFamily("rmpd_datagrams", "RMP datagrams received and sent, by packet type.",
                                        labels=["direction", "type"])
        for direction, counts in (("in", metrics.datagrams_in), ("out", metrics.datagrams_out)):
            other = 0
            for code, count in enumerate(counts):
                if code in PACKET_NAMES:
                    datagrams.add_metric([direction, PACKET_NAMES[code]], count)
                else:
                    other += count
            datagrams.add_metric([direction, "other"], other)
        yield datagrams

        counters = loop.counters()
        yield _family("rmpd_drops", "Datagrams or requests dropped, by reason.", "reason", counters, DROP_REASONS)
        auth = CounterMetricFamily("rmpd_auth_rejected", "Datagrams that failed the group key's check, by reason.",
                                   labels=["reason"])
        for name, value in counters.items():
            if name.startswith("auth_rejected_"):
                auth.add_metric([name.removeprefix("auth_rejected_")], value)
        yield auth
        yield _family("rmpd_retransmissions", "Packets sent again, by kind.", "kind", counters, RETRANSMISSIONS)
        yield _family("rmpd_nacks_sent", "Negative acknowledgements sent, by kind.", "kind", counters, NACKS)
        yield _single("rmpd_reformations", "Reformations this process started.", counters, "reformations_started")
        yield _single("rmpd_merges", "Views of a group merged into another.", counters, "merges")
        events = CounterMetricFamily("rmpd_engine_events", "Every counter of the engine and the loop, by name "
                                     "(what rmp status lists).", labels=["counter"])
        for name, value in counters.items():
            events.add_metric([name], value)
        yield events

        gauges = {
            "members": GaugeMetricFamily("rmpd_group_members", "Members of the view this process is in.",
                                         labels=["group"]),
            "window": GaugeMetricFamily("rmpd_send_window_bytes", "The send window (Van Jacobson), in bytes.",
                                        labels=["group"]),
            "in_flight": GaugeMetricFamily("rmpd_send_in_flight", "Own packets sent and not yet ordered.",
                                           labels=["group"]),
            "send_queue": GaugeMetricFamily("rmpd_send_queue", "Own messages queued behind the send window.",
                                            labels=["group"]),
            "orderingq": GaugeMetricFamily("rmpd_orderingq_slots", "Slots held in the OrderingQ.",
                                           labels=["group"]),
            "packets": GaugeMetricFamily("rmpd_packets_held", "Data packets held (ordered and not yet stable, or "
                                         "not yet ordered).", labels=["group"]),
        }
        rotations = HistogramMetricFamily("rmpd_token_rotation_seconds", "From passing the token on to accepting it "
                                          "again, by group (a token resting on a quiet ring is not counted).",
                                          labels=["group"])
        for group in loop.groups():
            status = loop.status(group)
            if status is None:
                continue
            values = {"members": len(status.view.members), "window": status.window, "in_flight": status.in_flight,
                      "send_queue": status.send_queue, "orderingq": status.orderingq_slots,
                      "packets": status.packets_held}
            for key, family in gauges.items():
                family.add_metric([group], values[key])
            counts, total, _ = status.token_rotations()
            cumulative = list(itertools.accumulate(counts))
            bounds = [*map(str, ROTATION_BOUNDS), "+Inf"]
            rotations.add_metric([group], list(zip(bounds, cumulative, strict=True)), total)
        yield from gauges.values()
        yield rotations
        quorate = GaugeMetricFamily("rmpd_group_quorate", "1 while the group goes on here (in a view its reformation, "
                                    "if one runs, has not found below the minimum partition), else 0: joining, "
                                    "below the minimum, blocked or rejoining.", labels=["group"])
        for group in loop.groups():
            quorum = loop.quorum(group)
            if quorum is not None:
                quorate.add_metric([group], 1 if quorum.quorate else 0)
        yield quorate
        for extra in metrics.extra:
            yield from extra()


def _family(name: str, doc: str, label: str, counters: dict[str, int], names: dict[str, str]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for counter, value in names.items():
        family.add_metric([value], counters.get(counter, 0))
    return family


def _single(name: str, doc: str, counters: dict[str, int], counter: str) -> Metric:
    return CounterMetricFamily(name, doc, value=counters.get(counter, 0))
