"""Whether a group can go on at one process: the minimum partition (docs/protocol.md) read as corosync's quorum.

A view is installed only when it keeps its old view's minimum partition, so a member in a view is quorate; it
stops being so when a reformation finds fewer members than the minimum (the proposal is aborted, and after
``minority_attempts`` aborts the membership stops), and stays blocked, with no view, until enough members of its
last view ask to join again for the group to be founded again, or an Alive shows that the group goes on elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

OPERATIONAL = "operational"
"""In a view, ordering and delivering."""
REFORMING = "reforming"
"""In a view, a reformation runs: nothing is ordered or delivered until it installs the next view."""
BELOW_MINIMUM = "below-minimum"
"""In a view, but the reformation under way found fewer members than the minimum partition: unless more are found
it stops the membership."""
BLOCKED = "blocked"
"""The membership stopped below the minimum partition: no view here, and too few members of the last view ask to
found the group again (nor is the group heard elsewhere)."""
REJOINING = "rejoining"
"""No view here; the group is heard elsewhere (or enough members ask to found it again): joining it again."""
JOINING = "joining"
"""Asked to join, no view yet."""
LEAVING = "leaving"
"""A leave was asked for (or the membership ended) and is not finished."""


@dataclass(frozen=True, slots=True)
class Quorum:
    """One group's standing at one process (``RmpProcess.quorum``)."""

    state: str
    """One of the names above."""
    members: int
    """Members counted: the view's size in a view; below the minimum, the partition the reformation found; blocked
    or rejoining, the members of the last view heard asking to join (this process included)."""
    needed: int
    """Members of the (last) view a next view needs: the minimum partition at that view's size (0 while joining)."""

    @property
    def quorate(self) -> bool:
        """The group goes on here: in a view whose reformation, if one runs, has not found it below its minimum."""
        return self.state in (OPERATIONAL, REFORMING)
