"""SCMP at-most-once messages (Liskov, Shrira, Wroclawski) with adaptive lifetimes, and at-most-once RPC on top.

``filter``   the connection table, ``upper`` and the resilient ``latest`` bound (SCMP figures 2-1 and 2-2)
``lifetime`` the lifetime estimate ``p``: fixed, unlimited horizon, limited horizon (adaptive paper, figures 2-3)
``rpc``      server states IDLE / COMPUTING / REPLYING with stored replies (SCMP figure 3-1)
``latest``   the one piece that does I/O: ``latest`` on stable storage, written ahead and fsynced, never lowered

All times are integers in milliseconds of the clock the caller passes in; nothing here reads a clock.
"""
