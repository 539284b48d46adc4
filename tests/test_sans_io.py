"""The protocol engine stays sans-IO: no module under rmpd/protocol imports I/O, clocks or global randomness."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"socket", "trio", "time", "random", "asyncio", "select", "selectors", "threading", "datetime", "os"}
PROTOCOL = Path(__file__).resolve().parent.parent / "rmpd" / "protocol"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_protocol_imports_nothing_that_does_io() -> None:
    files = sorted(PROTOCOL.rglob("*.py"))
    assert len(files) >= 8
    offenders = {f.name: imported_modules(f) & FORBIDDEN for f in files if imported_modules(f) & FORBIDDEN}
    assert offenders == {}
