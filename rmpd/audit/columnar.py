"""A columnar copy of each local journal file, cached beside it, so that Spark reads Parquet instead of JSON text.

Parsing JSON lines in Spark's JVM was the largest single cost of a large audit (some 10 MB a second per core);
Arrow's JSON reader (C++, an explicit schema, several threads) parses the same lines twenty times faster, and
Spark reads Parquet with its vectorized reader.  The copy holds the fields the checks read (``schema.COLUMNS``) and
each record's line number; it is written once, to ``.rmp-audit/`` in the journal's directory (or, where that cannot
be written, the user's cache directory), under a name made from the journal's path, size and modification time, so
a journal that changes is read again and a copy that no longer fits is replaced.

The copy is a cache, never a condition: a file is copied only when every line is one record that Arrow reads
under a schema at least as strict as Spark's and that the auditor accepts (schema version, node, known event).
Anything else (a blank line, a type Spark would take as text, a ``[pid, multicast_capable]`` member pair, a bad
line, a corrupt ``.gz``, no ``pyarrow`` installed) leaves the audit to Spark's own reader, which gives the same
records or names the first bad file and line.  Spark keeps an integer inside a list of strings as its text (the
``seq`` of each entry of an ACK's ``orders``); such integers are quoted before Arrow parses a block, which gives
the same strings, and a block holding an escaped quote (where quoting could reach into a string) is not copied.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.util
import io
import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .schema import COLUMNS, EVENTS, JOURNAL_SCHEMA, SCHEMA_VERSION

CACHE_DIR = ".rmp-audit"
"""Directory beside the journals that holds their columnar copies."""

GENERATION = 1
"""Part of every copy's name: raised when what a copy holds changes, so older copies are not read."""

BLOCK_BYTES = 32 * 1024 * 1024
"""Text parsed at once: bounds the memory a copy takes whatever the journal's size."""

BLOCKS_AHEAD = 4
"""Blocks parsed ahead of the one being written: enough to keep every thread busy, few enough to bound memory."""

LINE = "line"
"""Column of a copy holding each record's line number in its journal (from 1)."""

_INTEGER_IN_STRINGS = r'([^\[{,:"\\\s])",(-?(?:0|[1-9][0-9]*)),"'
"""An integer between two strings of a list (Spark reads it, in a list of strings, as its text), in RE2's syntax.
The quote before it must close a string: one that follows ``[``, ``{``, ``,``, ``:``, a quote, a backslash or a
space may open one instead, and is left alone (the block then fails to parse and is left to Spark).  RE2 has no
lookbehind, so the character before the quote is matched (group 1) and put back."""


@dataclass(frozen=True)
class Copy:
    """A journal file and its columnar copy (both local paths), with the copy's record count."""

    journal: str
    parquet: str
    rows: int


class NotCopied(Exception):
    """This journal is left to Spark's reader (why: for tests and debugging)."""


SWITCH_ENV = "RMP_AUDIT_COLUMNAR"
"""``off`` reads every journal with Spark's own JSON reader, making no copies; ``on`` copies a small input too."""


def wanted(small: bool) -> bool:
    """Whether an audit of a ``small`` input (or a large one) makes and reads columnar copies.

    A small input is parsed by Spark in a fraction of a second, and a first audit of it was slower with a copy
    (Arrow to import, the copy to write, Spark's Parquet reader to load), so only a large one is copied unless
    ``RMP_AUDIT_COLUMNAR`` says ``on`` or ``off``.
    """
    setting = os.environ.get(SWITCH_ENV, "").lower()
    return setting == "on" or (setting != "off" and not small)


def available() -> bool:
    """Whether ``pyarrow`` is installed (``pip install 'rmpd[audit]'`` installs it)."""
    return importlib.util.find_spec("pyarrow") is not None


def local_file(uri: str) -> str | None:
    """The local path of a ``file:`` URI as Hadoop lists it (or a plain path), else None."""
    if uri.startswith("file:"):
        return re.sub(r"^file:(//)?(?=/)", "", uri)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri):
        return None
    return uri


_early: list[threading.Thread] = []
"""Copies started before Spark (``copy_early``), which ``copies`` waits for."""


def copy_early(paths: list[str], suffixes: tuple[str, ...]) -> threading.Thread | None:
    """Start copying the local journals (names ending in ``suffixes``) under ``paths`` on a thread of its own, so
    that they are made while Spark's JVM starts (a few seconds); ``copies`` waits for it.  Paths that are not local
    files or directories are left to the reader, as is any journal this does not copy.  Returns the thread, if
    there was anything to copy."""
    found: list[str] = []
    for text in paths:
        path = local_file(text)
        if path is None:
            continue
        if os.path.isdir(path):
            found += sorted(os.path.join(top, name) for top, dirs, names in os.walk(path) for name in names
                            if name.endswith(suffixes) and CACHE_DIR not in top.split(os.sep))
        elif path.endswith(suffixes):
            found.append(path)
    if found and available():
        thread = threading.Thread(target=_copy_all, args=(found,), name="rmp-audit-copies", daemon=True)
        thread.start()
        _early.append(thread)
        return thread
    return None


def _copy_all(paths: list[str], threads: int | None = None) -> list[Copy | None]:
    """``_copy_or_none`` of each of ``paths``, one journal after another, each parsed ``threads`` blocks at a time.

    Parallel by block, not by file: three journals of one size on two threads took as long as two of them one after
    the other, the third copied alone.
    """
    with ThreadPoolExecutor(max(1, threads or os.cpu_count() or 1)) as pool:
        return [_copy_or_none(path, pool) for path in paths]


def copies(files: list[str], threads: int | None = None) -> list[Copy] | None:
    """A columnar copy of every one of ``files`` (made where missing), or None when any of them is left to Spark.

    ``files`` are journal URIs as the reader lists them; all must be local.  Files are copied ``threads`` at a time.
    Copies started early (``copy_early``) are waited for first, so no journal is copied twice at once.
    """
    while _early:
        _early.pop().join()
    paths = [local_file(f) for f in files]
    if not files or any(p is None for p in paths) or len(set(paths)) < len(paths) or not available():
        return None  # a file named twice is read twice, as Spark's reader does
    made = _copy_all([p for p in paths if p is not None], threads)
    if any(m is None for m in made):
        return None
    return [m for m in made if m is not None]


def _copy_or_none(path: str, pool: Executor | None = None) -> Copy | None:
    try:
        return copy(path, pool)
    except (NotCopied, OSError, EOFError, gzip.BadGzipFile, ValueError, ArithmeticError):
        return None
    except Exception as exc:  # pyarrow's errors (ArrowInvalid and kin) are not importable without pyarrow
        if type(exc).__module__.startswith("pyarrow"):
            return None
        raise


def copy(journal: str, pool: Executor | None = None) -> Copy:
    """The columnar copy of ``journal``, written first if there is none for its current size and time (its blocks
    parsed on ``pool``, if given); raises :class:`NotCopied` (or the reader's error) when it cannot be made."""
    import pyarrow.parquet as pq

    stat = os.stat(journal)
    target = _target(journal, stat)
    if target.is_file():
        with contextlib.suppress(Exception):  # a damaged copy is written again
            return Copy(journal, str(target), pq.ParquetFile(target).metadata.num_rows)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        rows = _write(journal, partial, pool)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    _remove_stale(target)
    return Copy(journal, str(target), rows)


def _target(journal: str, stat: os.stat_result) -> Path:
    """Where ``journal``'s copy goes: beside it if that directory can be written, else in the user's cache."""
    identity = f"{os.path.realpath(journal)}|{stat.st_size}|{stat.st_mtime_ns}|{GENERATION}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    name = f"{_safe(Path(journal).name)}.{digest}.parquet"
    beside = Path(journal).parent / CACHE_DIR
    with contextlib.suppress(OSError):
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside / name
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rmpd" / "journals"
    cache.mkdir(parents=True, exist_ok=True)
    return cache / name


def _safe(name: str) -> str:
    """A file name Spark reports unchanged (no characters its paths would escape)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _remove_stale(target: Path) -> None:
    """Remove copies of the same journal made for an older size or time (same name, another digest)."""
    stem = target.name.rsplit(".", 2)[0]
    for other in target.parent.glob(f"{stem}.*.parquet"):
        if other != target and len(other.name.rsplit(".", 2)[0]) == len(stem):
            with contextlib.suppress(OSError):
                other.unlink()


def _write(journal: str, out: Path, pool: Executor | None = None) -> int:
    """Parse ``journal`` block by block (on ``pool``, a few blocks ahead) and write the copy to ``out`` in order;
    returns its record count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    pending: deque[Future[Any]] = deque()
    written = lines = 0
    writer = None

    def write(table: Any) -> None:
        nonlocal writer, written
        if writer is None:
            writer = pq.ParquetWriter(out, table.schema, compression="snappy")
        writer.write_table(table)
        written += table.num_rows

    try:
        for block in _blocks(journal):
            if pool is None:
                write(_parse(block, schema, lines))
            else:
                pending.append(pool.submit(_parse, block, schema, lines))
                while len(pending) > BLOCKS_AHEAD:
                    write(pending.popleft().result())
            lines += block.count(b"\n")
        while pending:
            write(pending.popleft().result())
        if writer is None:  # an empty journal: a copy with no rows
            empty = pa.schema([*(schema.field(c) for c in COLUMNS), pa.field(LINE, pa.int64())])
            writer = pq.ParquetWriter(out, empty, compression="snappy")
    finally:
        for waiting in pending:
            waiting.cancel()
        if writer is not None:
            writer.close()
    return written


def _blocks(journal: str) -> Iterator[bytes]:
    """The journal's bytes (decompressed), in blocks of whole lines of about ``BLOCK_BYTES``."""
    opener: Any = gzip.open if journal.endswith(".gz") else open
    with opener(journal, "rb") as f:
        rest = b""
        while True:
            chunk = f.read(BLOCK_BYTES)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            rest = data[cut:]
            yield data[:cut]
        if rest:
            yield rest + b"\n"


def _parse(block: bytes, schema: Any, before: int) -> Any:
    """One block of whole lines as a table of ``COLUMNS`` and ``LINE``; raises :class:`NotCopied` unless every line
    is one valid record."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if b'\\"' in block:
        raise NotCopied("an escaped quote")
    lines = block.count(b"\n")
    text = _quote_integers(block)
    table = pj.read_json(
        io.BytesIO(text),
        read_options=pj.ReadOptions(block_size=max(1 << 20, len(text) // 4 + 1)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    if table.num_rows != lines:
        raise NotCopied("not one record per line (a blank line, or several objects on one)")
    valid = pc.and_kleene(
        pc.and_kleene(pc.equal(table["v"], SCHEMA_VERSION), pc.is_valid(table["node"])),
        pc.is_in(table["event"], value_set=pa.array(EVENTS)),
    )
    if not pc.all(pc.fill_null(valid, False)).as_py():
        raise NotCopied("a record the auditor does not accept")
    numbers = pa.array(range(before + 1, before + lines + 1), pa.int64())
    return table.select(list(COLUMNS)).append_column(LINE, numbers)


def _quote_integers(block: bytes) -> bytes:
    """``block`` with every integer between two strings of a list quoted (``_INTEGER_IN_STRINGS``).

    Only a list of lists (an ACK's ``orders``) can hold one, so the substitution runs on those alone, in Arrow's
    regular expression engine (RE2, which lets other threads run meanwhile).  Matching the character before the
    quote, rather than looking behind, finds the same places: a match ends with the quote that opens the next
    string, so it never holds the character the next match needs before its quote.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = block.split(_LIST_OF_LISTS)
    if len(parts) == 1:
        return block
    lists, ends = [], []
    for part in parts[1:]:
        inside, end, rest = part.partition(b"]]")
        lists.append(inside)
        ends.append(end + rest)
    quoted = pc.replace_substring_regex(pa.array(lists, pa.binary()), pattern=_INTEGER_IN_STRINGS,
                                        replacement=r'\1","\2","')
    return _LIST_OF_LISTS.join([parts[0], *(q + e for q, e in zip(quoted.to_pylist(), ends, strict=True))])


_LIST_OF_LISTS = b":[["
"""Where a list of lists (an ACK's ``orders``) starts; it ends at the first ``]]`` after."""


def arrow_schema() -> Any:
    """``schema.JOURNAL_SCHEMA`` as an Arrow schema (every field of the journal, so each is type-checked)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    def convert(spark_type: Any) -> Any:
        if isinstance(spark_type, T.ArrayType):
            return pa.list_(convert(spark_type.elementType))
        return {T.LongType: pa.int64(), T.StringType: pa.string(), T.DoubleType: pa.float64(),
                T.BooleanType: pa.bool_()}[type(spark_type)]

    return pa.schema([pa.field(f.name, convert(f.dataType)) for f in JOURNAL_SCHEMA.fields
                      if not f.name.startswith("_")])
