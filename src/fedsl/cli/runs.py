"""``fedsl run``, ``resume``, ``show``, ``report`` and ``presets``: a run, a group or a study from a config, and
reading their folders."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from fedsl.cli.app import app
from fedsl.cli.common import UserError, console
from fedsl.cli.common import clean_errors as _clean_errors
from fedsl.cli.common import load_config as _load_config
from fedsl.cli.common import print_line as _print_line
from fedsl.cli.tune import print_tune, tune, tune_first, tune_workers


def _default_picture(what: str) -> Path:
    """Where a `fedsl data` command puts its picture without --out: a file of its own under runs/, as `fedsl run`
    puts its results, not beside the user's files in the working directory."""
    return Path("runs") / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}.png"


BIG_SWEEP = 500  # `fedsl run` asks for --yes beyond this many runs


PARALLEL_HELP = ("run the sweep's runs side by side in N processes on this machine, one torch thread each "
                 "(0 = one per core; 1 = one after another; default: side by side on a CPU's free cores when "
                 "the runs are long and threads = 0, else one after another)")
RAY_HELP = ("run the sweep's runs as tasks on a Ray cluster: HOST:PORT of its head (`ray start --head`), 'auto', or "
            "'local' (Ray on this machine); the --out folder must be on a filesystem all nodes share; "
            "needs the \\[ray] extra")  # help texts are rich markup: "\\[" keeps the '['
ROUNDS_HELP = ("take the run or group on to T rounds, as if it had been asked for T from the start (the same model "
               "and metrics.csv rows, bit for bit): a completed run continues from its last checkpoint, an unfinished "
               "one takes T as its target; refused in one line where a run of T rounds differs from round 1 on (a "
               "linear or cosine server.gamma_schedule, privacy.target_epsilon, SCAFFOLD's states of a completed run)")
RAY_RESOURCES_HELP = "resources of each run's Ray task, e.g. 'cpus=2,gpus=0.5,memory=4GB' (default: cpus=threads or 1)"


def _backend(parallel: Optional[int], ray: Optional[str], ray_resources: Optional[str], quiet: bool):
    """The backend of --parallel / --ray (None: runs one after another in this process). Ray is
    imported only with --ray."""
    if parallel is not None and ray is not None:
        raise UserError(f"--parallel {parallel} and --ray {ray!r}: expected one of them (Ray runs the tasks "
                        "side by side itself)")
    if ray_resources is not None and ray is None:
        raise UserError(f"--ray-resources {ray_resources!r}: expected together with --ray ADDRESS")
    if ray is not None:
        from fedsl.sweeps.ray_backend import RayBackend, parse_resources
        backend = RayBackend(ray.strip(), parse_resources(ray_resources), quiet=quiet)
        backend.check()  # Ray installed, the address answers: before any check or run
        return backend
    if parallel is None or parallel == 1:
        return None
    if not 0 <= parallel <= 1024:
        raise UserError(f"--parallel {parallel}: expected a number of processes from 0 (one per core) to 1024")
    from fedsl.sweeps.parallel import LocalPool, default_workers
    return LocalPool(parallel or default_workers(), quiet=quiet)


def _connected(backend):
    """Join the Ray cluster first (a bad address: one line, before any run starts); leave it after."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        if backend is None or not hasattr(backend, "connect"):
            yield
            return
        backend.connect()
        try:
            yield
        finally:
            backend.close()
    return cm()


def _print_tables(path: Path, title: str) -> None:
    """Per-run table, and per-variant means ± std when a variant ran with several seeds."""
    from fedsl.engine.metrics import WINDOW
    from fedsl.report.tables import RUN_COLUMNS, VARIANT_COLUMNS, fmt, group_spec, legend, run_rows, variant_rows
    short = {"final_accuracy": "final acc", "rise_time": "rise time", "rounds_done": "rounds", "wall_time": "time (s)"}

    def show(rows: list[dict], columns: tuple[str, ...], caption: str) -> None:
        table = Table(title=caption)
        for c in columns:
            table.add_column(short.get(c, c), justify="left" if c in ("run", "status", "variant") else "right")
        for r in rows:
            table.add_row(*(fmt(r.get(c), c) for c in columns))
        console.print(table)

    rows = run_rows(path)
    show(rows, RUN_COLUMNS, title)
    vrows = variant_rows(path)
    if any(r["seeds"] > 1 for r in vrows):
        show(vrows, VARIANT_COLUMNS, "mean ± sample std over seeds")
    window = (group_spec(path) or {}).get("window", WINDOW)
    console.print(legend(window, [r["rounds_done"] for r in rows]), markup=False, highlight=False)


@app.command()
@_clean_errors
def run(config: Optional[Path] = typer.Argument(None, help="TOML config file", show_default=False),
        preset: Optional[str] = typer.Option(None, "--preset", "-p", help="run a bundled preset (see `fedsl presets`)"),
        set_: List[str] = typer.Option([], "--set", "-s", help="override a key: --set algorithm.local_lr=0.05"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="results folder (default runs/NAME-TIME)"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="dataset folder (sets data.data_dir)"),
        quick: bool = typer.Option(False, "--quick", help="the config's quick form: few rounds, one seed, "
                                                           "small subsets"),
        variants: Optional[str] = typer.Option(None, "--variants", help="run only these variants, e.g. "
                                                                       "--variants FSL,SCAFFOLD"),
        yes: bool = typer.Option(False, "--yes", "-y", help=f"run a sweep of more than {BIG_SWEEP} runs"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output"),
        parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP, show_default=False),
        ray: Optional[str] = typer.Option(None, "--ray", help=RAY_HELP, show_default=False),
        ray_resources: Optional[str] = typer.Option(None, "--ray-resources", help=RAY_RESOURCES_HELP,
                                                    show_default=False),
        track: List[str] = typer.Option([], "--track", help="follow each run in 'tensorboard' or 'mlflow' too "
                                                            "(repeatable; sets tracking = [...])"),
        tuned: bool = typer.Option(False, "--tuned", help="first tune each variant on validation data (its \\[tune] "
                                   "table; OUT/tune, as fedsl tune), then run its seeds at the chosen values")) -> None:
    """Run a config (or preset); with variants, run each and compare them."""
    backend = _backend(parallel, ray, ray_resources, quiet)
    if track:  # a TOML list of strings, as --set tracking=[...] would give it
        set_ = [*set_, "tracking=[" + ", ".join(json.dumps(t) for t in track) + "]"]
    cfg = _load_config(config, preset, set_, data_dir, quick, variants)  # --set refused where those variants replace it
    if out is None:
        out = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if tuned:
        cfg = tune_first(cfg, out, parallel, quiet)
    from fedsl.config.expand import expand_variants
    from fedsl.runs.build import check_all
    runs = expand_variants(cfg)
    if len(runs) > BIG_SWEEP and not yes:
        raise UserError(f"the config makes {len(runs)} runs (variants × sweep points × seeds), more than {BIG_SWEEP}: "
                        "pass --yes to run them all, or sweep fewer values")
    say = (lambda s: None) if quiet else (lambda s: console.print(s, markup=False, highlight=False))
    say(f"checking {len(runs)} run{'' if len(runs) == 1 else 's'}...")
    shown = time.monotonic()

    def checked(i: int) -> None:
        nonlocal shown
        if time.monotonic() - shown > 10 and i < len(runs):  # a big sweep's checks take minutes
            say(f"checked {i}/{len(runs)} runs...")
            shown = time.monotonic()
    built = check_all(runs, checked)  # every run, data checks included, before any work; kept for the runs
    if backend is None and parallel is None:  # neither --parallel nor --ray: side by side where that pays
        from fedsl.runs.build import default_side_by_side
        side = default_side_by_side(runs, built)
        if side > 1:
            from fedsl.sweeps.parallel import LocalPool
            say(f"running the {len(runs)} runs {side} side by side, one core each (--parallel 1: one after another)")
            backend = LocalPool(side, quiet=quiet)
    if out.exists() and any(p.name not in (".lock", *(("tune",) if tuned else ())) for p in out.iterdir()):
        raise UserError(f"--out {str(out)!r} is not empty: choose a new folder, or continue it with "
                        f"`fedsl resume {out}`")
    from fedsl.report.tables import write_comparison
    from fedsl.runs.interrupts import terminate_as_interrupt
    from fedsl.sweeps.compare import run_group
    log = (lambda s: None) if quiet else _print_line
    from fedsl.runs.results import folder_lock
    with folder_lock(out), terminate_as_interrupt(), _connected(backend):
        run_group(cfg, out, log=log, progress=None if not quiet else False, built=built, backend=backend)
    write_comparison(out)
    _print_tables(out, f"{cfg.name}  ({out})")
    if len(cfg.variants) > 1 or len(cfg.seeds) > 1:
        console.print(f"curves: {out / 'comparison.png'}   table: {out / 'comparison.md'}", markup=False)


app.command("tune")(tune)  # fedsl.cli.tune: a study per variant on validation data


@app.command()
@_clean_errors
def resume(path: Path = typer.Argument(..., help="a run, group or tune folder"),
           quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output"),
           parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP, show_default=False),
           ray: Optional[str] = typer.Option(None, "--ray", help=RAY_HELP, show_default=False),
           ray_resources: Optional[str] = typer.Option(None, "--ray-resources", help=RAY_RESOURCES_HELP,
                                                       show_default=False),
           rounds: Optional[int] = typer.Option(None, "--rounds", help=ROUNDS_HELP, show_default=False)) -> None:
    """Continue an interrupted run, group of runs or study (fedsl tune) from its last checkpoint; with --rounds T,
    take a run or group on to T rounds, as if it had been asked for T from the start."""
    from fedsl import tune as T
    from fedsl.sweeps.compare import group_config, group_runs, is_group, run_group
    if rounds is not None and T.is_tune_folder(path):
        raise UserError(f"--rounds {rounds}: {str(path)!r} is a study of `fedsl tune`, whose trials have their own "
                        "rounds (tune.rounds): expected a run or group folder of `fedsl run`")
    if rounds is not None and T.is_tune_folder(path / "tune") and group_config(path) is None:
        raise UserError(f"--rounds {rounds}: {str(path)!r} is a `fedsl run --tuned` still in its studies: expected "
                        "its runs started; finish it with `fedsl resume` alone first")
    if T.is_tune_folder(path):
        from fedsl.runs.interrupts import terminate_as_interrupt
        from fedsl.runs.results import folder_lock
        with folder_lock(path), terminate_as_interrupt():
            T.reopen(path, (lambda s: None) if quiet else _print_line).run(tune_workers(parallel or 1))
        print_tune(path)
        return
    if T.is_tune_folder(path / "tune") and group_config(path) is None:  # `fedsl run --tuned` stopped in its studies
        cfg = tune_first(T.planned_config(path / "tune"), path, parallel, quiet)
        from fedsl.report.tables import write_comparison
        from fedsl.runs.interrupts import terminate_as_interrupt
        from fedsl.runs.results import folder_lock
        with folder_lock(path), terminate_as_interrupt():
            run_group(cfg, path, log=(lambda s: None) if quiet else _print_line, progress=None if not quiet else False)
        write_comparison(path)
        _print_tables(path, str(path))
        return
    backend = _backend(parallel, ray, ray_resources, quiet)
    from fedsl.config import schema as C
    from fedsl.report.tables import write_comparison
    from fedsl.runs.interrupts import terminate_as_interrupt
    from fedsl.runs.runner import run as run_one
    progress = None if not quiet else False
    group_cfg = group_config(path)
    log = (lambda s: None) if quiet else _print_line
    runs = group_runs(path)
    if group_cfg is None and not any(rd.is_run() for rd in runs.values()):
        raise UserError(f"{str(path)!r} holds no run: expected a folder written by `fedsl run`")
    from fedsl.runs.results import folder_lock
    from fedsl.sweeps import extend
    with folder_lock(path), terminate_as_interrupt(), _connected(backend if group_cfg is not None else None):
        if group_cfg is not None:  # the group's own config: unstarted runs start, the others continue
            if rounds is not None:  # group.json and every run's files made those of T rounds first
                group_cfg = extend.extend_group(path, group_cfg, rounds)
            run_group(group_cfg, path, resume=True, log=log, progress=progress, backend=backend)
        else:
            for name, rd in runs.items():
                if not rd.is_run() and rd.read_summary().get("status") not in ("completed", "diverged"):
                    raise UserError(f"run {name!r} in {str(path)!r} never started and the group was written by "
                                    "an older fedsl without its config; re-run the group with `fedsl run`")
            if rounds is not None:  # each run's files made those of T rounds first: it then continues as any
                extend.extend_runs(path, runs, rounds)
            for rd in runs.values():
                if rd.read_summary().get("status") in ("completed", "diverged"):
                    continue
                run_one(C.validate_saved(rd.read_config()), rd.path, resume=True, log=log, progress=progress)
    if is_group(path):
        write_comparison(path)
    _print_tables(path, str(path))


@app.command()
@_clean_errors
def show(path: Path = typer.Argument(..., help="a run, group or tune folder, or a Flower ServerApp's "
                                                "out-dir")) -> None:
    """Summary table of a run, a group of runs, a study (fedsl tune) or a Flower ServerApp's out-dir. A run
    killed (kill -9) shows as interrupted at its checkpoint's round, one in progress as running."""
    from fedsl import tune as T
    from fedsl.cli.flower import is_flower_folder, print_flower
    if T.is_tune_folder(path):
        print_tune(path)
        return
    if is_flower_folder(path):
        print_flower(path)
        return
    from fedsl.sweeps.compare import group_config, group_runs
    studies = T.is_tune_folder(path / "tune")
    if studies and group_config(path) is None:  # `fedsl run --tuned` still in its studies: they are its state
        console.print(f"{path}: `fedsl run --tuned` in its studies; the seed runs start after them "
                      f"(stopped, it continues with `fedsl resume {path}`)", markup=False, highlight=False,
                      soft_wrap=True)
        print_tune(path / "tune")
        return
    if not any(rd.summary_file.is_file() or rd.is_run() for rd in group_runs(path).values()):
        raise UserError(f"{str(path)!r} holds no run: expected a folder written by `fedsl run` "
                        "(or a Flower ServerApp's out-dir)")
    _print_tables(path, str(path))
    if studies:
        console.print(f"the studies that chose these values: `fedsl show {path / 'tune'}`", markup=False,
                      highlight=False, soft_wrap=True)


@app.command()
@_clean_errors
def report(path: Path = typer.Argument(..., help="a run group or sweep folder")) -> None:
    """Figures and a Markdown report (with the paper's numbers for paper presets) in PATH/report/."""
    from fedsl.report.report import write_report
    from fedsl.sweeps.compare import is_group
    if not is_group(path):
        raise UserError(f"{str(path)!r} is not a run folder of `fedsl run`: expected group.json in it")
    md = write_report(path)
    console.print(f"report: {md}", markup=False)


@app.command("presets")
@_clean_errors
def list_presets() -> None:
    """List the bundled presets."""
    from fedsl.config import presets
    table = Table(title="presets (fedsl run --preset NAME)")
    table.add_column("name")
    table.add_column("description")
    for name, desc in presets.describe():
        table.add_row(name, desc)
    console.print(table)
