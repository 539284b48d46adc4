"""`rmpd`: the daemon entry point (the daemon itself lands with the daemon issue)."""

from __future__ import annotations

import typer

app = typer.Typer(name="rmpd", help="The RMP daemon: one RMP process per host.", add_completion=False)


@app.command()
def run() -> None:
    """Run the daemon (not available yet in this version)."""
    typer.echo("rmpd: the daemon is not available in this version; try `rmp sim`.", err=True)
    raise typer.Exit(2)


def main() -> None:
    app()
