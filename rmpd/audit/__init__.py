"""Offline audit of RMP journals and wire captures with PySpark.

Data flow: ``read`` turns journal files into one DataFrame with an explicit schema (``schema``); the check modules
(``ordering``, ``membership``, ``resilience``, ``scmp_check``) are pure ``DataFrame -> DataFrame`` transforms that
return the violating rows; ``report`` runs them on the executors, collects only counts and a few examples, and
renders the verdict; ``job`` glues them together for the CLI and for ``spark-submit``; ``pcap`` does the same for
tcpdump captures decoded with the project's own packet codec.
"""
