"""What a reformation asks of the member it runs at (``ReformationHost``, reformation.py), on the engine's side:
freezing and unfreezing the parts, its sync point and catching up to the shared one, and installing the new view.
Departing and stopping are ending.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ids import ProcessId
from .packets import NewList
from .reformation import SyncPoint

if TYPE_CHECKING:
    from .liveness import Liveness
    from .ordering import Ordering
    from .outbox import Outbox
    from .repair import Repair
    from .rotation import Rotation
    from .sender import Sender
    from .stability import Holdings
    from .timers import TimerRegistry
    from .token import Token
    from .viewchange import ViewChanges


class ReformationSide:
    """The part of ``GroupEngine`` a reformation drives."""

    pid: ProcessId
    outbox: Outbox
    ordering: Ordering
    holdings: Holdings
    token: Token
    sender: Sender
    repair: Repair
    changes: ViewChanges
    liveness: Liveness
    rotation: Rotation
    timers: TimerRegistry

    if TYPE_CHECKING:
        def _progress(self, now: float) -> None: ...

    def sync_point(self) -> SyncPoint:
        return self.ordering.sync_point()

    def catch_up(self, target: SyncPoint, now: float) -> None:
        self.repair.catch_up(target, now)

    def freeze(self) -> None:
        self.token.freeze()
        self.timers.stop(frozen=True)

    def unfreeze(self, now: float) -> None:
        self.sender.unfreeze(now)
        self.changes.unfreeze(now)
        self.liveness.resume(now)

    def new_list_fields(self) -> tuple[tuple[tuple[ProcessId, int], ...], int]:
        return tuple(self.changes.requests_done.items()), self.changes.join_floor

    def recently_heard(self, member: ProcessId, now: float) -> bool:
        return self.liveness.recently_heard(member, now)

    def reformed(self, nl: NewList, initiator: bool, now: float) -> None:
        """Phase two: drop everything beyond the sync point, install the New List, go on in the new view.  Members
        that stay never deliver two orders: what lay beyond the sync point is ordered again."""
        for packet in self.ordering.truncate(nl.ts - 1, self.pid):
            self.sender.in_flight_again(packet)
        self.token.forget_beyond(nl.ts - 1)
        self.rotation.on_new_list(nl, now)
        self.holdings.reformed(nl.ts, len(nl.members))
        self.outbox.record("recovery", now, ts=nl.ts - 1, version=nl.request_id, role="commit",
                           members=[m for m, _ in nl.members], new_view=str(nl.new_view))
        if initiator:
            self.token.take(nl.ts, 0)
        self.unfreeze(now)
        self._progress(now)
        if initiator and self.token.have_token:
            self.rotation.send_ack((), 1, now)  # pass the token at once: the members commit on this ACK
            self._progress(now)
