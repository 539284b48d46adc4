"""The tables a journal audit's checks are written against, in one DuckDB connection per task.

Every journal check is SQL text over these tables.  A Spark task holds the records of a few groups (every record
of each; ``grouped``) as Arrow batches, and DuckDB runs the checks over them in that task: a vectorized engine over
columns already in memory answers the windows, aggregations and joins of every invariant in one pass of each,
where Spark planned a stage and a shuffle per operator.  A table several checks derive from is materialized once;
the rest are views DuckDB inlines where they are read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

BASE = "records"
"""Name of the input table: the records as ``records.flat`` shapes them."""


class Tables:
    """Named SQL tables over one input (``base``), each defined once per connection."""

    def __init__(self, connection: Any, base: str = BASE) -> None:
        self.connection = connection
        self.base = base
        self._names: dict[str, str] = {}

    def table(self, name: str, build: Callable[[Tables], str], cache: bool = False) -> str:
        """The table ``name``, defined by the SQL ``build(self)`` returns the first time it is asked for
        (materialized when ``cache``); returns the name to use in SQL."""
        known = self._names.get(name)
        if known is not None:
            return known
        full = "t_" + re.sub(r"\W+", "_", name).strip("_")
        kind = "TABLE" if cache else "VIEW"
        self.connection.execute(f"CREATE TEMP {kind} {full} AS {build(self)}")
        self._names[name] = full
        return full

    def rows(self, sql: str) -> list[dict[str, Any]]:
        """The rows of ``sql`` as dicts."""
        result = self.connection.execute(sql)
        names = [d[0] for d in result.description]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]
