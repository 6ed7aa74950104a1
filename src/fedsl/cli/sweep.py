"""``fedsl sweep``: the status of a sweep's runs."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from fedsl.cli.app import app
from fedsl.cli.common import UserError, console
from fedsl.cli.common import clean_errors as _clean_errors

sweep_app = typer.Typer(no_args_is_help=True, help="Sweeps: a config with \\[sweep] lists runs every combination "
                                                    "(`fedsl run`); `fedsl resume` continues one.")
app.add_typer(sweep_app, name="sweep")


@sweep_app.command("status")
@_clean_errors
def sweep_status(path: Path = typer.Argument(..., help="a sweep (group) folder")) -> None:
    """Progress of a sweep: runs by status, and the index of runs."""
    from collections import Counter

    from fedsl.report.tables import write_index
    from fedsl.sweeps.compare import is_group
    if not is_group(path):
        raise UserError(f"{str(path)!r} is not a sweep folder: expected group.json written by `fedsl run`")
    index = write_index(path)
    import csv
    with open(index, newline="") as f:
        rows = list(csv.DictReader(f))
    counts = Counter(r["status"] for r in rows)
    console.print(f"{path}: {len(rows)} runs — " + ", ".join(f"{n} {st}" for st, n in sorted(counts.items())),
                  markup=False, highlight=False)
    table = Table()
    for col in rows[0].keys() if rows else ():
        table.add_column(col)
    for r in rows:
        table.add_row(*(r[c] if c in ("run", "variant", "status") or not r[c] else _short_num(r[c]) for c in r))
    console.print(table)
    console.print(f"index: {index}", markup=False)


def _short_num(text: str) -> str:
    try:
        v = float(text)
    except ValueError:
        return text
    return str(int(v)) if v.is_integer() else f"{v:.4g}"
