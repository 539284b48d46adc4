"""The daemon: the local client server and its hub around one process loop (rmpd.runtime), config, readiness."""
