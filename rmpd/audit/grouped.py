"""The checks as Spark tasks: each task judges the records of whole groups with DuckDB.

Every journal invariant but one compares records of one group only, so the records are partitioned by group (one
shuffle) and each task runs every check over its groups' records in one DuckDB connection: a vectorized engine over
Arrow columns in memory, which answers a check's windows, aggregations and joins in one pass each, where Spark
planned a stage, and often a shuffle, per operator.  A task returns a few rows: each check's counts, up to the
wanted number of example violations, and the member lists its groups' views name, which the driver judges across
groups (``unique-view-id``: a view ID is global).  Spark reads the journals (any file system, any master) and
spreads groups over executors; a small input is one task.  A large input whose journals all have local columnar
copies is read by the tasks themselves, each keeping its share of the groups.  The packets of captures are
checked together in one task.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from .check import Check
from .invariants import group_checks
from .membership import unique_view_id, view_names
from .read import Journals
from .records import FIELD, ITEM, flat
from .report import Tally, tally
from .schema import EXAMPLE_FIELDS, INVARIANTS, WIRE_INVARIANTS
from .tables import BASE, Tables

RESULT_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("kind", "inv")]
    + [T.StructField(name, T.LongType()) for name in ("c", "x", "k")]
    + [T.StructField(name, T.LongType() if name in ("ts", "seq") else T.StringType())
       for name in ("noun", "node", "group", "view", "ts", "src", "seq", "detail")]
)
"""A task's result rows: ``kind`` is ``tally`` (``inv``, ``c``, ``x``, ``k``, ``noun``), ``example`` (``inv`` and
the example's fields), ``name`` (a view ID in ``view``, its member list in ``detail``, ``group`` and ``node``) or
``count`` (records read, in ``c``)."""

_NAMES = "names"
"""The driver's table of every task's view names."""


def audit(spark: SparkSession, journals: Journals, examples: int, one_task: bool) -> list[Tally]:
    """Judge every journal invariant over ``journals``; one tally per invariant, in ``INVARIANTS`` order.
    ``one_task`` judges everything in one task (a small input)."""
    task: Callable[[Iterator[Any]], Iterator[Any]]
    if journals.copies is not None:
        # Each task reads the columnar copies itself and keeps its share of the groups: Spark's own scan, shuffle
        # and hand-over of the rows to Python took longer than the checks (ten million records: about 20 s).
        tasks = 1 if one_task else min(spark.sparkContext.defaultParallelism, _groups(journals.copies))
        task = functools.partial(audit_copies, copies=journals.copies, tasks=tasks, examples=examples)
        parts = spark.range(0, tasks, 1, tasks)
    else:
        shaped = flat(journals.records)
        parts = shaped.coalesce(1) if one_task else shaped.repartition("group")
        task = functools.partial(audit_groups, examples=examples)
    found, names, _ = _gather(parts.mapInArrow(task, RESULT_SCHEMA), examples)
    found["unique-view-id"] = _unique_view_id(names, examples)
    return [found.get(name) or Tally(name) for name in INVARIANTS]


def audit_packets(packets: DataFrame, keyed: bool, examples: int) -> tuple[int, list[Tally]]:
    """Judge the wire invariants over decoded ``packets`` (``pcap.PACKET_SCHEMA``) in one task: they compare
    every capture's packets together.  Returns how many packets there were and a tally per wire invariant."""
    task = functools.partial(audit_captures, keyed=keyed, examples=examples)
    found, _, packets_read = _gather(packets.coalesce(1).mapInArrow(task, RESULT_SCHEMA), examples)
    return packets_read, [found.get(name) or Tally(name) for name in WIRE_INVARIANTS]


def _gather(results: DataFrame, examples: int) -> tuple[dict[str, Tally], list[dict[str, Any]], int]:
    """The tasks' result rows added up: a tally per invariant, the view names, and the records counted."""
    found: dict[str, Tally] = {}
    names: list[dict[str, Any]] = []
    counted = 0
    for row in results.collect():
        d = row.asDict()
        if d["kind"] == "name":
            names.append({"vid": d["view"], "group": d["group"], "ml": d["detail"], "node": d["node"]})
            continue
        if d["kind"] == "count":
            counted += d["c"]
            continue
        part = found.setdefault(d["inv"], Tally(d["inv"], noun=d["noun"]))
        if d["kind"] == "tally":
            part.add(Tally(d["inv"], d["c"], d["x"], d["k"]), examples)
        else:
            part.add(Tally(d["inv"], examples=[{f: d[f] for f in EXAMPLE_FIELDS}]), examples)
    return found, names, counted


def _unique_view_id(names: list[dict[str, Any]], examples: int) -> Tally:
    """``unique-view-id`` over the view names of every group."""
    import pyarrow as pa

    table = pa.Table.from_pylist(names, schema=pa.schema(
        [("vid", pa.string()), ("group", pa.string()), ("ml", pa.string()), ("node", pa.string())]))
    with connect() as connection:
        connection.register(_NAMES, table)
        tables = Tables(connection, _NAMES)
        (result,) = tally(tables.rows, [unique_view_id(tables)], examples)[1]
    return result


def audit_groups(batches: Iterator[Any], examples: int) -> Iterator[Any]:
    """A task: the records of some groups in (as ``records.flat`` shapes them), their checks' result rows out."""
    import pyarrow as pa

    received = [b for b in batches if b.num_rows]
    if not received:
        return
    with connect() as connection:
        _load(connection, pa.Table.from_batches(received))
        del received
        yield _judge(connection, examples)


def audit_captures(batches: Iterator[Any], keyed: bool, examples: int) -> Iterator[Any]:
    """A task: every decoded packet in, the wire checks' result rows and the packet count out."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from .pcap import PACKET_SCHEMA, wire_checks

    received = [b for b in batches if b.num_rows]
    # With no packet at all the checks still run, over nothing.
    packets = pa.Table.from_batches(received) if received else to_arrow_schema(PACKET_SCHEMA).empty_table()
    with connect() as connection:
        _load(connection, packets)
        tables = Tables(connection)
        counted, tallies = tally(tables.rows, wire_checks(tables, keyed), examples, counted=BASE)
    yield _result_batch(tallies, [], counted)


def _load(connection: Any, table: Any) -> None:
    """Copy the Arrow ``table`` into the connection as the checks' base table (read some twenty times: DuckDB's
    own storage scans faster than Arrow's)."""
    connection.register("arrow_input", table)
    connection.execute(f"CREATE TEMP TABLE {BASE} AS SELECT * FROM arrow_input")
    connection.unregister("arrow_input")


def audit_copies(batches: Iterator[Any], copies: list[tuple[str, int]], tasks: int, examples: int,
                 ) -> Iterator[Any]:
    """A task numbered by the one row of ``batches``: reads the groups whose hash falls to it from the columnar
    ``copies`` (each copy's path and position delta), checks them and returns the result rows."""
    for batch in batches:
        for task in batch.column(0).to_pylist():
            with connect() as connection:
                connection.execute(f"CREATE TEMP TABLE {BASE} AS {copied_records(copies, tasks, task)}")
                if connection.execute(f"SELECT count(1) FROM {BASE}").fetchone()[0]:
                    yield _judge(connection, examples)


def copied_records(copies: list[tuple[str, int]], tasks: int, task: int) -> str:
    """DuckDB SQL reading, from the columnar ``copies``, the records of the groups of ``task`` (of ``tasks``) in
    the shape ``records.flat`` gives what Spark reads (a copy holds QoS names only, and plain
    member IDs: anything else is left to Spark's reader)."""
    files = _paths(copies)
    deltas = ", ".join(f"({_literal(path)}, {delta})" for path, delta in copies)
    entry = (f"concat_ws(chr({ord(FIELD)}), coalesce(o[1], ''), coalesce(o[2], ''), coalesce(lower(o[3]), ''))")
    member = "CASE WHEN starts_with(m, '[') THEN json_extract_string(m, '$[0]') ELSE m END"
    return f"""
        SELECT node, "group", event, view, ts, src, seq, lower(qos) AS qos, packet, new_view, holders, need,
            order_view, role, conn, msg_ts, accepted, line + delta AS pos,
            array_to_string(list_transform(orders, lambda o: {entry}), chr({ord(ITEM)})) AS orders,
            CAST(coalesce(len(orders), 0) AS INTEGER) AS norders,
            array_to_string(keys, chr({ord(ITEM)})) AS keys,
            array_to_string(list_transform(members, lambda m: {member}), ',') AS ml,
            CAST(len(members) AS INTEGER) AS msize
        FROM read_parquet([{files}], filename = true)
        JOIN (VALUES {deltas}) AS deltas(filename, delta) USING (filename)
        WHERE hash("group") % {tasks} = {task}"""


def _groups(copies: list[tuple[str, int]]) -> int:
    """How many groups the columnar ``copies`` hold (at least one): no more tasks than that are worth starting, as
    each reads every copy to find its groups."""
    with connect() as connection:
        found = connection.execute(
            f'SELECT count(1) FROM (SELECT DISTINCT "group" FROM read_parquet([{_paths(copies)}]))')
        return max(1, found.fetchone()[0])


def connect() -> Any:
    """A DuckDB connection in memory that spills, if it must, under the system's temporary directory (DuckDB's own
    default is ``.tmp`` in the working directory, which is the user's, or the executor's)."""
    import duckdb

    spill = os.path.join(tempfile.gettempdir(), f"rmp-audit-duckdb-{os.getpid()}")
    return duckdb.connect(config={"temp_directory": spill})


def _paths(copies: list[tuple[str, int]]) -> str:
    """The copies' paths as a DuckDB list's elements."""
    return ", ".join(_literal(path) for path, _ in copies)


def _literal(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def _judge(connection: Any, examples: int) -> Any:
    """Every per-group check over the connection's records, as one batch of result rows (``RESULT_SCHEMA``)."""
    tables = Tables(connection)
    checks: list[Check] = group_checks(tables)
    _, tallies = tally(tables.rows, checks, examples)
    return _result_batch(tallies, tables.rows(f"SELECT * FROM {view_names(tables)}"), 0)


def _result_batch(tallies: list[Tally], names: list[dict[str, Any]], counted: int) -> Any:
    """Tallies, view names and a record count as one batch of result rows (``RESULT_SCHEMA``)."""
    import pyarrow as pa

    out: list[dict[str, Any]] = [{"kind": "count", "c": counted}] if counted else []
    for t in tallies:
        out.append({"kind": "tally", "inv": t.name, "c": t.checked, "x": t.violations, "k": t.noted, "noun": t.noun})
        out += [{"kind": "example", "inv": t.name, "noun": t.noun, **e} for e in t.examples]
    out += [{"kind": "name", "view": n["vid"], "group": n["group"], "detail": n["ml"], "node": n["node"]}
            for n in names]
    return pa.RecordBatch.from_pylist(out, schema=_result_schema())


@functools.cache
def _result_schema() -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(RESULT_SCHEMA)
