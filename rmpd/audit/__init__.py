"""Offline audit of RMP journals and wire captures with PySpark.

Data flow: ``read`` parses journal files once against an explicit schema (``schema``) and caches a narrow, typed
projection, each record numbered in its writer's order (``position``); ``delivered`` and ``shared`` build the
tables several checks share (every delivery with its view context, the slot claims) once per audit; the check
modules (``ordering``, ``membership``, ``resilience``, ``scmp_check``) are pure ``DataFrame -> DataFrame``
transforms that return the violating rows; ``report`` runs them on the executors, collects only counts and a few
examples, and renders the verdict; ``job`` glues them together for the CLI and for ``spark-submit``; ``pcap`` does
the same for tcpdump captures decoded with the project's own packet codec.
"""
