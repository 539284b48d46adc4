"""The SparkSession the audit runs in: UTC, Spark's log in a file of its own, nothing but progress on stderr."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

if TYPE_CHECKING:
    from .jvm import JvmLaunch

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
"""Spark's log configuration while the auditor runs: a file of its own, and stderr only at a level asked for."""


LOG_FILE_CONF = "spark.rmpd.audit.logFile"
"""Session setting naming the file Spark's log goes to, so that whoever holds the session can point at it."""

_VERBOSITY = ("off", "error", "warn", "info", "debug")


def get_session(master: str | None = None, app_name: str = "rmp-audit", spark_log: str = "off",
                jvm: JvmLaunch | None = None) -> SparkSession:
    """Reuse a running session (tests, ``spark-submit``) or start one on ``master``.

    Spark's own log (warnings and worse, or ``spark_log`` if more verbose) goes to a file of its own, whose path
    :func:`log_file` gives; stderr shows it at ``spark_log`` and worse (``off`` by default: its start-up warnings,
    such as the host name resolving to loopback, say nothing about the trace, and a failure is told in one line
    that names the file).  Stdout is left for the verdict.  Python workers (used only to decode wire captures) run
    this interpreter unless ``PYSPARK_PYTHON`` says otherwise, so they import the same ``rmpd`` and ``msgpack``.
    When this starts the JVM, ``jvm`` (:mod:`rmpd.audit.jvm`) adds its options and owns its process.
    """
    level = max("warn", spark_log, key=_VERBOSITY.index)
    log = Path(tempfile.gettempdir()) / f"rmp-audit-{os.getpid()}.log"
    settings = {
        "spark.app.name": app_name,
        "spark.sql.session.timeZone": "UTC",
        # The auditor shows its own progress line (``progress``); Spark's bar would draw over it.
        "spark.ui.showConsoleProgress": "false",
        LOG_FILE_CONF: str(log),
        # Read when this starts the JVM (a session already running keeps its own).
        "spark.driver.extraJavaOptions":
            f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()} -Drmpd.audit.spark_log={spark_log} "
            f"-Drmpd.audit.log_level={level} -Drmpd.audit.log_file={log}",
    }
    # PySpark reads the workers' interpreter from the environment when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master:
        settings["spark.master"] = master
        cores = local_cores(master)
        if cores is not None:
            # Spark's default of 200 shuffle partitions is sized for clusters; on one machine each costs a task per
            # shuffle and, once cached, per scan.  A few per core keeps both cores busy without the overhead.
            settings["spark.sql.shuffle.partitions"] = str(4 * cores)
            # Spark sizes input splits for as many tasks as cores: three journals of 80 MB became three tasks on two
            # cores, one of them running alone.  Smaller splits (never above the 128 MB cap) even the load out.
            settings["spark.sql.files.minPartitionNum"] = str(4 * cores)
            # In local mode the executors live in the driver's JVM, whose default heap (1 GB) is too small for
            # tens of millions of records: the cached records and deliveries of 10 million records, partitioned by
            # member, ran out of a 4 GB heap.  RMP_AUDIT_MEMORY overrides.  Takes effect when this starts the JVM.
            settings["spark.driver.memory"] = os.environ.get("RMP_AUDIT_MEMORY", "8g")
    if jvm is not None and SparkSession.getActiveSession() is None:
        conf = SparkConf().setAll(list(settings.items()))
        SparkContext(conf=conf, gateway=jvm.launch(conf))
    builder = SparkSession.builder
    for name, value in settings.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    if log_file(spark) is not None:  # a session started elsewhere keeps the log settings it was started with
        spark.sparkContext.setLogLevel(level.upper())
    return spark


def log_file(spark: SparkSession) -> str | None:
    """The file Spark's log goes to in this session, if :func:`get_session` started it."""
    return spark.sparkContext.getConf().get(LOG_FILE_CONF, None)


def local_cores(master: str) -> int | None:
    """Worker threads of a ``local``, ``local[N]`` or ``local[*]`` master; None for a cluster master."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if match is None:
        return None
    if match.group(1) is None:
        return 1
    return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))
