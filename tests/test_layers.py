"""Which package may import which: the codecs below the runtime stay sans-IO, and nothing reaches up a layer."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_sans_io import FORBIDDEN, imported_modules

RMPD = Path(__file__).resolve().parent.parent / "rmpd"


def rmpd_imports(path: Path) -> set[str]:
    """The rmpd modules ``path`` imports (absolute imports; a package's relative ones stay inside it)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith("rmpd")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("rmpd"):
            names.add(node.module)
    return names


def offenders(package: str, banned: tuple[str, ...]) -> dict[str, set[str]]:
    found = {}
    for path in sorted((RMPD / package).rglob("*.py")):
        bad = {name for name in rmpd_imports(path) if name.startswith(banned)}
        if bad:
            found[path.name] = bad
    return found


def test_the_wire_codecs_import_nothing_that_does_io() -> None:
    files = sorted((RMPD / "wire").rglob("*.py"))
    assert files
    assert {f.name: imported_modules(f) & FORBIDDEN for f in files if imported_modules(f) & FORBIDDEN} == {}
    assert offenders("wire", ("rmpd.runtime", "rmpd.daemon", "rmpd.client", "rmpd.localapi", "rmpd.keyfile")) == {}


def test_the_auditor_reads_the_wire_through_the_codecs_not_the_runtime() -> None:
    assert offenders("audit", ("rmpd.runtime", "rmpd.daemon", "rmpd.client")) == {}


def test_the_runtime_knows_nothing_of_local_clients() -> None:
    """The runtime serves the daemon and an embedded node alike: what a local client is told is theirs."""
    assert offenders("runtime", ("rmpd.localapi", "rmpd.daemon", "rmpd.client", "rmpd.told")) == {}
