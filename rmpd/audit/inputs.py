"""What the auditor can tell about its input before Spark starts (this module imports no PySpark).

Starting Spark takes seconds and fills the screen with its own lines; a path typed wrong should be answered at
once.  Local paths (no scheme, or ``file:``) are checked here the way the job would find them: a file is read
whatever its name, a directory must hold journal files somewhere below it.  Other URIs (``hdfs:``, ``s3a:``) are
left for Spark's own file system, which the job asks once it runs.
"""

from __future__ import annotations

import os
import re
import socket

JOURNAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
"""File names taken from directories; files named explicitly are read whatever their name."""

EXIT_UNREADABLE = 2
"""Exit status of ``rmp audit`` for input it cannot read or a master it cannot use (1 is for violations)."""

EXIT_SPARK_FAILED = 3
"""Exit status of ``rmp audit`` when Spark itself fails for a reason that is not the input's."""

MASTER_FORMS = "local, local[N], local[*], local-cluster[N,C,M], spark://HOST:PORT[,HOST:PORT], yarn or k8s://URL"
"""The Spark masters the auditor accepts, as its error message lists them."""

MASTER_CONNECT_SECONDS = 3.0
"""How long a standalone master's port is given to accept a connection before the audit gives up on it: Spark
itself retries an unreachable master for about a minute before it fails, with a page of Java traces."""

SPARK_LOG_LEVELS = ("off", "error", "warn", "info", "debug")
"""What ``rmp audit --spark-log`` takes: the level of Spark's own log shown on stderr."""

INSTALL_HINT = "rmp audit needs PySpark (and Java 17): pip install 'rmpd[audit]'"


class UnreadableInput(Exception):
    """Input that cannot be audited: a missing path, no journal files, or a record that does not parse."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {reason}")
        self.file = file
        self.line = line
        self.reason = reason


class UnusableMaster(Exception):
    """A Spark master the auditor cannot use: a URL Spark does not take, or a standalone master nobody answers."""

    def __init__(self, master: str, reason: str) -> None:
        super().__init__(f"Spark master {master}: {reason}")
        self.master = master
        self.reason = reason


def check_master(master: str, connect_timeout: float = MASTER_CONNECT_SECONDS) -> None:
    """Raise :class:`UnusableMaster` for a master URL Spark would refuse, or a standalone master (``spark://``)
    none of whose addresses accepts a TCP connection within ``connect_timeout`` seconds."""
    if re.fullmatch(r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|k8s://\S+", master):
        return
    standalone = re.fullmatch(r"spark://(.+)", master)
    if standalone is None:
        raise UnusableMaster(master, f"not a master URL Spark takes ({MASTER_FORMS})")
    addresses = []
    for part in standalone.group(1).split(","):
        hostport = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d{1,5})", part)
        if hostport is None or not 0 < int(hostport.group(2)) < 65536:
            raise UnusableMaster(master, f"{part!r} is not HOST:PORT")
        addresses.append((hostport.group(1), int(hostport.group(2))))
    reasons = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=connect_timeout):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port} {exc.strerror or exc}")
    raise UnusableMaster(master, "cannot connect (" + "; ".join(reasons) + ")")


def local_path(text: str) -> str | None:
    """The file system path of a local input, or None for a URI of another scheme."""
    if text.startswith("file:"):
        return re.sub(r"^file:(//)?", "", text) or "/"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", text):
        return None
    return text


def check_local(journals: list[str], captures: list[str]) -> None:
    """Raise :class:`UnreadableInput` for the first local journal path or capture that cannot be audited, or when
    every journal given is local and every file of them is empty (Spark would take seconds to find no records)."""
    empty = bool(journals)
    for text in journals:
        path = local_path(text)
        if path is None:
            empty = False
            continue
        if not os.path.exists(path):
            raise UnreadableInput(text, None, "no such file or directory")
        files = [path]
        if os.path.isdir(path):
            files = [os.path.join(top, name) for top, _, names in os.walk(path) for name in names
                     if name.endswith(JOURNAL_SUFFIXES)]
            if not files:
                raise UnreadableInput(text, None, f"no journal files ({', '.join(JOURNAL_SUFFIXES)}) in this directory")
        empty = empty and all(os.path.getsize(name) == 0 for name in files)
    if empty:
        raise UnreadableInput(", ".join(journals), None, "no records (every journal file is empty)")
    for text in captures:
        path = local_path(text)
        if path is not None and not os.path.isfile(path):
            raise UnreadableInput(text, None, "no such capture file" if not os.path.exists(path) else "not a file")
