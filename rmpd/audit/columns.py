"""SQL expressions shared by the journal checks (DuckDB): QoS classes, data packet identity, list columns.

Each function takes the SQL text of a column (or expression) and returns the SQL text of the derived one, so a
check is written as one SQL statement.  QoS values arrive as names (``records.qos_name``).
"""

from __future__ import annotations

from .records import FIELD, ITEM

_RESILIENT = ("majority", "safe", *[f"k{k}" for k in range(1, 10)])


def _strings(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def is_resilient(qos: str) -> str:
    """K-resilient, majority or safe: delivered only once enough members hold the packet.

    The set lookup answers for the names journals write; only other values starting with ``k`` reach the regular
    expression.
    """
    return (f"({qos} IN ({_strings(_RESILIENT)}) OR (starts_with({qos}, 'k') AND "
            f"regexp_full_match({qos}, 'k[0-9]+')))")


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


def split_id(what: str, part: int) -> str:
    """Field ``part`` (0: the kind) of an identity built by ``data_id`` or a claim's ``kind|...`` text."""
    return f"string_split({what}, '|')[{part + 1}]"


def items(column: str) -> str:
    """A list column as ``records.flat`` joined it, as a list again (empty for an empty list, null for null)."""
    return f"CASE WHEN {column} = '' THEN []::VARCHAR[] ELSE string_split({column}, chr({ord(ITEM)})) END"


def order_field(entry: str, part: int) -> str:
    """Field ``part`` (0 src, 1 seq, 2 qos) of one ``orders`` entry; null where the journal had null."""
    return f"nullif(string_split({entry}, chr({ord(FIELD)}))[{part + 1}], '')"


def required_holders(qos: str, group_size: str) -> str:
    """How many members must hold a packet before delivery (``QoS.required_holders`` in the engine).

    K is clamped to the group size; majority is a strict majority; safe is every member.  Null when the group size
    is needed but unknown.
    """
    k = f"try_cast(nullif(regexp_extract({qos}, '^k([0-9]+)$', 1), '') AS BIGINT)"
    return (
        f"CASE WHEN {k} IS NOT NULL THEN CASE WHEN {group_size} IS NOT NULL THEN least({k}, {group_size}) "
        f"ELSE {k} END WHEN {qos} = 'majority' THEN {group_size} // 2 + 1 "
        f"WHEN {qos} = 'safe' THEN {group_size} END"
    )
