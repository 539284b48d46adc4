"""Shuffle partitions follow the local master's threads; cluster masters keep Spark's own default; a small input
is audited with settings for small inputs, put back afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmpd.audit.job import SMALL_INPUT, SMALL_INPUT_BYTES, input_bytes, sized_for_input
from rmpd.audit.session import local_cores


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[2]", 2), ("local[4,3]", 4), ("local[*]", os.cpu_count()),
    ("spark://host:7077", None), ("yarn", None), ("local-cluster[2,1,1024]", None),
])
def test_local_cores(master: str, cores: int | None) -> None:
    assert local_cores(master) == cores


def test_a_small_input_is_audited_with_small_settings_which_are_put_back(spark: SparkSession, tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text('{"v":1}\n' * 10)
    large = tmp_path / "large.jsonl"
    with large.open("wb") as out:
        out.truncate(SMALL_INPUT_BYTES)  # sparse: measured by length, never read
    session_had = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "true")  # as a session of its own would have it
    try:
        before = {name: spark.conf.get(name, None) for name in (*SMALL_INPUT, "spark.sql.files.minPartitionNum")}
        with sized_for_input(spark, [str(small)]):
            assert {name: spark.conf.get(name) for name in SMALL_INPUT} == SMALL_INPUT
            assert spark.conf.get("spark.sql.files.minPartitionNum") == str(spark.sparkContext.defaultParallelism)
        assert {name: spark.conf.get(name, None) for name in before} == before
        with sized_for_input(spark, [str(tmp_path)]):  # the directory holds both: large
            assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", session_had)
    assert input_bytes(spark, [str(small), str(tmp_path / "missing")]) == SMALL_INPUT_BYTES  # unknown: large
