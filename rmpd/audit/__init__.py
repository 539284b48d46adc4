"""Offline audit of RMP journals and wire captures with PySpark.

Data flow: ``read`` parses journal files once against an explicit schema (``schema``) and caches a narrow, typed
projection, each record numbered in its writer's order (``position``); ``views`` names it and every table the
checks derive from it as temporary views of the audit, and ``delivered`` builds the one several checks share
(every delivery with its view context); the check modules (``ordering``, ``ranges``, ``membership``,
``resilience``, ``scmp_check``, ``exactly_once``) turn views into SQL text (``check.Check``: what is checked, what
violates it); ``report`` counts every check in one statement on the executors, collects only counts and a few
examples, and renders the verdict; ``job`` glues them together for the CLI and for ``spark-submit``; ``pcap`` does
the same for tcpdump captures decoded with the project's own packet codec.
"""
