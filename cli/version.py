"""`--version` for `rmp` and `rmpd`: the version of the installed rmpd package, which both commands belong to."""

from __future__ import annotations

from collections.abc import Callable

import typer


def installed_version() -> str:
    """The installed package's version (what `pip show rmpd` says); a source tree that is not installed has none."""
    from importlib.metadata import PackageNotFoundError, version  # read only for --version: slow to import

    try:
        return version("rmpd")
    except PackageNotFoundError:
        return "unknown (not installed)"


def version_callback(command: str) -> Callable[[bool], None]:
    """An eager `--version` option's callback: print ``command`` and the version, and exit 0 before anything runs."""

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{command} {installed_version()}")
            raise typer.Exit()

    return show
