"""The planned faults done to the cluster one after another, and each one as it happened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from .cluster import Cluster
from .monitor import Monitor
from .plan import BURST_LOSS, KILL, LOSS_BURST, RESTART_ALL, Fault


@dataclass
class FaultRecord:
    """One fault as it happened (seconds since the faults began)."""

    kind: str
    hosts: list[int]
    began: float
    healed: float
    recovered_after: float | None = None
    """Seconds from the heal (or restart) to one view of all hosts, when seen before the next fault began."""
    split: bool = False
    """Some look between the fault's start and that one view found the hosts not in one view of all of them: the
    fault broke the view (a partition or loss burst shorter than ``fail_after`` often does not)."""


async def run_faults(cluster: Cluster, monitor: Monitor, faults: list[Fault], say: Any, *,
                     settle: float = 0.0) -> tuple[list[FaultRecord], float, float]:
    """Inject ``faults``, each after its gap of base loss counted from the previous one's heal; the records, the
    moment the faults began, and the moment of the last heal (trio clock).

    ``settle`` > 0: a fault also waits (up to that many seconds) until the hosts were seen in one view of all of
    them after the previous heal, so one fault never lands on a group still short of the host the previous one
    took away (two kills in a row on 3 hosts would leave one member below a majority, and the group would stop)."""
    options = cluster.options
    t0 = trio.current_time()
    records: list[FaultRecord] = []
    previous_end = 0.0
    for fault in faults:
        gap = fault.at - previous_end
        await trio.sleep(gap)
        if settle > 0 and records:
            waited = trio.current_time()
            if await monitor.wait_one_view(t0 + records[-1].healed, settle) is None:
                say(f"{trio.current_time() - t0:6.1f}s  no one view within {settle:.0f} s: the next fault goes anyway")
            elif trio.current_time() - waited > 0.5:
                say(f"{trio.current_time() - t0:6.1f}s  one view again after {trio.current_time() - waited:.1f} s "
                    f"more than the gap")
        began = trio.current_time()
        if records:
            last = records[-1]
            seen = monitor.first_one_view(t0 + last.healed, began)
            last.recovered_after = None if seen is None else round(seen - t0 - last.healed, 2)
            last.split = monitor.split(t0 + last.began, began if seen is None else seen)
        say(f"{began - t0:6.1f}s  {fault.describe(cluster.n)}")
        if fault.kind in (KILL, RESTART_ALL):
            await trio.to_thread.run_sync(lambda f=fault: [cluster.kill(h) for h in f.hosts])
        elif fault.kind == LOSS_BURST:
            await trio.to_thread.run_sync(cluster.set_loss, BURST_LOSS)
        else:
            await trio.to_thread.run_sync(cluster.partition, fault)
        await trio.sleep(fault.hold)
        if fault.kind in (KILL, RESTART_ALL):
            async with trio.open_nursery() as nursery:  # all at once for restart-all
                for host in fault.hosts:
                    nursery.start_soon(trio.to_thread.run_sync, cluster.start, host)
            what = "restarted"
        else:
            await trio.to_thread.run_sync(cluster.heal, options.loss)
            what = "healed"
        healed = trio.current_time()
        say(f"{healed - t0:6.1f}s    {what} ({', '.join(f'h{h}' for h in fault.hosts) or 'all links'})")
        records.append(FaultRecord(fault.kind, list(fault.hosts), round(began - t0, 2), round(healed - t0, 2)))
        previous_end = fault.end
    return records, t0, trio.current_time()
