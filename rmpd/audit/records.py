"""The records as the checks' tasks receive them: flat columns, QoS by name (Spark SQL, before the checks).

The checks run in Python tasks (``grouped``), and Spark hands a task its rows as Arrow batches.  Nested columns
cost most of that hand-over (an ACK's ``orders`` is a list of lists: a million records took four times as long to
hand over with them as without), so each list travels as one string of its elements, joined by separators a
journal's text never holds: ``orders`` as ``src US seq US qos`` entries joined by RS, ``keys`` joined by RS.  A
member list is needed only as a whole (``ml``, process IDs joined by commas) and by its size (``msize``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

ITEM = "\x1e"
"""Separates the elements of a list column (ASCII record separator)."""

FIELD = "\x1f"
"""Separates the fields of one ``orders`` entry (ASCII unit separator)."""

_LEVELS = ["unreliable", "unordered", "source", "total", "k", "majority", "safe"]

_NAMES = (*[x for x in _LEVELS if x != "k"], *[f"k{k}" for k in range(1, 10)])
"""Names journals write: already normalized, so ``qos_name`` returns them untouched."""

SCALARS = ("node", "group", "event", "view", "ts", "src", "seq", "qos", "packet", "new_view", "holders", "need",
           "order_view", "role", "conn", "msg_ts", "accepted", "pos")
"""Columns handed over as they are."""

def _strings(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def qos_name(col: str) -> str:
    """QoS as its journal name; a numeric wire code (level in the low 3 bits, K above) is translated.

    Almost every value is already a lower-case name: a set lookup passes those through and only the rest are cast
    and translated, which made this per-record normalization several times cheaper.
    """
    code = f"try_cast({col} AS INT)"
    level = f"element_at(array({_strings(_LEVELS)}), ({code} % 8) + 1)"
    from_code = f"CASE WHEN {level} = 'k' THEN concat({level}, CAST(shiftright({code}, 3) AS STRING)) ELSE {level} END"
    return (f"CASE WHEN {col} IN ({_strings(_NAMES)}) THEN {col} WHEN {code} IS NOT NULL THEN {from_code} "
            f"ELSE lower({col}) END")


def flat(records: DataFrame) -> DataFrame:
    """``records`` (``schema.COLUMNS`` and ``pos``) as the checks read them: ``SCALARS``, then ``orders`` and
    ``keys`` as joined strings, ``norders`` (0 without orders), ``ml`` and ``msize``.

    A null element of an ``orders`` entry travels as an empty field; a member given as a ``[pid,
    multicast_capable]`` pair counts by its pid.
    """
    entry = f"array_join(array(o[0], o[1], {qos_name('o[2]')}), '{FIELD}', '')"
    member = "CASE WHEN startswith(m, '[') THEN get_json_object(m, '$[0]') ELSE m END"
    return records.select(
        *[F.col(c) for c in SCALARS],
        F.expr(f"array_join(transform(orders, o -> {entry}), '{ITEM}')").alias("orders"),
        F.expr("CASE WHEN orders IS NULL THEN 0 ELSE size(orders) END").cast("int").alias("norders"),
        F.expr(f"array_join(keys, '{ITEM}')").alias("keys"),
        F.expr(f"concat_ws(',', transform(members, m -> {member}))").alias("ml"),
        F.expr("CASE WHEN members IS NULL THEN NULL ELSE size(members) END").cast("int").alias("msize"),
    )
