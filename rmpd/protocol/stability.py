"""What each member is known to hold, which is what resilient delivery and freeing the OrderingQ wait for.

An ACK (or a Confirm of a pass) from a member proves it holds every packet through the last one it orders (section
4.2).  A K-resilient, majority or safe packet is delivered once enough members are known to hold it (figure 3.2,
over MaxN, the largest view any held packet was ordered in), and a slot is freed once every member that was a
member at its timestamp holds it.
"""

from __future__ import annotations

from .ids import ProcessId
from .orderingq import OrderingQ
from .qos import QoS
from .view import View


class Holdings:
    """Per member, the highest timestamp it is known to hold everything through; and the view sizes for MaxN."""

    def __init__(self, pid: ProcessId, view: View, start_ts: int, q: OrderingQ) -> None:
        self.pid = pid
        self.q = q
        self.through: dict[ProcessId, int] = {m: start_ts for m in view.members if m != pid}
        """What each other member is known to hold: everything through ``through[m]``."""
        self.member_since: dict[ProcessId, int] = {m: start_ts for m in view.members}
        self.view_sizes: list[tuple[int, int]] = [(start_ts, view.size)]
        """(timestamp, view size) of each view still in the OrderingQ, for MaxN."""

    def learn(self, member: ProcessId, through: int) -> None:
        if member != self.pid and through > self.through.get(member, through):
            self.through[member] = through

    def holders_of(self, ts: int) -> int:
        """How many members are known to hold the slot at ``ts`` (this process counts when it holds it).

        A member that joined after ``ts`` never held it, whatever its later ACKs say."""
        since = self.member_since
        count = 1 if self.q.contig >= ts else 0
        for m, h in self.through.items():  # a plain loop: this runs for every slot freed
            if h >= ts and since.get(m, 0) <= ts:
                count += 1
        return count

    def eligible(self, ts: int, view: View) -> int:
        """Members that can still prove they hold ``ts``: this process and the others of ``view`` that were
        members at ``ts``.  A member that left on its own had its messages ordered before it went, so a packet is
        not held back waiting for it."""
        since, pid = self.member_since, self.pid
        count = 1
        for m in view.members:
            if m != pid and since.get(m, 0) <= ts:
                count += 1
        return count

    def needed(self, qos: QoS, ts: int, view: View) -> int:
        """Members that must be known to hold the slot at ``ts`` before a resilient packet there is delivered: the
        QoS rule over MaxN, lowered to the members that can still prove it (``eligible``)."""
        return min(qos.required_holders(self.max_n()), self.eligible(ts, view))

    def max_n(self) -> int:
        """MaxN: the largest view any packet still held was ordered in."""
        return max(size for _, size in self.view_sizes)

    def view_changed(self, ts: int, old: View, new: View) -> None:
        """A New List at ``ts`` moves from ``old`` to ``new``: newcomers hold nothing before it."""
        for m in new.members:
            if m not in old:
                self.member_since[m] = ts
                if m != self.pid:
                    self.through.setdefault(m, ts)
        for m in old.members:
            if m not in new:
                self.through.pop(m, None)
        self.view_sizes.append((ts, new.size))

    def freed(self, base: int) -> None:
        """Slots before ``base`` were freed: views older than the one in force at ``base`` no longer count."""
        sizes = self.view_sizes
        if len(sizes) > 1 and sizes[1][0] <= base:
            sizes.pop(0)

    def reformed(self, ts: int, size: int) -> None:
        """A reformation's New List at ``ts``: every member of the new view reached the sync point, so all it
        holds is stable in the new view, and views the failed members were part of no longer count towards MaxN."""
        for member in self.through:
            self.through[member] = max(self.through[member], ts)
        self.view_sizes = [(ts, size)]

    def all_hold(self, ts: int, view: View) -> bool:
        """Every other member of ``view`` is known to hold everything through ``ts``."""
        return all(self.through.get(m, -1) >= ts for m in view.members if m != self.pid)
