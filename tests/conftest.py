"""Suite-wide settings: property tests have no per-example deadline, since CI machines are shared and slow; and when
the suite runs on several workers (``scripts/test``: pytest-xdist, ``--dist loadgroup``), the tests that must not run
beside one another all run on one worker, one after another."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("rmpd", deadline=None)
settings.load_profile("rmpd")

ONE_WORKER = (
    "tests/audit/",  # one SparkSession for all of them, and the JVMs of their own that some start, use both cores
    "tests/daemon/test_netns.py",  # namespace hosts with random loss, partitions and links at a rate (tbf)...
    "tests/daemon/test_exactly_once_partition.py",
    "tests/daemon/test_rate_links.py",
    "tests/daemon/test_socket_backpressure.py",
    "tests/tools/test_nemesis.py",  # ...which must not share the cores with Spark
)
"""Tests run by one worker, one after another, in the order collected: Spark's, and those on network-namespace hosts
whose links have a rate or lose datagrams on purpose.  Every other test starts its own daemons (with group names of
their own, ``harness.unique``) or none, and runs beside any other."""


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a run without it does not load
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with ``ONE_WORKER`` as its one group, chosen by path.  (pytest-xdist's own grouping, by
    the ``xdist_group`` mark, renames test IDs in a way pytest 9 no longer lets it, and then groups nothing.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    if not callable(getattr(LoadScopeScheduling, "_split_scope", None)):
        # Without it the tests of ONE_WORKER would share the cores and fail now and then: say so instead.
        raise pytest.UsageError("this pytest-xdist has no LoadScopeScheduling._split_scope, which tests/conftest.py "
                                "groups tests with; run with -n 0, or update the hook")

    class OneWorkerGroup(LoadScopeScheduling):
        """Each test is a unit of its own, but the tests of ``ONE_WORKER`` are one unit: the largest, so first."""

        def _split_scope(self, nodeid: str) -> str:
            return "one-worker" if nodeid.startswith(ONE_WORKER) else nodeid

    return OneWorkerGroup(config, log)
