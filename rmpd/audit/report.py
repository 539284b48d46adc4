"""Run checks on the executors and bring back only counts and a few examples; render the verdict.

All checks are counted in one Spark job (one union of tiny per-row tallies), so the cached records are scanned
once for every invariant together; examples are fetched in a second job only when something is violated.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

from .check import Check
from .schema import EXAMPLE_FIELDS

EXIT_OK = 0
EXIT_VIOLATED = 1

_RECORDS = "\0records"


@dataclass(frozen=True)
class InvariantResult:
    """The verdict on one invariant."""

    name: str
    checked: int
    violations: int
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.violations == 0


@dataclass(frozen=True)
class AuditReport:
    """Verdicts on every invariant plus what was read."""

    inputs: list[str]
    records: int
    results: list[InvariantResult]

    @property
    def ok(self) -> bool:
        return all(r.holds for r in self.results)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_VIOLATED

    def violated(self) -> list[str]:
        return [r.name for r in self.results if not r.holds]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "inputs": self.inputs,
            "records": self.records,
            "invariants": [asdict(r) | {"holds": r.holds} for r in self.results],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(self.to_dict(), out, indent=2, sort_keys=False)
            out.write("\n")


def evaluate(checks: list[Check], examples: int, counted: DataFrame | None = None) -> tuple[int, list[InvariantResult]]:
    """Count every check in one job; fetch up to ``examples`` violations of each violated one.

    ``counted`` (optional) is the input whose rows are reported as the record count.
    """
    tallies = []
    if counted is not None:
        tallies.append(counted.select(F.lit(_RECORDS).alias("inv"), F.lit(1).alias("c"), F.lit(0).alias("x")))
    for check in checks:
        if check.tally is not None:
            tallies.append(check.tally.select(F.lit(check.name).alias("inv"), F.col("c").cast("long").alias("c"),
                                              F.col("x").cast("long").alias("x")))
            continue
        tallies.append(check.checked.select(F.lit(check.name).alias("inv"), F.lit(1).alias("c"), F.lit(0).alias("x")))
        tallies.append(check.violations.select(F.lit(check.name).alias("inv"), F.lit(0).alias("c"),
                                               F.lit(1).alias("x")))
    rows = (
        union_all(tallies)
        .groupBy("inv")
        .agg(F.sum("c").alias("c"), F.sum("x").alias("x"))
        .collect()
    )
    counts = {r.inv: (int(r.c), int(r.x)) for r in rows}
    records = counts.pop(_RECORDS, (0, 0))[0]
    bad = [c for c in checks if counts.get(c.name, (0, 0))[1] > 0]
    found: dict[str, list[dict[str, Any]]] = {c.name: [] for c in checks}
    if bad and examples > 0:
        sample = union_all(
            [c.violations.limit(examples).withColumn("invariant", F.lit(c.name)) for c in bad]
        ).collect()
        for row in sample:
            d = row.asDict()
            found[d.pop("invariant")].append(d)
    results = [
        InvariantResult(c.name, counts.get(c.name, (0, 0))[0], counts.get(c.name, (0, 0))[1], found[c.name])
        for c in checks
    ]
    return records, results


def union_all(frames: list[DataFrame]) -> DataFrame:
    """The rows of every frame (each with the columns of the first, by name), as one plan analysed once.

    Pairwise ``unionByName`` analyses the whole plan built so far at every step, and a check's plan is large: over
    the twenty-odd tallies of an audit that was about a second of a small audit's time.  One ``UNION ALL`` over
    temporary views of the frames is analysed once; the views are dropped at once (the plan keeps what they named).
    """
    if len(frames) == 1:
        return frames[0]
    spark = frames[0].sparkSession
    columns = ", ".join(f"`{c}`" for c in frames[0].columns)
    names = [f"rmp_audit_{uuid.uuid4().hex}" for _ in frames]
    try:
        for name, frame in zip(names, frames, strict=True):
            frame.createOrReplaceTempView(name)
        return spark.sql(" UNION ALL ".join(f"SELECT {columns} FROM {name}" for name in names))
    finally:
        for name in names:
            spark.catalog.dropTempView(name)


def render(report: AuditReport, console: Console) -> None:
    """The verdict table, then example violations, for a person reading the terminal."""
    table = Table(title=f"rmp audit: {report.records} records from {len(report.inputs)} input(s)")
    table.add_column("invariant")
    table.add_column("checked", justify="right")
    table.add_column("violations", justify="right")
    table.add_column("verdict")
    for r in report.results:
        verdict = "[green]holds[/green]" if r.holds else "[bold red]VIOLATED[/bold red]"
        table.add_row(r.name, str(r.checked), str(r.violations), verdict)
    console.print(table)
    for r in report.results:
        if not r.examples:
            continue
        ex = Table(title=f"examples: {r.name}")
        for col in EXAMPLE_FIELDS:
            ex.add_column(col, overflow="fold")
        for e in r.examples:
            ex.add_row(*("" if e.get(col) is None else str(e.get(col)) for col in EXAMPLE_FIELDS))
        console.print(ex)
