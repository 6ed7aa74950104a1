"""``fedsl tune`` and ``fedsl run --tuned`` on the command line: a study per variant on validation data
(``fedsl.tune``), its table, and the runs at the values it chose."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from fedsl.cli.common import UserError, clean_errors, console, load_config, print_line
from fedsl.config.own_keys import changed


@clean_errors
def tune(config: Optional[Path] = typer.Argument(None, help="TOML config file", show_default=False),
         preset: Optional[str] = typer.Option(None, "--preset", "-p", help="tune a bundled preset's variants"),
         variants: Optional[str] = typer.Option(None, "--variants", help="tune only these variants, e.g. "
                                                                        "--variants FedAvg,FSL"),
         trials: Optional[int] = typer.Option(None, "--trials", "-n", help="trials per variant (sets tune.trials)",
                                              show_default=False),
         set_: List[str] = typer.Option([], "--set", "-s", help="override a key: --set tune.rounds=50"),
         out: Optional[Path] = typer.Option(None, "--out", "-o", help="study folder (default runs/NAME-tune-TIME)"),
         data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="dataset folder (sets data.data_dir)"),
         quick: bool = typer.Option(False, "--quick", help="the config's quick form (few rounds, small subsets)"),
         parallel: int = typer.Option(1, "--parallel", "-j", help="trials side by side in N processes on this "
                                      "machine, sharing the studies (0 = one per core); with --ray, N tasks"),
         ray: Optional[str] = typer.Option(None, "--ray", help="the study's N workers as tasks of a Ray cluster: "
                                           "HOST:PORT of its head, 'auto' or 'local'; --out on a filesystem all "
                                           "nodes share (the studies in Optuna's journal file there, unless "
                                           "tune.storage says otherwise)"),
         ray_resources: Optional[str] = typer.Option(None, "--ray-resources", help="resources of each worker task, "
                                                     "e.g. 'cpus=2,gpus=0.5' (default: cpus=1)"),
         quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output")) -> None:
    """Tune each variant on validation data, the same budget each: an Optuna study per variant in OUT/study.db
    (tune.storage: or a journal file, or a database server)."""
    from fedsl import tune as T
    if trials is not None:
        set_ = [*set_, f"tune.trials={trials}"]
    cfg = load_config(config, preset, set_, data_dir, quick, variants)
    if ray is not None and not changed(cfg.tune, "storage"):
        # the nodes share --out over a network filesystem, where SQLite's locks often fail: Optuna's journal file
        cfg = cfg.model_copy(update={"tune": cfg.tune.model_copy(update={"storage": "journal"})})
    if out is None:
        out = Path("runs") / f"{cfg.name}-tune-{time.strftime('%Y%m%d-%H%M%S')}"
    say = (lambda s: None) if quiet else print_line
    backend = None
    if ray is not None:  # Ray installed and its address answering: one line before any trial otherwise
        from fedsl.sweeps.ray_backend import RayBackend, parse_resources
        backend = RayBackend(ray, parse_resources(ray_resources), quiet=quiet)
        backend.check()
    from fedsl.runs.interrupts import terminate_as_interrupt
    from fedsl.runs.results import folder_lock
    with folder_lock(out), terminate_as_interrupt():
        tuner = T.start(cfg, out, say)
        say(f"tuning {len(tuner.studies)} variant{'s' if len(tuner.studies) > 1 else ''}, {_budget(cfg.tune)} each, "
            f"into {out}")
        try:
            tuner.run(tune_workers(parallel), ray=backend)
        finally:
            if backend is not None:
                backend.close()
    print_tune(out)


def tune_first(cfg, out: Path, parallel: Optional[int], quiet: bool):
    """`fedsl run --tuned`: each variant's study in OUT/tune (started, or continued where it stopped), then ``cfg``
    at the values each chose (``tune.apply_best``): the runs on its seeds judge them on the test set."""
    from fedsl import tune as T
    from fedsl.runs.interrupts import terminate_as_interrupt
    from fedsl.runs.results import folder_lock
    if out.exists() and any(p.name not in (".lock", "tune") for p in out.iterdir()):
        raise UserError(f"--out {str(out)!r} is not empty: choose a new folder, or continue it with "
                        f"`fedsl resume {out}`")
    say = (lambda s: None) if quiet else print_line
    study = out / "tune"
    with folder_lock(out), terminate_as_interrupt():
        tuner = T.reopen(study, say) if T.is_tune_folder(study) else T.start(cfg, study, say)
        say(f"tuning {len(tuner.studies)} variant(s), {_budget(cfg.tune)} each, into {study}")
        tuner.run(tune_workers(parallel or 1))
    print_tune(study)
    return T.apply_best(cfg, study)


def _budget(t) -> str:
    """A study's budget in words: '24 trials', or '4,000 rounds run' (tune.budget_rounds)."""
    return f"{t.budget_rounds:,} rounds run" if t.budget_rounds else f"{t.trials} trials"


def tune_workers(parallel: int) -> int:
    if not 0 <= parallel <= 1024:
        raise UserError(f"--parallel {parallel}: expected a number of processes from 0 (one per core) to 1024")
    from fedsl.sweeps.parallel import default_workers
    return parallel or default_workers()


def print_tune(path: Path) -> None:
    """Each variant's study: its budget and what it spent (trials, rounds run), the best validation accuracy and
    values (a value at an edge of its range marked), the spread of its top trials."""
    from fedsl import tune as T
    T.write_report(path)
    table = Table(title=f"{path}  (validation accuracy; the test set is not read)")
    for c in ("variant", "trials", "rounds run", "pruned", "failed", "best val", "top-3 spread", "best values"):
        table.add_column(c, justify="left" if c in ("variant", "best values") else "right")
    edges = []
    for r in T.results(path):
        best = "—" if r["best"] is None else f"{r['best']:.4f} ({r['folder']})"
        spread = "—" if r.get("top_spread") is None else f"{r['top_spread']:.4f}"
        at_edge = r.get("at_edge", {})
        values = ", ".join((f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}") + (" [edge]" if k in at_edge
                                                                                           else "")
                           for k, v in r.get("params", {}).items())
        finished = r["complete"] + r["pruned"] + r["failed"]
        trials = f"{finished}/{r['budget']}" if r.get("budget") is not None else str(finished)
        rounds = f"{r.get('rounds_run', '?'):,}" + (f"/{r['budget_rounds']:,}" if r.get("budget_rounds") else "")
        table.add_row(r["variant"], trials, rounds, str(r["pruned"]), str(r["failed"]), best, spread, values)
        edges += [f"{r['variant']}: {k} {_edge_words(w)}" for k, w in at_edge.items()]
        if r.get("widened"):
            edges += [f"{r['variant']}: {k} widened ({w})" for k, w in r["widened"].items()]
    console.print(table)
    for line in edges:  # a choice at an edge says the optimum may lie outside what was searched
        console.print(line, markup=False)
    console.print(f"trials: {path / 'trials.png'}   chosen values: {path / 'best.json'}", markup=False)


def _edge_words(where: str) -> str:
    """'high (hard)' -> words for the line under the table."""
    side = where.split()[0]
    if "(of the list)" in where:
        return f"is the {'largest' if side == 'high' else 'smallest'} of its list (a grid: not widened)"
    if "(hard)" in where:
        return f"lies at the {side} edge of its range, a hard bound (not widened)"
    return f"lies at the {side} edge of its range (the optimum may lie beyond: widen it, tune.edge_widenings)"
