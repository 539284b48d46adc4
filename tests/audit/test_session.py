"""Shuffle partitions follow the local master's threads; cluster masters keep Spark's own default."""

from __future__ import annotations

import os

import pytest

from rmpd.audit.session import local_cores


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[2]", 2), ("local[4,3]", 4), ("local[*]", os.cpu_count()),
    ("spark://host:7077", None), ("yarn", None), ("local-cluster[2,1,1024]", None),
])
def test_local_cores(master: str, cores: int | None) -> None:
    assert local_cores(master) == cores
