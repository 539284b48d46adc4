"""The trio runtime that drives one sans-IO RmpProcess: its UDP sockets, its timer, its journal, datagram keys, and
what every application of a process does alike (join and lock waiters, rejoin, a reader behind).  The daemon and
the embedded :class:`rmpd.Node` both run on it; neither imports the other."""
