"""SQL expressions shared by the checks: QoS classes, data packet identity, member lists.

Each function takes the SQL text of a column (or expression) and returns the SQL text of the derived one, so a
check is written as one SQL statement and analysed once.  They are Spark SQL built-ins (no Python UDFs), so the
checks run entirely in the JVM executors and need no Python on the workers.
"""

from __future__ import annotations

_LEVELS = ["unreliable", "unordered", "source", "total", "k", "majority", "safe"]

_NAMES = (*[x for x in _LEVELS if x != "k"], *[f"k{k}" for k in range(1, 10)])
"""Names journals write: already normalized, so ``qos_name`` returns them untouched."""

_RESILIENT = ("majority", "safe", *[f"k{k}" for k in range(1, 10)])


def _strings(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def qos_name(col: str) -> str:
    """QoS as its journal name; a numeric wire code (level in the low 3 bits, K above) is translated.

    Almost every value is already a lower-case name: a set lookup passes those through and only the rest are cast
    and translated, which made this per-record normalization several times cheaper (it runs on every record and
    every ordered slot of every ACK).
    """
    code = f"try_cast({col} AS INT)"
    level = f"element_at(array({_strings(_LEVELS)}), ({code} % 8) + 1)"
    from_code = f"CASE WHEN {level} = 'k' THEN concat({level}, CAST(shiftright({code}, 3) AS STRING)) ELSE {level} END"
    return (f"CASE WHEN {col} IN ({_strings(_NAMES)}) THEN {col} WHEN {code} IS NOT NULL THEN {from_code} "
            f"ELSE lower({col}) END")


def is_resilient(qos: str) -> str:
    """K-resilient, majority or safe: delivered only once enough members hold the packet.

    The set lookup answers for the names journals write; only other values starting with ``k`` reach the regular
    expression, which cost more than the rest of a filter over every delivery.
    """
    return f"({qos} IN ({_strings(_RESILIENT)}) OR (startswith({qos}, 'k') AND {qos} RLIKE '^k[0-9]+$'))"


def is_ordered(qos: str) -> str:
    """Total order and above: delivered in timestamp order."""
    return f"({qos} = 'total' OR {is_resilient(qos)})"


def is_source_ordered(qos: str) -> str:
    """Source order and above: delivered in per-source sequence order."""
    return f"({qos} = 'source' OR {is_ordered(qos)})"


def is_reliable(qos: str) -> str:
    """Every level but unreliable: never lost, never delivered twice."""
    return f"({qos} IS NOT NULL AND {qos} <> 'unreliable')"


def data_id(src: str, seq: str, qos: str) -> str:
    """Identity of a data packet, (source, sequence number, QoS), as one comparable string."""
    return f"concat_ws('|', 'data', {src}, CAST({seq} AS STRING), {qos})"


def member_list(members: str) -> str:
    """An ordered member list as one string; ``[pid, multicast_capable]`` elements reduce to the pid."""
    return (f"concat_ws(',', transform({members}, "
            f"m -> CASE WHEN startswith(m, '[') THEN get_json_object(m, '$[0]') ELSE m END))")


def required_holders(qos: str, group_size: str) -> str:
    """How many members must hold a packet before delivery (``QoS.required_holders`` in the engine).

    K is clamped to the group size; majority is a strict majority; safe is every member.  Null when the group size
    is needed but unknown.
    """
    k = f"try_cast(regexp_extract({qos}, '^k([0-9]+)$', 1) AS BIGINT)"
    return (
        f"CASE WHEN {k} IS NOT NULL THEN CASE WHEN {group_size} IS NOT NULL THEN least({k}, {group_size}) "
        f"ELSE {k} END WHEN {qos} = 'majority' THEN floor({group_size} / 2) + 1 "
        f"WHEN {qos} = 'safe' THEN {group_size} END"
    )


def split_id(what: str, part: int) -> str:
    """Field ``part`` (0: the kind) of an identity built by ``data_id`` or a claim's ``kind|...`` text."""
    return f"split({what}, '[|]')[{part}]"
