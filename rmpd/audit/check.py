"""What every invariant check returns, and helpers to shape its violation rows."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .schema import EXAMPLE_FIELDS


@dataclass(frozen=True)
class Check:
    """One invariant as lazy DataFrames: the items it covers and the items that break it.

    Nothing runs until the report asks for counts, so all checks can share one pass over the cached records.
    ``violations`` has the columns of ``EXAMPLE_FIELDS``.  ``tally``, when given, counts both without listing
    them: rows whose ``c`` and ``x`` columns sum to the number of items checked and the number of violations (the
    rows of ``checked`` and ``violations``).  A check whose items are a product (every member of a view change
    times every message of it) tallies per factor instead of building the product; ``violations`` is then
    listed only when examples are wanted.
    """

    name: str
    checked: DataFrame
    violations: DataFrame
    tally: DataFrame | None = None


def example(
    df: DataFrame,
    node: Column | None = None,
    view: Column | None = None,
    ts: Column | None = None,
    src: Column | None = None,
    seq: Column | None = None,
    detail: Column | None = None,
    group: Column | None = None,
) -> DataFrame:
    """Project ``df`` onto the shared example columns; ``group`` defaults to the column of that name."""
    defaults = {"node": "string", "group": "string", "view": "string", "ts": "long", "src": "string",
                "seq": "long", "detail": "string"}
    if group is None and "group" in df.columns:
        group = F.col("group")
    given = {"node": node, "group": group, "view": view, "ts": ts, "src": src, "seq": seq, "detail": detail}
    return df.select(
        *[
            (F.lit(None) if given[name] is None else given[name]).cast(defaults[name]).alias(name)
            for name in EXAMPLE_FIELDS
        ]
    )
