"""Run checks on the executors and bring back only counts and a few examples; render the verdict.

All checks are counted in one query (one union of per-check tallies), so the cached tables are scanned once for
every invariant together; examples are fetched in a second query only when something is violated.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from .check import Check
from .schema import EXAMPLE_FIELDS

EXIT_OK = 0
EXIT_VIOLATED = 1

_RECORDS = ""
"""The tally of records read (no invariant has an empty name)."""


@dataclass(frozen=True)
class InvariantResult:
    """The verdict on one invariant."""

    name: str
    checked: int
    violations: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    """What the invariant judged, where that can be nothing (e.g. ``0 keyed messages``); None for most."""

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
            "invariants": [_entry(r) for r in self.results],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(self.to_dict(), out, indent=2, sort_keys=False)
            out.write("\n")


def _entry(result: InvariantResult) -> dict[str, Any]:
    """An invariant's JSON entry; ``note`` only where the invariant has one."""
    entry = asdict(result) | {"holds": result.holds}
    if result.note is None:
        del entry["note"]
    return entry


@dataclass
class Tally:
    """What one check found in one part of the input: items checked, violations, the count its note names, and up
    to the wanted number of example violations.  Tallies of the same check over different parts add up."""

    name: str
    checked: int = 0
    violations: int = 0
    noted: int = 0
    noun: str | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: Tally, examples: int) -> None:
        self.checked += other.checked
        self.violations += other.violations
        self.noted += other.noted
        self.examples = (self.examples + other.examples)[:examples]

    def result(self) -> InvariantResult:
        return InvariantResult(self.name, self.checked, self.violations, self.examples,
                               None if self.noun is None else f"{self.noted} {self.noun}")


Rows = Callable[[str], list[dict[str, Any]]]
"""Runs one SQL statement and returns its rows as dicts."""


def tally(rows: Rows, checks: list[Check], examples: int, counted: str | None = None) -> tuple[int, list[Tally]]:
    """Count every check in one query; fetch up to ``examples`` violations of each violated one in a second.

    ``counted`` (optional) is a table whose rows are reported as the record count.
    """
    tallies = [f"SELECT '{_RECORDS}' AS inv, count(1) AS c, 0 AS x, 0 AS k FROM {counted}"] if counted else []
    tallies += [f"SELECT '{c.name}' AS inv, c, x, {'k' if c.noun else '0'} AS k FROM ({c.counts()})" for c in checks]
    union = " UNION ALL ".join(tallies)
    sums = rows(f"SELECT inv, sum(c) AS c, sum(x) AS x, sum(k) AS k FROM ({union}) GROUP BY inv")
    found = {r["inv"]: [int(r[n] or 0) for n in ("c", "x", "k")] for r in sums}
    records = found.pop(_RECORDS, [0])[0]
    result = {c.name: Tally(c.name, *found.get(c.name, [0, 0, 0]), c.noun) for c in checks}
    bad = [c for c in checks if result[c.name].violations > 0]
    if bad and examples > 0:
        sample = rows(" UNION ALL ".join(
            f"SELECT *, '{c.name}' AS invariant FROM (SELECT * FROM ({c.violations}) LIMIT {int(examples)})"
            for c in bad
        ))
        for d in sample:
            result[d.pop("invariant")].examples.append(d)
    return records, list(result.values())


def render(report: AuditReport, console: Console) -> None:
    """The verdict table, then example violations, for a person reading the terminal."""
    table = Table(title=f"rmp audit: {report.records} records from {len(report.inputs)} input(s)")
    table.add_column("invariant")
    table.add_column("checked", justify="right")
    table.add_column("violations", justify="right")
    table.add_column("verdict")
    for r in report.results:
        verdict = "[green]holds[/green]" if r.holds else "[bold red]VIOLATED[/bold red]"
        if r.note is not None:
            verdict += f" ({r.note})"
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
