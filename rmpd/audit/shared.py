"""Tables several invariants derive from the same records, built once per audit and cached.

Spark recomputes a DataFrame in every query branch that uses it: without this, each member's first deliveries
(a shuffle over every delivery) were computed for total order, no-duplicate and source order separately, and the
slot claims for one-order and total order.  ``shared`` builds such a table once per records DataFrame and persists
it; ``release`` unpersists them when the audit is done.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

_tables: dict[int, tuple[DataFrame, dict[str, DataFrame]]] = {}


def shared(records: DataFrame, name: str, build: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """``build(records)``, persisted, the same object for every caller until ``release(records)``."""
    entry = _tables.get(id(records))
    if entry is None or entry[0] is not records:
        entry = _tables[id(records)] = (records, {})
    table = entry[1].get(name)
    if table is None:
        table = entry[1][name] = build(records).persist()
    return table


def keep(records: DataFrame, name: str, table: DataFrame) -> DataFrame:
    """``table``, an intermediate result a check reads more than once, persisted until ``release(records)``.

    Spark plans each use of a DataFrame separately and, across the branches of one query, does not always reuse
    the shuffle that computed it; a persisted table is computed once.
    """
    return shared(records, name, lambda _: table)


def release(records: DataFrame) -> None:
    """Unpersist every table built from ``records``."""
    _, tables = _tables.pop(id(records), (None, {}))
    for table in tables.values():
        table.unpersist()
