"""``scmp-at-most-once``: no member accepts an SCMP (connection, message timestamp) twice, across restarts too.

A restarted process keeps its process ID, so its journals before and after the restart share ``node``; counting
acceptances per (node, group, conn, msg_ts) over all of them covers restarts.
"""

from __future__ import annotations

from .check import Check, example
from .tables import Tables


def scmp_at_most_once(v: Tables) -> Check:
    """Count acceptances of each (conn, msg_ts) per member; more than one is a violation."""
    accepted = v.table("scmp-at-most-once: accepted", lambda v: f"""
        SELECT node, "group", conn, msg_ts, count(1) AS n, min(view) AS view FROM {v.base}
        WHERE event = 'scmp' AND accepted GROUP BY node, "group", conn, msg_ts""")
    return Check(
        "scmp-at-most-once",
        f"SELECT * FROM {accepted}",
        example(f"{accepted} WHERE n > 1", "node", "view", "msg_ts", detail=(
            "concat('connection ', conn, ' message ts ', CAST(msg_ts AS STRING), ' accepted ', CAST(n AS STRING), "
            "' times')")),
    )
