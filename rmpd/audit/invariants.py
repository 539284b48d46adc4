"""The journal invariants in report order, each a pure ``tables -> Check`` transform."""

from __future__ import annotations

from collections.abc import Callable

from .check import Check
from .exactly_once import exactly_once
from .membership import atomicity, virtual_synchrony
from .ordering import no_duplicate, one_order, source_order, total_order
from .resilience import k_resilience
from .scmp_check import scmp_at_most_once
from .tables import Tables

GROUP_CHECKS: tuple[Callable[[Tables], Check], ...] = (
    one_order,
    total_order,
    no_duplicate,
    source_order,
    virtual_synchrony,
    atomicity,
    k_resilience,
    scmp_at_most_once,
    exactly_once,
)
"""The checks that judge each group on its own records; ``unique-view-id`` judges every group's view names
together (``membership.unique_view_id``)."""


def group_checks(tables: Tables) -> list[Check]:
    """Build every per-group check over ``tables`` (whose base is the records of whole groups)."""
    return [make(tables) for make in GROUP_CHECKS]
