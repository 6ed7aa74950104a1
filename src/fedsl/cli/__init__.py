"""The ``fedsl`` command line, a module per command group: ``app`` (the Typer application, ``--version``),
``runs`` (run, resume, show, report, presets), ``data`` (fedsl data ...), ``sweep`` (fedsl sweep ...), ``tune``
(fedsl tune, and ``run --tuned``'s studies), ``flower`` (``show`` of a Flower ServerApp's out-dir) and ``common``
(errors as one line, config loading, the console).

The top layer: it may import every other package of fedsl, and nothing imports it but the package's ``__init__``.
"""

from __future__ import annotations

from fedsl.cli import data, runs, sweep  # noqa: F401  (their commands register on app)
from fedsl.cli.app import app

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedsl`` script; returns the exit status."""
    try:
        app(args=argv, prog_name="fedsl", standalone_mode=True)
    except SystemExit as e:
        return int(e.code or 0)
    return 0
