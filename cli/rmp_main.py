"""`rmp`: the command a person types to simulate, audit and (later) use groups.

Each command lives in its own module with its own ``typer.Typer``; this module only joins them.
"""

from __future__ import annotations

import typer

from cli.audit_cmd import audit_app
from cli.sim_cmd import sim_app

app = typer.Typer(
    name="rmp",
    help="Reliable Multicast Protocol: simulate, audit and use rmpd groups.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sim_app)
app.add_typer(audit_app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
