"""One SparkSession for the whole audit suite: local[2], few shuffle partitions, UTC, interpreted expressions.

Test traces are tiny, so almost all of an audit's time is fixed cost per query.  Compiling generated Java for every
operator of some sixty stages dominated it (a hundred-record audit took about 18 s with code generation, 9 s
without), so this session evaluates expressions interpreted; the results are the same by Spark's contract, and the
standalone-cluster test keeps code generation on and compares its verdict with this session's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from rmpd.audit.jvm import ARCHIVE_ENV


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import rmpd and msgpack from this venv
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rmpd-audit-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Dozens of audits share this JVM; each keeps its query plans for the status store, and an audit's plans
        # (every check in one query, with its cached tables) are large, so keep fewer of them and a larger heap.
        .config("spark.sql.ui.retainedExecutions", "20")
        .config("spark.driver.memory", "2g")
        # Test traces are tiny: planning once without adaptive re-planning is faster per query.
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def no_class_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audits these tests run (in this process or in one of their own) start their JVMs without a class-data
    archive: writing one takes half a minute at a JVM's exit and some 170 MB of the user's cache, and these tests
    judge verdicts, not start-up.  The tests of the archive itself take this away (test_class_archive.py)."""
    monkeypatch.setenv(ARCHIVE_ENV, "off")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder needs Spark (Java 17)."""
    for item in items:
        if "tests/audit" in str(item.fspath):
            item.add_marker(pytest.mark.spark)
