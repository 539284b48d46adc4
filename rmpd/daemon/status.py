"""What the daemon tells of itself: ``rmp status`` (the local API's ``status``) and its local clients' metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rmpd import localapi
from rmpd.localapi import Request
from rmpd.protocol.status import GroupStatus

from .group_status import group_details

if TYPE_CHECKING:
    from .translator import Translator


def local_status(hub: Translator, request: Request) -> dict[str, Any]:
    """The answer to ``status`` (without ``all``): the process, each group (or the one asked for) and the
    counters."""
    runtime: Any = hub.runtime  # the process loop: status reads more of it than the translator does
    groups = []
    for group in runtime.groups():
        if request.group and group != request.group:
            continue
        view = runtime.view(group)
        status = runtime.status(group)
        clients = hub.attachments.clients(group)
        groups.append({
            "group": group,
            "view": str(view.view_id) if view else None,
            "members": list(view.members) if view else [],
            "joining": status is None,  # listed, with no membership yet
            "persistent": hub.kept.keeps(group),
            "min_partition": localapi.min_partition_name(view.min_partition) if view else None,
            "ttl": runtime.group_ttl.get(group),  # what its multicasts go out with
            "clients": len(clients),
            "locks": hub.locks.held(group),
            "buffers": buffers(hub, group, status),
            "scmp": status.scmp if status is not None else {},
            **group_details(runtime, group, clients),  # type: ignore[arg-type]
        })
    counters = runtime.counters()
    counters.update({f"hub_{k}": v for k, v in hub.stats.items()})
    return {"pid": runtime.pid, "socket": hub.socket_path, "groups": groups,
            "clients": len(hub.sessions), "auth": runtime.guard.describe(), "counters": counters,
            "metrics": hub.metrics_address, "reload": hub.last_reload}


def buffers(hub: Translator, group: str, status: GroupStatus | None) -> dict[str, int]:
    """What the group holds in memory here: OrderingQ slots, data packets, own packets in flight and queued,
    the bytes queued for its local clients, and the sequence numbers given to clients whose message was not
    delivered here yet (``own_pending``)."""
    held = {"orderingq": status.orderingq_slots, "packets": status.packets_held, "in_flight": status.in_flight,
            "send_queue": status.send_queue} if status is not None else {}
    return {**held, "client_bytes": sum(c.queued_bytes for c in hub.attachments.clients(group)),
            "own_pending": hub.sends.held(group)}


def client_metrics(hub: Translator) -> list[Metric]:
    """The local clients and what waits for them, for the metrics endpoint (read when scraped)."""
    clients = GaugeMetricFamily("rmpd_clients", "Local clients connected.", value=len(hub.sessions))
    frames = GaugeMetricFamily("rmpd_client_queue_frames", "Frames queued for local clients, by group (the "
                               "largest of one client, and all together).", labels=["group", "of"])
    counters = CounterMetricFamily("rmpd_hub_events", "The local API's counters, by name.", labels=["counter"])
    for group in hub.attachments.groups():
        sizes = [c.queued_frames for c in hub.attachments.clients(group)] or [0]
        frames.add_metric([group, "largest"], max(sizes))
        frames.add_metric([group, "all"], sum(sizes))
    for name, value in hub.stats.items():
        counters.add_metric([name], value)
    return [clients, frames, counters]


__all__ = ["buffers", "client_metrics", "local_status"]
