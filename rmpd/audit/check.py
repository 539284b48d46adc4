"""What every invariant check is, and a helper to shape its violation rows."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import EXAMPLE_FIELDS

_TYPES = {"node": "STRING", "group": "STRING", "view": "STRING", "ts": "BIGINT", "src": "STRING", "seq": "BIGINT",
          "detail": "STRING"}


@dataclass(frozen=True)
class Check:
    """One invariant as SQL queries: the items it covers and the items that break it.

    Nothing runs until the report asks for counts, so every check is counted in one query over the cached tables.
    ``violations`` has the columns of ``EXAMPLE_FIELDS``.  ``tally``, when given, counts both without listing
    them: rows whose ``c`` and ``x`` columns sum to the number of items checked and the number of violations (the
    rows of ``checked`` and ``violations``).  A check whose items are a product (every member of a view change
    times every message of it) tallies per factor instead of building the product; ``violations`` is then
    listed only when examples are wanted.  ``noun``, when given, names what the tally's ``k`` column sums to, for
    the report to say alongside the verdict (how many of what the invariant is about the input held, when that can
    be none: an invariant that holds over nothing says so).
    """

    name: str
    checked: str | None
    violations: str
    tally: str | None = None
    noun: str | None = None

    def counts(self) -> str:
        """SQL whose rows' ``c`` and ``x`` sum to the items checked and the violations."""
        if self.tally is not None:
            return self.tally
        return (f"SELECT count(1) AS c, 0 AS x FROM ({self.checked}) "
                f"UNION ALL SELECT 0 AS c, count(1) AS x FROM ({self.violations})")


def example(
    source: str,
    node: str = "NULL",
    view: str = "NULL",
    ts: str = "NULL",
    src: str = "NULL",
    seq: str = "NULL",
    detail: str = "NULL",
    group: str = '"group"',
) -> str:
    """SQL selecting the shared example columns from ``source`` (a FROM clause), each given as an expression."""
    given = {"node": node, "group": group, "view": view, "ts": ts, "src": src, "seq": seq, "detail": detail}
    columns = ", ".join(f"TRY_CAST({given[name]} AS {_TYPES[name]}) AS \"{name}\"" for name in EXAMPLE_FIELDS)
    return f"SELECT {columns} FROM {source}"
