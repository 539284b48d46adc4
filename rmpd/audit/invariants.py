"""The journal invariants in report order, each a pure ``views -> Check`` transform."""

from __future__ import annotations

from collections.abc import Callable

from .check import Check
from .exactly_once import exactly_once
from .membership import atomicity, unique_view_id, virtual_synchrony
from .ordering import no_duplicate, one_order, source_order, total_order
from .resilience import k_resilience
from .schema import INVARIANTS
from .scmp_check import scmp_at_most_once
from .views import Views

CHECKS: tuple[Callable[[Views], Check], ...] = (
    one_order,
    total_order,
    no_duplicate,
    source_order,
    virtual_synchrony,
    atomicity,
    k_resilience,
    unique_view_id,
    scmp_at_most_once,
    exactly_once,
)


def journal_checks(views: Views) -> list[Check]:
    """Build every journal check over ``views`` (whose base is the records; nothing runs yet)."""
    checks = [make(views) for make in CHECKS]
    assert tuple(c.name for c in checks) == INVARIANTS
    return checks
