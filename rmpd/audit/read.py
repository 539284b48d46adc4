"""Find journal files and read them into one narrow, typed, cached DataFrame, with a position for every record.

Journals are read as text and parsed with ``from_json`` against the explicit schema in PERMISSIVE mode, so a bad
line becomes a row with its raw text in the corrupt-record column instead of failing the job.  Every line is parsed
once: the columns the checks read (``schema.COLUMNS``, QoS already normalized) are cached together with why the
line is invalid, if it is, and everything else is dropped before caching.  The job that fills the cache also
counts the invalid lines per input split; only when there is one are the journals read again to name the first
bad file and line.  For a large input that cache is the only copy: each record's position (``position``) is
worked out from its split columns where a check reads it (a broadcast lookup), and the record count is the sum of
the splits' counts, so no second job copies or counts the records.  A small input is read into one partition,
which one task checks.  Reading as text (not with the JSON source) keeps blank
lines as rows, so line numbers count every line of the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from . import columnar
from .inputs import JOURNAL_SUFFIXES, UnreadableInput
from .position import copy_deltas, positioned, positioned_copies, splits
from .records import qos_name
from .schema import COLUMNS, CORRUPT, EVENTS, JOURNAL_SCHEMA, SCHEMA_VERSION


@dataclass(frozen=True)
class Journals:
    """The valid records and how many there are; ``release`` drops the cache they are read from when done."""

    records: DataFrame
    count: int
    caches: tuple[DataFrame, ...]
    copies: list[tuple[str, int]] | None = None
    """When every journal was read from a columnar copy: each copy's local path and the delta that makes its line
    numbers positions (``position.copy_deltas``), for the checks' tasks to read the copies themselves."""

    def release(self) -> None:
        for cache in self.caches:
            cache.unpersist()


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
    """Lines of ``files`` parsed against the schema, with ``file``, ``blk``, ``rid`` and ``blank``.

    ``blk`` is the byte offset of the input split the line was read from and ``rid`` Spark's monotonically
    increasing row ID, which grows along each split: together with the file they give the line's place.
    """
    text = spark.read.text(files)
    return text.select(
        F.from_json(
            "value", JOURNAL_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        ).alias("j"),
        F.col("_metadata.file_path").alias("file"),
        F.col("_metadata.file_block_start").alias("blk"),
        F.monotonically_increasing_id().alias("rid"),
        (F.trim("value") == "").alias("blank"),
    ).select("j.*", "file", "blk", "rid", "blank")


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


def typed(raw: DataFrame) -> DataFrame:
    """The non-blank lines as the checks read them: ``COLUMNS`` with QoS normalized, the line's place, ``why``."""
    return raw.where(~F.col("blank")).select(
        *[F.expr(qos_name(c)).alias(c) if c == "qos" else F.col(c) for c in COLUMNS],
        "file", "blk", "rid", problem(raw).alias("why"),
    )


def read_journals(spark: SparkSession, paths: list[str], one_partition: bool = False) -> Journals:
    """Read and validate journals; raises :class:`UnreadableInput` naming the first bad file and line.

    ``one_partition`` caches the records as one partition, for a small input, which one task then checks whole.
    """
    files = list_files(spark, paths)
    made = columnar.copies(files) if columnar.wanted(small=one_partition) else None
    if made is not None:
        return _read_copies(spark, paths, files, made, one_partition)
    raw = parse(spark, files)
    lines = typed(raw)
    lines = (lines.coalesce(1) if one_partition else lines).persist()
    try:
        found = splits(lines)
    except Exception as exc:  # py4j wraps every JVM error: only a file that failed to read is the input's fault
        lines.unpersist()
        unreadable = read_failure(exc)
        if unreadable is None:
            raise
        raise unreadable from None
    if any(s.bad for s in found):
        lines.unpersist()
        raise _first_bad(raw)
    if not any(s.rows for s in found):
        lines.unpersist()
        raise UnreadableInput(", ".join(paths), None, "no records (every journal file is empty)")
    records = positioned(spark, lines.drop("why"), found)
    count = sum(s.rows for s in found)
    return Journals(records, count, (lines,))


def _read_copies(spark: SparkSession, paths: list[str], files: list[str], made: list[columnar.Copy],
                 one_partition: bool) -> Journals:
    """The records of journals that all have columnar copies (``columnar``): already valid and counted, so no job
    runs here.  The checks' tasks read the copies themselves (``Journals.copies``); the records as a DataFrame are
    there for whoever wants them through Spark."""
    count = sum(c.rows for c in made)
    if count == 0:
        raise UnreadableInput(", ".join(paths), None, "no records (every journal file is empty)")
    # ``file:`` and the path as it is: Hadoop takes a URI's text as written (``as_uri`` would escape a space as %20).
    scan = spark.read.parquet(*[f"file://{c.parquet}" for c in made])
    lines = scan.select(
        *[F.expr(qos_name(c)).alias(c) if c == "qos" else F.col(c) for c in COLUMNS],
        F.col("_metadata.file_name").alias("copy"), columnar.LINE,
    )
    named = [(uri, Path(c.parquet).name, c.rows) for uri, c in zip(files, made, strict=True)]
    records = positioned_copies(spark, lines, named)
    local = copy_deltas([(uri, c.parquet, c.rows) for uri, c in zip(files, made, strict=True)])
    return Journals(records.coalesce(1) if one_partition else records, count, (), local)


_READ_FAILED = re.compile(r"Encountered error while reading file (\S+?)\.?\s")
_CAUSE = re.compile(r"Caused by: (?:[\w$]+\.)*([\w$]+)(?:: ([^\n]*))?")


def read_failure(exc: Exception) -> UnreadableInput | None:
    """The file Spark failed to read in ``exc`` (a truncated or corrupt ``.gz``, a file that vanished), with the
    deepest cause Java gives, or None when ``exc`` is not about reading a file."""
    text = str(exc)
    failed = _READ_FAILED.search(text)
    if failed is None:
        return None
    causes = _CAUSE.findall(text)
    reason = "cannot be read"
    if causes:
        name, message = causes[-1]
        reason += f": {message.strip() or name}"
    return UnreadableInput(_local_name(failed.group(1)), None, reason)


def _first_bad(raw: DataFrame) -> UnreadableInput:
    """The first invalid line, by file, then place in the file, with its line number (blank lines count)."""
    bad = raw.where(~F.col("blank")).select("file", "blk", "rid", problem(raw).alias("why")).where("why IS NOT NULL")
    row = bad.orderBy("file", "blk", "rid").limit(1).collect()[0]
    line = (
        raw.where(
            (F.col("file") == row.file)
            & ((F.col("blk") < row.blk) | ((F.col("blk") == row.blk) & (F.col("rid") < row.rid)))
        ).count()
        + 1
    )
    return UnreadableInput(_local_name(row.file), line, row.why)


def _local_name(uri: str) -> str:
    """Show ``file:`` URIs as plain paths, which is what a person typed; keep other schemes."""
    return re.sub(r"^file:(//)?(?=/)", "", uri)
