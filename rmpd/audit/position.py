"""Each record's place in its writer's journal as one number, ``pos``, so sorts and windows compare one long.

A process's records are taken in the order it wrote them: by rotation number in the file name, then file (by its
path: an arbitrary but fixed order between files with the same rotation number), then input split
(``blk``, its byte offset), then Spark's row ID, which grows along each split.  Sorting on those four columns made
every sort and window compare four keys per row; instead the job that fills the cache also lists the splits it
read (a few rows per file), the driver orders them and gives each a block of numbers as wide as its range of row
IDs, and ``pos = rid + delta`` is looked up per row through a broadcast join on the split.  ``pos`` is unique
across the whole input and orders one file's records as they were written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .inputs import local_path
from .schema import POS

_ROTATION = re.compile(r"\.(\d+)\.jsonl?(\.gz)?$")
_PART_BITS = 33
"""``monotonically_increasing_id`` puts the partition number above the low 33 bits (row number in the partition)."""


@dataclass(frozen=True)
class Split:
    """One input split as read: its file and offset, the partition that read it, and what it held."""

    file: str
    blk: int
    part: int
    lo: int
    hi: int
    rows: int
    bad: int


def splits(lines: DataFrame) -> list[Split]:
    """The splits ``lines`` was read from, with their row-ID ranges, record counts and invalid-line counts.

    ``lines`` has ``file``, ``blk``, ``rid`` and ``why``; this is the job that fills its cache.  A split appears
    once per partition that read it (the same file named twice is read twice), so its row IDs form one range.
    """
    part = F.shiftright("rid", _PART_BITS).alias("part")
    rows = (
        lines.groupBy("file", "blk", part)
        .agg(F.min("rid").alias("lo"), F.max("rid").alias("hi"), F.count(F.lit(1)).alias("rows"),
             F.count("why").alias("bad"))
        .collect()
    )
    return [Split(**r.asDict()) for r in rows]


def positioned(spark: SparkSession, lines: DataFrame, found: list[Split]) -> DataFrame:
    """``lines`` with ``pos`` in place of ``file``, ``blk`` and ``rid``."""
    base = 0
    deltas = []
    for s in sorted(found, key=lambda s: (*journal_order(s.file), s.blk, s.part)):
        deltas.append((s.file, s.blk, s.part, base - s.lo))
        base += s.hi - s.lo + 1
    # SQL values, not ``createDataFrame`` of a Python list, whose rows a Python worker process must unpickle: an
    # audit of journals then starts no Python worker at all.
    rows = ", ".join(f"({_sql_string(file)}, {blk}L, {part}L, {delta}L)" for file, blk, part, delta in deltas)
    table = spark.sql(f"SELECT * FROM VALUES {rows} AS splits(file, blk, part, delta)")
    keep = [c for c in lines.columns if c not in ("file", "blk", "rid")]
    return (
        lines.withColumn("part", F.shiftright("rid", _PART_BITS))
        .join(F.broadcast(table), ["file", "blk", "part"])
        .select(*keep, (F.col("rid") + F.col("delta")).alias(POS))
    )


def journal_order(uri: str) -> tuple[int, str]:
    """Where a journal file's records go among all files': by rotation number (0 when its name has none), then by
    path (files of one process have distinct rotation numbers; the path only fixes an order between processes)."""
    rotation = _ROTATION.search(uri)
    return (int(rotation.group(1)) if rotation else 0, local_path(uri) or uri)


def positioned_copies(spark: SparkSession, lines: DataFrame, copies: list[tuple[str, str, int]]) -> DataFrame:
    """Records read from columnar copies (``copy`` the copy's file name, ``line`` the line number from 1) with
    ``pos`` in place of both; ``copies`` lists ``(journal URI, copy's file name, records)`` (``copy_deltas``)."""
    deltas = copy_deltas(copies)
    rows = ", ".join(f"({_sql_string(name)}, {delta}L)" for name, delta in deltas)
    table = spark.sql(f"SELECT * FROM VALUES {rows} AS copies(copy, delta)")
    keep = [c for c in lines.columns if c not in ("copy", "line")]
    return lines.join(F.broadcast(table), "copy").select(*keep, (F.col("line") + F.col("delta")).alias(POS))


def copy_deltas(copies: list[tuple[str, str, int]]) -> list[tuple[str, int]]:
    """``(copy, delta)`` for each of ``copies`` (``(journal URI, copy, records)``): a record's ``pos`` is its line
    number (from 1) plus its copy's delta.  Each copy holds one journal whole, so its records take one block of
    numbers, in the journals' order."""
    base = 0
    deltas = []
    for _, copy, rows in sorted(copies, key=lambda c: journal_order(c[0])):
        deltas.append((copy, base - 1))
        base += rows
    return deltas


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
