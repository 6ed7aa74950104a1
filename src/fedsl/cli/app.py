"""The ``fedsl`` command's Typer application and its top-level options (``--version``); the command groups' modules
register their commands on it."""

from __future__ import annotations

import typer

from fedsl.cli.common import console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Federated Learning with Server Learning (FSL): simulate, compare, reproduce.")


def _print_version(value: bool) -> None:
    if value:
        from fedsl import __version__
        console.print(f"fedsl {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="print fedsl's version and exit")) -> None:
    """Federated Learning with Server Learning (FSL): simulate, compare, reproduce."""
