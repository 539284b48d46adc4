"""What the auditor can tell about its input before Spark starts (this module imports no PySpark).

Starting Spark takes seconds and fills the screen with its own lines; a path typed wrong should be answered at
once.  Local paths (no scheme, or ``file:``) are checked here the way the job would find them: a file is read
whatever its name, a directory must hold journal files somewhere below it.  Other URIs (``hdfs:``, ``s3a:``) are
left for Spark's own file system, which the job asks once it runs.
"""

from __future__ import annotations

import os
import re

JOURNAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
"""File names taken from directories; files named explicitly are read whatever their name."""

EXIT_UNREADABLE = 2
"""Exit status of ``rmp audit`` for input it cannot read (1 is for violations)."""

SPARK_LOG_LEVELS = ("error", "warn", "info", "debug")
"""What ``rmp audit --spark-log`` takes: Spark's own log level on stderr."""

INSTALL_HINT = "rmp audit needs PySpark (and Java 17): pip install 'rmpd[audit]'"


class UnreadableInput(Exception):
    """Input that cannot be audited: a missing path, no journal files, or a record that does not parse."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {reason}")
        self.file = file
        self.line = line
        self.reason = reason


def local_path(text: str) -> str | None:
    """The file system path of a local input, or None for a URI of another scheme."""
    if text.startswith("file:"):
        return re.sub(r"^file:(//)?", "", text) or "/"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", text):
        return None
    return text


def check_local(journals: list[str], captures: list[str]) -> None:
    """Raise :class:`UnreadableInput` for the first local journal path or capture that cannot be audited."""
    for text in journals:
        path = local_path(text)
        if path is None:
            continue
        if not os.path.exists(path):
            raise UnreadableInput(text, None, "no such file or directory")
        if os.path.isdir(path) and not any(
            name.endswith(JOURNAL_SUFFIXES) for _, _, names in os.walk(path) for name in names
        ):
            raise UnreadableInput(text, None, f"no journal files ({', '.join(JOURNAL_SUFFIXES)}) in this directory")
    for text in captures:
        path = local_path(text)
        if path is not None and not os.path.isfile(path):
            raise UnreadableInput(text, None, "no such capture file" if not os.path.exists(path) else "not a file")
