"""A nemesis for real daemons: namespace hosts, no supervisor, seeded faults, and what every message became.

``scripts/nemesis`` starts N network-namespace hosts (``scripts/netns``), one ``rmpd`` on each with a fixed port,
its own state directory and its own journal, joins them all to one group with ``rmp join`` (kept across restarts),
and runs a client on every host that streams messages into the group through the client library and records each
one's outcome.  Meanwhile it injects faults from a schedule drawn from ``--seed``: kill -9 of one daemon and a
restart on the same port and state directory, partitions (one host cut off, a minority/majority split, every host
alone), loss bursts, and once all daemons killed and started again at the same moment.  Nothing rejoins anything:
a restarted daemon rejoins what ``rmp join`` recorded, a cut-off one rejoins by itself, and the clients only attach
to the membership their daemon already has.

At the end it heals everything, waits for one view of all hosts (the convergence time, counted from the last heal
or restart), lets the clients drain, stops the daemons, audits every journal with ``rmp audit``, and reports.

The per-host client is ``client.py`` (``python -m tools.nemesis client ...``, run inside its namespace):
its log of what each send returned and what the group delivered is all the report's message counts come from.
With ``--exactly-once`` it is ``keyed.py``: every message has a key of its own and is sent again until the group
confirms it, and ``tally_keys`` counts what became of every key (the journals say whether a key was delivered
anywhere).

The modules, one part each: ``plan`` (the schedule from the seed), ``cluster`` (the hosts, their daemons and
clients), ``client`` (the per-host client), ``keyed`` (the per-host client of ``--exactly-once``), ``monitor``
(every host's view, polled), ``faults`` (the schedule done to the cluster), ``run`` (one whole run), ``tally``
(every message's outcome), ``tally_keys`` (every key's outcome), ``report`` (the report and its table) and
``__main__`` (the command lines).
"""
