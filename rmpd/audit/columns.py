"""Column expressions shared by the checks: QoS classes, data packet identity, member lists.

They are Spark SQL expressions (no Python UDFs), so the checks run entirely in the JVM executors and need no
Python on the workers.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

_LEVELS = ["unreliable", "unordered", "source", "total", "k", "majority", "safe"]


_NAMES = (*[x for x in _LEVELS if x != "k"], *[f"k{k}" for k in range(1, 10)])
"""Names journals write: already normalized, so ``qos_name`` returns them untouched."""


def qos_name(col: Column) -> Column:
    """QoS as its journal name; a numeric wire code (level in the low 3 bits, K above) is translated.

    Almost every value is already a lower-case name: a set lookup passes those through and only the rest are cast
    and translated, which made this per-record normalization several times cheaper (it runs on every record and
    every ordered slot of every ACK).
    """
    code = col.try_cast("int")
    level = F.element_at(F.array(*[F.lit(x) for x in _LEVELS]), (code % 8) + 1)
    from_code = F.when(level == "k", F.concat(level, F.shiftright(code, 3).cast("string"))).otherwise(level)
    return F.when(col.isin(*_NAMES), col).when(code.isNotNull(), from_code).otherwise(F.lower(col))


def is_resilient(qos: Column) -> Column:
    """K-resilient, majority or safe: delivered only once enough members hold the packet.

    The set lookup answers for the names journals write; only other values starting with ``k`` reach the regular
    expression, which cost more than the rest of a filter over every delivery.
    """
    common = ["majority", "safe", *[f"k{k}" for k in range(1, 10)]]
    return qos.isin(*common) | (qos.startswith("k") & qos.rlike("^k[0-9]+$"))


def is_ordered(qos: Column) -> Column:
    """Total order and above: delivered in timestamp order."""
    return (qos == "total") | is_resilient(qos)


def is_source_ordered(qos: Column) -> Column:
    """Source order and above: delivered in per-source sequence order."""
    return (qos == "source") | is_ordered(qos)


def is_reliable(qos: Column) -> Column:
    """Every level but unreliable: never lost, never delivered twice."""
    return qos.isNotNull() & (qos != "unreliable")


def data_id(src: Column, seq: Column, qos: Column) -> Column:
    """Identity of a data packet, (source, sequence number, QoS), as one comparable string."""
    return F.concat_ws("|", F.lit("data"), src, seq.cast("string"), qos)


def member_list(members: Column) -> Column:
    """An ordered member list as one string; ``[pid, multicast_capable]`` elements reduce to the pid."""
    pid = F.transform(
        members, lambda m: F.when(m.startswith("["), F.get_json_object(m, "$[0]")).otherwise(m)
    )
    return F.concat_ws(",", pid)


def required_holders(qos: Column, group_size: Column) -> Column:
    """How many members must hold a packet before delivery (``QoS.required_holders`` in the engine).

    K is clamped to the group size; majority is a strict majority; safe is every member.  Null when the group size
    is needed but unknown.
    """
    k = F.regexp_extract(qos, "^k([0-9]+)$", 1).try_cast("long")
    return (
        F.when(k.isNotNull(), F.when(group_size.isNotNull(), F.least(k, group_size)).otherwise(k))
        .when(qos == "majority", F.floor(group_size / 2) + 1)
        .when(qos == "safe", group_size)
    )
