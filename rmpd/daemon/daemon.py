"""The daemon: one process loop, the local client server, signals and readiness, one nursery per concern.

Start-up order matters to callers: the UDP socket and the Unix socket are bound first, the kept memberships (the
config's ``groups`` and the groups recorded by ``rmp join``) are being rejoined, then the service manager hears
READY=1 and a line on stderr says where the daemon serves, so anything waiting for readiness can use it at
once.  SIGTERM (or SIGINT) makes the daemon leave every group cleanly, so the other members install a view without
it instead of waiting to declare it failed, and then exit 0.  SIGHUP reloads what a running daemon can change
(rmpd.daemon.reload) and leaves its groups as they are.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import trio

from rmpd.runtime.auth import DatagramGuard
from rmpd.runtime.journal import FlushingJournal
from rmpd.runtime.loop import ProcessLoop

from .config import DaemonConfig
from .hub import Hub
from .memberships import MembershipFile
from .metrics_http import open_metrics_listeners
from .notify import sd_notify
from .probe import multicast_loops
from .reload import MetricsEndpoint, Reloader
from .server import bind_unix_listener, serve_clients

log = logging.getLogger("rmpd")

LEAVE_TIMEOUT = 5.0
"""On SIGTERM, wait at most this long for the groups to commit our leave before exiting anyway."""
CLOSE_TIMEOUT = 1.0
"""Then at most this long for the local clients to be sent their last frames (``shutting-down``)."""


async def run_daemon(config: DaemonConfig, guard: DatagramGuard | None = None,
                     reread: Callable[[], DaemonConfig] | None = None) -> None:
    """Serve until SIGTERM; reload on SIGHUP.  ``guard`` is ``config.guard(...)`` loaded by the caller so key
    errors surface before anything is bound; built here when not given.  ``reread`` reads the config again as it
    was read for ``config`` (the same file and flags), for a reload; without it a reload reads only the kept
    groups file again."""
    ip = config.address()
    journal = None
    if config.journal is not None:
        journal = FlushingJournal(config.journal, compress=config.journal_compress,
                                  rotate_bytes=config.journal_rotate_bytes)
    loop = ProcessLoop(ip=ip, port=config.port, engine_config=config.engine_config(),
                        address_range=config.address_range, ttl=config.ttl, multicast=config.multicast,
                        journal=journal, guard=guard or config.guard(Counter()),
                        scmp=config.scmp_settings(None), latest_path=config.latest_path, via=config.via)
    kept = MembershipFile(config.memberships_path(loop.pid))
    recorded = kept.load()  # MembershipFileError before anything is served: refuse to guess
    path = config.socket_path()
    listener = await bind_unix_listener(path, config.socket_mode, group=config.socket_group,
                                        dir_mode=config.runtime_dir_mode)
    hub = Hub(loop, str(path), overrun_frames=max(1, config.client_queue // 2), kept=kept)
    metrics_listeners, hub.metrics_address = [], None
    if config.metrics is not None:
        try:
            metrics_listeners, hub.metrics_address = await open_metrics_listeners(config.metrics)
        except BaseException:
            await listener.aclose()
            path.unlink(missing_ok=True)
            raise
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(loop.run)
                hub.rejoin_kept(config.groups, recorded)  # before any client and READY=1: the joins are under way
                await nursery.start(partial(serve_clients, listener, hub, queue_size=config.client_queue,
                                            max_frame=config.max_frame))
                endpoint = MetricsEndpoint(loop.metrics.registry, nursery)
                if hub.metrics_address is not None:
                    endpoint.serve(metrics_listeners, hub.metrics_address)
                reloader = Reloader(config, reread or (lambda: config), hub, kept, endpoint)
                if config.multicast and not multicast_loops(ip):
                    log.warning("multicast sent on %s does not come back to this host: daemons here will not hear "
                                "each other (on loopback: ip route add 224.0.0.0/4 dev lo)", ip)
                sd_notify(f"READY=1\nSTATUS=serving {loop.pid} on {path}")
                metrics = f", metrics on http://{hub.metrics_address}/metrics" if hub.metrics_address else ""
                print(f"rmpd: process {loop.pid}, clients on {path}{metrics}", file=sys.stderr, flush=True)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        log.info("signal SIGHUP: reloading the config")
                        sd_notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
                        report = await reloader.reload()
                        sd_notify(f"READY=1\nSTATUS=serving {loop.pid} on {path}; reloaded, "
                                  f"{len(report.not_applied)} change(s) wait for a restart")
                        continue
                    log.info("signal %s: leaving %d group(s)", signal.Signals(signum).name, len(loop.groups()))
                    sd_notify("STOPPING=1")
                    hub.leave_all()
                    with trio.move_on_after(LEAVE_TIMEOUT) as waited:
                        await loop.wait_idle()
                    if waited.cancelled_caught:
                        log.warning("groups still not left after %.0f s: exiting anyway", LEAVE_TIMEOUT)
                    hub.close_sessions(f"the daemon is shutting down ({signal.Signals(signum).name})")
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await hub.sessions_gone()
                    nursery.cancel_scope.cancel()
                    break
    finally:
        await listener.aclose()
        path.unlink(missing_ok=True)
