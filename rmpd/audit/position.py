"""Each record's place in its writer's journal as one number, ``pos``, so sorts and windows compare one long.

A process's records are taken in the order it wrote them: by rotation number in the file name, then file (by a
hash of its URI: an arbitrary but fixed order between files with the same rotation number), then input split
(``blk``, its byte offset), then Spark's row ID, which grows along each split.  Sorting on those four columns made
every sort and window compare four keys per row; instead the job that fills the cache also lists the splits it
read (a few rows per file), the driver orders them and gives each a block of numbers as wide as its range of row
IDs, and ``pos = rid + delta`` is looked up per row through a broadcast join on the split.  ``pos`` is unique
across the whole input and orders one file's records as they were written.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .schema import POS

_ROTATION = r"\.(\d+)\.json[l]?(\.gz)?$"
_PART_BITS = 33
"""``monotonically_increasing_id`` puts the partition number above the low 33 bits (row number in the partition)."""


@dataclass(frozen=True)
class Split:
    """One input split as read: its file and offset, the partition that read it, and what it held."""

    file: str
    blk: int
    part: int
    rot: int
    fid: int
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
        .select(
            "*",
            F.coalesce(F.regexp_extract("file", _ROTATION, 1).try_cast("int"), F.lit(0)).alias("rot"),
            F.xxhash64("file").alias("fid"),
        )
        .collect()
    )
    return [Split(**r.asDict()) for r in rows]


def positioned(spark: SparkSession, lines: DataFrame, found: list[Split]) -> DataFrame:
    """``lines`` with ``pos`` in place of ``file``, ``blk`` and ``rid``."""
    base = 0
    deltas = []
    for s in sorted(found, key=lambda s: (s.rot, s.fid, s.blk, s.part)):
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


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
