"""The tables an audit's checks are written against, as temporary views named for this audit only.

Every check is SQL text over these views, so each statement is parsed and analysed once in the JVM, instead of
one call into the JVM (and one analysis of the whole plan so far) per DataFrame operation.  A view that several
checks derive from (every delivery with its member's view; the claimed slots) is cached: Spark would otherwise
compute it again in every branch of the one query that counts every check.  ``release`` uncaches and drops them
all when the audit is done.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession


class Views:
    """Named SQL views over one input table (``base``), each built once per audit."""

    def __init__(self, spark: SparkSession, base: DataFrame) -> None:
        self.spark = spark
        self._prefix = f"rmp_audit_{uuid.uuid4().hex[:12]}_"
        self._names: dict[str, str] = {}
        self._cached: list[DataFrame] = []
        self.base = self._register("base", base)

    def table(self, name: str, build: Callable[[Views], str], cache: bool = False) -> str:
        """The view ``name``, defined by the SQL ``build(self)`` returns the first time it is asked for (cached
        when ``cache``); returns the name to use in SQL."""
        known = self._names.get(name)
        if known is not None:
            return known
        frame = self.spark.sql(build(self))
        if cache:
            self._cached.append(frame.persist())
        return self._register(name, frame)

    def sql(self, text: str) -> DataFrame:
        return self.spark.sql(text)

    def release(self) -> None:
        """Uncache and drop every view of this audit."""
        for frame in self._cached:
            frame.unpersist()
        for full in self._names.values():
            self.spark.catalog.dropTempView(full)
        self._cached.clear()
        self._names.clear()

    def _register(self, name: str, frame: DataFrame) -> str:
        full = self._prefix + re.sub(r"\W+", "_", name).strip("_")
        frame.createOrReplaceTempView(full)
        self._names[name] = full
        return full
