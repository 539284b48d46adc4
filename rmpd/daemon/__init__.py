"""The trio I/O shell around the sans-IO RMP process: UDP sockets, timers, the local client server, the journal."""
