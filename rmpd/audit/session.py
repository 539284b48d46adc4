"""The SparkSession the audit runs in: UTC, console progress on stderr, quiet logs."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def get_session(master: str | None = None, app_name: str = "rmp-audit") -> SparkSession:
    """Reuse a running session (tests, ``spark-submit``) or start one on ``master``.

    Spark prints its progress bar and logs to stderr, leaving stdout for the verdict.  Python workers (used only to
    decode wire captures) run this interpreter unless ``PYSPARK_PYTHON`` says otherwise, so they import the same
    ``rmpd`` and ``msgpack``.
    """
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "true")
    )
    # PySpark reads the workers' interpreter from the environment when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
