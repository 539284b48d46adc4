"""`rmp`: the command a person types to simulate, audit and (later) use groups.

Each command lives in its own module with its own ``typer.Typer``; this module only joins them.  Every `rmp` builds
every command's options, so a command's module imports at its top only what its options need and what the daemon's
commands run with (trio, the client library); the auditor, the simulator, the bench and their progress bars are
imported by the command that runs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.audit_cmd import audit_app
from cli.bench_cmd import bench_app
from cli.call_cmds import call_app
from cli.group_cmds import group_app
from cli.message_cmds import message_app
from cli.sim_cmd import sim_app
from cli.sim_scmp_cmd import sim_scmp_app
from cli.status_cmd import status_app
from cli.version import version_callback

app = typer.Typer(
    name="rmp",
    help="Reliable Multicast Protocol: simulate, audit and use rmpd groups.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sim_app)
app.add_typer(sim_scmp_app)
app.add_typer(audit_app)
app.add_typer(bench_app)
app.add_typer(group_app)
app.add_typer(message_app)
app.add_typer(call_app)
app.add_typer(status_app)


@app.callback()
def global_options(
    ctx: typer.Context,
    socket: Annotated[Path | None, typer.Option("--socket", envvar="RMPD_SOCKET",
                                                help="The local rmpd's Unix socket.")] = None,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=version_callback("rmp"),
                                          help="Print the installed version and exit.")] = False,
) -> None:
    """Options for every command that talks to the local daemon."""
    ctx.obj = {"socket": socket}


def main() -> None:
    app()


if __name__ == "__main__":
    main()
