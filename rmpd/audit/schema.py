"""The journal schema (``docs/trace-format.md``, version 1) as an explicit Spark schema, and shared names.

Reading with an explicit schema, rather than letting Spark infer one, keeps every file of every process in one
shape (absent fields become null), makes type errors visible as corrupt records instead of silently widened columns,
and avoids the extra pass over the data that inference costs.
"""

from __future__ import annotations

from pyspark.sql import types as T

SCHEMA_VERSION = 1

CORRUPT = "_corrupt_record"
"""Column holding the raw text of a line that did not parse against the schema."""

EVENTS = ("send", "recv", "deliver", "view", "token", "recovery", "scmp")

JOURNAL_SCHEMA = T.StructType(
    [
        T.StructField("v", T.LongType()),
        T.StructField("node", T.StringType()),
        T.StructField("group", T.StringType()),
        T.StructField("event", T.StringType()),
        T.StructField("view", T.StringType()),
        T.StructField("ts", T.LongType()),
        T.StructField("src", T.StringType()),
        T.StructField("seq", T.LongType()),
        T.StructField("qos", T.StringType()),
        T.StructField("wall", T.DoubleType()),
        T.StructField("mono", T.DoubleType()),
        # send / recv
        T.StructField("packet", T.StringType()),
        # Elements are [src, seq, qos]; Spark keeps non-string JSON tokens of a string field as their raw text.
        T.StructField("orders", T.ArrayType(T.ArrayType(T.StringType()))),
        T.StructField("next", T.StringType()),
        T.StructField("new_view", T.StringType()),
        # view / new_list: plain process IDs, or [pid, multicast_capable] pairs (kept as raw JSON text)
        T.StructField("members", T.ArrayType(T.StringType())),
        # deliver
        T.StructField("size", T.LongType()),
        T.StructField("holders", T.LongType()),
        T.StructField("need", T.LongType()),
        T.StructField("order_view", T.StringType()),
        # deliver of a keyed packet: the delivered messages' keys and the keys of copies left out (hex); a key-table
        # transfer packet is marked ``keytable``
        T.StructField("keys", T.ArrayType(T.StringType())),
        T.StructField("duplicates", T.ArrayType(T.StringType())),
        T.StructField("keytable", T.BooleanType()),
        # token
        T.StructField("prev", T.StringType()),
        # recovery
        T.StructField("role", T.StringType()),
        # scmp
        T.StructField("conn", T.StringType()),
        T.StructField("msg_ts", T.LongType()),
        T.StructField("accepted", T.BooleanType()),
        T.StructField(CORRUPT, T.StringType()),
    ]
)

COLUMNS = (
    "node", "group", "event", "view", "ts", "src", "seq", "qos", "packet", "orders", "new_view", "members",
    "holders", "need", "order_view", "keys", "role", "conn", "msg_ts", "accepted",
)
"""The fields the checks read; the others are validated when a line is parsed, then dropped before caching."""

POS = "pos"
"""Column numbering every record in the order its writer wrote it (``position``): one long, cheap to sort on; the
checks' SQL names it ``pos``."""

INVARIANTS = (
    "one-order",
    "total-order",
    "no-duplicate",
    "source-order",
    "virtual-synchrony",
    "atomicity",
    "k-resilience",
    "unique-view-id",
    "scmp-at-most-once",
    "exactly-once",
)
"""Journal invariants, named as the simulator's in-process checker names them."""

WIRE_INVARIANTS = ("wire-one-order", "wire-token-member", "wire-authentic")
"""Invariants checked on packet captures (``--pcap``)."""

EXAMPLE_FIELDS = ("node", "group", "view", "ts", "src", "seq", "detail")
"""Columns every check's violation rows carry, so examples from all checks share one shape."""
