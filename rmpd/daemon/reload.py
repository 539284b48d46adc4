"""SIGHUP: read the config again and apply what a running daemon can change; say what it could not.

What a running daemon changes without leaving its groups: the log level, the groups it keeps (the config's
``groups`` and the kept groups file of persistent joins, read again), and the metrics endpoint.  Everything else
(addresses, ports, sockets, keys, timers, ...) is bound into the process or its groups' state when they start, so
a changed value is reported as not applied, in the log, in ``rmp status --json`` (``reload``) and in the counters
(``hub_reload_not_applied``), and takes effect at the next start.  A config that cannot be read changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from rmpd.runtime.net import ConfigError

from .config import DaemonConfig
from .hub import Hub
from .memberships import MembershipFile, MembershipFileError
from .metrics_http import MetricsAddressError, open_metrics_listeners, serve_metrics

log = logging.getLogger("rmpd")

RELOADABLE = ("log_level", "groups", "metrics")
"""The config's keys a reload applies; every other key's change waits for a restart."""


def changes_needing_a_restart(running: DaemonConfig, read: DaemonConfig) -> list[str]:
    """The keys whose value in ``read`` differs from the running one and that a reload cannot apply."""
    return [spec.name for spec in dataclasses.fields(DaemonConfig)
            if spec.name not in RELOADABLE and getattr(running, spec.name) != getattr(read, spec.name)]


@dataclass
class ReloadReport:
    """What one reload did: shown in ``rmp status --json`` as ``reload``."""

    at: float
    """Wall-clock time of the reload (Unix seconds)."""
    applied: list[str] = field(default_factory=list)
    """Keys whose new value took effect."""
    not_applied: list[str] = field(default_factory=list)
    """Keys changed in the config that take effect only at the next start (and kept groups whose settings
    changed, which take effect when the group is joined again)."""
    errors: list[str] = field(default_factory=list)
    """What went wrong (the config or the kept groups file unreadable, a metrics address that cannot be served)."""

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class MetricsEndpoint:
    """The Prometheus endpoint, served in the daemon's nursery, which a reload may start, move or stop."""

    def __init__(self, registry: CollectorRegistry, nursery: trio.Nursery) -> None:
        self.registry = registry
        self.nursery = nursery
        self.address: str | None = None
        """Where it is served (``host:port`` as bound), None when it is not."""
        self._scope: trio.CancelScope | None = None

    def serve(self, listeners: list[trio.SocketListener], address: str) -> None:
        self.stop()
        self._scope = trio.CancelScope()
        self.address = address
        self.nursery.start_soon(self._run, self._scope, listeners)

    async def _run(self, scope: trio.CancelScope, listeners: list[trio.SocketListener]) -> None:
        with scope:
            await serve_metrics(self.registry, listeners)  # closes the listeners when cancelled

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        self._scope = self.address = None

    async def move(self, address: str | None) -> None:
        """Serve at ``address`` (None: stop).  The new address is bound before the old one is let go, so an
        address that cannot be served (MetricsAddressError) leaves the endpoint as it was."""
        if address is None:
            self.stop()
            return
        listeners, bound = await open_metrics_listeners(address)
        self.serve(listeners, bound)


class Reloader:
    """Applies a reload to a running daemon, and remembers the config as it now runs (so a change that was not
    applied is reported again at every reload until a restart)."""

    def __init__(self, running: DaemonConfig, read: Callable[[], DaemonConfig], hub: Hub, kept: MembershipFile,
                 metrics: MetricsEndpoint) -> None:
        self.running = running
        self.read = read
        """Reads the config as the daemon was started: the same file, the same flags on top."""
        self.hub = hub
        self.kept = kept
        self.metrics = metrics

    async def reload(self) -> ReloadReport:
        report = ReloadReport(at=round(time.time(), 3))
        self.hub.stats["reloads"] += 1
        try:
            read = self.read()
        except ConfigError as exc:
            report.errors.append(f"config not reloaded, nothing changed: {exc}")
        else:
            await self._apply(read, report)
        self.hub.stats["reload_not_applied"] += len(report.not_applied)
        self.hub.stats["reload_errors"] += len(report.errors)
        self.hub.last_reload = report.describe()
        log.info("reload: applied %s", ", ".join(report.applied) or "nothing (no change a reload applies)")
        if report.not_applied:
            log.warning("reload: not applied, changed keys that need a restart of rmpd: %s",
                        ", ".join(report.not_applied))
        for error in report.errors:
            log.error("reload: %s", error)
        return report

    async def _apply(self, read: DaemonConfig, report: ReloadReport) -> None:
        report.not_applied = changes_needing_a_restart(self.running, read)
        if read.log_level != self.running.log_level:
            logging.getLogger().setLevel(read.log_level.upper())
            report.applied.append("log_level")
        try:
            recorded = self.kept.load()
        except MembershipFileError as exc:
            report.errors.append(f"kept groups not reloaded, kept as they were: {exc}")
        else:
            before = {**self.hub.kept.recorded, **{m.group: m for m in self.running.groups}}
            joined, dropped = self.hub.reload_kept(read.groups, recorded)
            if joined or dropped:
                report.applied.append("groups")
                log.info("reload: joining %s; no longer keeping %s", ", ".join(joined) or "no group",
                         ", ".join(dropped) or "any group")
            now = {**recorded, **{m.group: m for m in read.groups}}
            report.not_applied += [f"groups: {group}'s min_partition or ttl (at its next join)"
                                   for group in sorted(before.keys() & now.keys())
                                   if before[group] != now[group] and self.hub.kept.keeps(group)]
        metrics = self.running.metrics
        if read.metrics != self.running.metrics:
            try:
                await self.metrics.move(read.metrics)
            except MetricsAddressError as exc:
                report.errors.append(f"metrics not moved: {exc}")
            else:
                metrics = read.metrics
                self.hub.metrics_address = self.metrics.address
                report.applied.append("metrics")
        self.running = dataclasses.replace(self.running, log_level=read.log_level, groups=read.groups,
                                           metrics=metrics)
