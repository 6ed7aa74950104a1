"""The ``fedsl`` command line: run, resume, show, presets."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Federated Learning with Server Learning (FSL): simulate, compare, reproduce.")
console = Console()
err_console = Console(stderr=True)


class UserError(Exception):
    """Bad input; printed as one line, exit status 2."""


def _clean_errors(fn):
    """Turn expected errors (config, data, files) into one line on stderr and exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from fedsl.data.errors import DataError
        from fedsl.experiments.config import ConfigError
        try:
            return fn(*args, **kwargs)
        except (UserError, ConfigError, DataError) as e:
            # one line, whatever the message quotes back (newlines in keys, ':emoji:' codes)
            msg = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(e))
            err_console.print(f"error: {msg}", markup=False, highlight=False, emoji=False, soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            raise typer.Exit(130)
    return wrapper


def _print_tables(path: Path, title: str) -> None:
    """Per-run table, and per-variant means ± std when a variant ran with several seeds."""
    from fedsl.experiments.compare import RUN_COLUMNS, VARIANT_COLUMNS, fmt, run_rows, variant_rows
    short = {"final_accuracy": "final acc", "rise_time": "rise time", "rounds_done": "rounds", "wall_time": "time (s)"}

    def show(rows: list[dict], columns: tuple[str, ...], caption: str) -> None:
        table = Table(title=caption)
        for c in columns:
            table.add_column(short.get(c, c), justify="left" if c in ("run", "status", "variant") else "right")
        for r in rows:
            table.add_row(*(fmt(r.get(c), c) for c in columns))
        console.print(table)

    show(run_rows(path), RUN_COLUMNS, title)
    vrows = variant_rows(path)
    if any(r["seeds"] > 1 for r in vrows):
        show(vrows, VARIANT_COLUMNS, "mean ± std over seeds")


@app.command()
@_clean_errors
def run(config: Optional[Path] = typer.Argument(None, help="TOML config file", show_default=False),
        preset: Optional[str] = typer.Option(None, "--preset", "-p", help="run a bundled preset (see `fedsl presets`)"),
        set_: List[str] = typer.Option([], "--set", "-s", help="override a key: --set algorithm.local_lr=0.05"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="results folder (default runs/NAME-TIME)"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output")) -> None:
    """Run a config (or preset); with variants, run each and compare them."""
    from fedsl.experiments import config as C
    from fedsl.experiments import presets
    if (config is None) == (preset is None):
        raise UserError("give either a CONFIG file or --preset NAME (see `fedsl presets`)")
    base = presets.load(preset) if preset else None
    cfg = C.load(config, set_, base=base)
    from fedsl.experiments.runner import check
    for variant in C.expand_variants(cfg).values():  # every variant, data checks included, before any work
        check(variant)
    if out is None:
        out = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {str(out)!r} is not empty: choose a new folder, or continue it with `fedsl resume {out}`")
    from fedsl.experiments.compare import run_group
    log = (lambda s: None) if quiet else (lambda s: console.print(s, markup=False, highlight=False))
    run_group(cfg, out, log=log, progress=None if not quiet else False)
    _print_tables(out, f"{cfg.name}  ({out})")
    if len(cfg.variants) > 1 or len(cfg.seeds) > 1:
        console.print(f"curves: {out / 'comparison.png'}   table: {out / 'comparison.md'}", markup=False)


@app.command()
@_clean_errors
def resume(path: Path = typer.Argument(..., help="a run or group folder"),
           quiet: bool = typer.Option(False, "--quiet", "-q")) -> None:
    """Continue an interrupted run (or group of runs) from its last checkpoint."""
    from fedsl.experiments import config as C
    from fedsl.experiments.compare import group_runs, is_group, write_comparison
    from fedsl.experiments.runner import run as run_one
    log = (lambda s: None) if quiet else (lambda s: console.print(s, markup=False, highlight=False))
    runs = group_runs(path)
    if not any(rd.is_run() for rd in runs.values()):
        raise UserError(f"{str(path)!r} holds no run: expected a folder written by `fedsl run`")
    for name, rd in runs.items():
        if rd.read_summary().get("status") in ("completed", "diverged"):
            continue
        cfg = C.validate(rd.read_config()) if rd.is_run() else None
        if cfg is None:
            raise UserError(f"run {name!r} in {str(path)!r} never started; re-run it with `fedsl run`")
        run_one(cfg, rd.path, resume=True, log=log, progress=None if not quiet else False)
    if is_group(path):
        write_comparison(path)
    _print_tables(path, str(path))


@app.command()
@_clean_errors
def show(path: Path = typer.Argument(..., help="a run or group folder")) -> None:
    """Summary table of a run or group of runs."""
    from fedsl.experiments.compare import group_runs
    if not any(rd.summary_file.is_file() or rd.is_run() for rd in group_runs(path).values()):
        raise UserError(f"{str(path)!r} holds no run: expected a folder written by `fedsl run`")
    _print_tables(path, str(path))


@app.command("presets")
@_clean_errors
def list_presets() -> None:
    """List the bundled presets."""
    from fedsl.experiments import presets
    table = Table(title="presets (fedsl run --preset NAME)")
    table.add_column("name")
    table.add_column("description")
    for name, desc in presets.describe():
        table.add_row(name, desc)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedsl`` script; returns the exit status."""
    try:
        app(args=argv, prog_name="fedsl", standalone_mode=True)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
