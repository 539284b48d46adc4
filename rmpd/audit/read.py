"""Find journal files and read them into one DataFrame, with a file and line for every record.

Journals are read as text and parsed with ``from_json`` against the explicit schema in PERMISSIVE mode, so a bad
line becomes a row with its raw text in the corrupt-record column instead of failing the job; the driver then asks
only for the first bad row and reports its file and line.  Reading as text (not with the JSON source) keeps blank
lines as rows, so line numbers count every line of the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from .schema import CORRUPT, EVENTS, JOURNAL_SCHEMA, SCHEMA_VERSION

JOURNAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
"""File names taken from directories; files named explicitly are read whatever their name."""

_ROTATION = r"\.(\d+)\.json[l]?(\.gz)?$"


class UnreadableInput(Exception):
    """Input that cannot be audited: a missing path, no journal files, or a record that does not parse."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {reason}")
        self.file = file
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Journals:
    """The parsed journal lines (``raw``, blank lines included, cached) and the valid records of it."""

    raw: DataFrame
    records: DataFrame


def list_files(spark: SparkSession, paths: list[str], suffixes: tuple[str, ...] = JOURNAL_SUFFIXES) -> list[str]:
    """Expand directories recursively through Hadoop's FileSystem, so any URI Spark reads works.

    Only names are listed on the driver; the contents are read by the executors.
    """
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out: list[str] = []
    for text in paths:
        path = jvm.org.apache.hadoop.fs.Path(text)
        fs = path.getFileSystem(conf)
        if not fs.exists(path):
            raise UnreadableInput(text, None, "no such file or directory")
        status = fs.getFileStatus(path)
        if status.isFile():
            out.append(status.getPath().toString())
            continue
        found = []
        it = fs.listFiles(path, True)
        while it.hasNext():
            name = it.next().getPath().toString()
            if name.endswith(suffixes):
                found.append(name)
        if not found:
            raise UnreadableInput(text, None, f"no journal files ({', '.join(suffixes)}) in this directory")
        out.extend(sorted(found))
    return out


def parse(spark: SparkSession, files: list[str]) -> DataFrame:
    """Lines of ``files`` parsed against the schema, with ``file``, ``rot``, ``fid``, ``blk``, ``rid`` and ``blank``."""
    text = spark.read.text(files)
    file = F.col("_metadata.file_path")
    return text.select(
        F.from_json(
            "value", JOURNAL_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        ).alias("j"),
        file.alias("file"),
        F.coalesce(F.regexp_extract(file, _ROTATION, 1).try_cast("int"), F.lit(0)).alias("rot"),
        F.xxhash64(file).alias("fid"),
        F.col("_metadata.file_block_start").alias("blk"),
        F.monotonically_increasing_id().alias("rid"),
        (F.trim("value") == "").alias("blank"),
    ).select("j.*", "file", "rot", "fid", "blk", "rid", "blank")


def problem(df: DataFrame) -> Column:
    """Why a non-blank parsed line is not a valid record, or null when it is."""
    return (
        F.when(F.col(CORRUPT).isNotNull(), F.lit("not a JSON object matching the journal schema"))
        .when(F.col("v").isNull(), F.lit("missing schema version v"))
        .when(F.col("v") != SCHEMA_VERSION, F.concat(F.lit("unsupported schema version "), F.col("v")))
        .when(F.col("node").isNull(), F.lit("missing node"))
        .when(F.col("event").isNull(), F.lit("missing event"))
        .when(~F.col("event").isin(*EVENTS), F.concat(F.lit("unknown event "), F.col("event")))
    )


def read_journals(spark: SparkSession, paths: list[str]) -> Journals:
    """Read and validate journals; raises :class:`UnreadableInput` naming the first bad file and line."""
    files = list_files(spark, paths)
    raw = parse(spark, files).persist()
    bad = raw.where(~F.col("blank")).select("file", "blk", "rid", problem(raw).alias("why")).where("why IS NOT NULL")
    first = bad.orderBy("file", "blk", "rid").limit(1).collect()
    if first:
        row = first[0]
        line = (
            raw.where(
                (F.col("file") == row.file)
                & ((F.col("blk") < row.blk) | ((F.col("blk") == row.blk) & (F.col("rid") < row.rid)))
            ).count()
            + 1
        )
        raw.unpersist()
        raise UnreadableInput(_local_name(row.file), line, row.why)
    records = raw.where(~F.col("blank")).drop(CORRUPT, "blank", "file")
    return Journals(raw, records)


def _local_name(uri: str) -> str:
    """Show ``file:`` URIs as plain paths, which is what a person typed; keep other schemes."""
    return re.sub(r"^file:(//)?(?=/)", "", uri)
