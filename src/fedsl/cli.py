"""The ``fedsl`` command line: run, resume, show, presets."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import numpy as np
import typer
from rich.table import Table

from fedsl.cli_common import DATA_DIR_HELP, PRESET_HELP, UserError, console, select_variants
from fedsl.cli_common import clean_errors as _clean_errors
from fedsl.cli_common import load_config as _load_config
from fedsl.cli_common import print_line as _print_line
from fedsl.cli_tune import print_tune, tune, tune_first, tune_workers

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
        from fedsl.experiments.ray_backend import RayBackend, parse_resources
        backend = RayBackend(ray.strip(), parse_resources(ray_resources), quiet=quiet)
        backend.check()  # Ray installed, the address answers: before any check or run
        return backend
    if parallel is None or parallel == 1:
        return None
    if not 0 <= parallel <= 1024:
        raise UserError(f"--parallel {parallel}: expected a number of processes from 0 (one per core) to 1024")
    from fedsl.experiments.parallel import LocalPool, default_workers
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
    names = None if variants is None else [v.strip() for v in variants.split(",") if v.strip()]
    cfg = _load_config(config, preset, set_, data_dir, quick, names)  # --set refused where those variants replace it
    cfg = select_variants(cfg, variants, names)
    if out is None:
        out = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if tuned:
        cfg = tune_first(cfg, out, parallel, quiet)
    from fedsl.experiments.build import check_all
    from fedsl.experiments.sweep import expand_variants
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
        from fedsl.experiments.build import default_side_by_side
        side = default_side_by_side(runs, built)
        if side > 1:
            from fedsl.experiments.parallel import LocalPool
            say(f"running the {len(runs)} runs {side} side by side, one core each (--parallel 1: one after another)")
            backend = LocalPool(side, quiet=quiet)
    if out.exists() and any(p.name not in (".lock", *(("tune",) if tuned else ())) for p in out.iterdir()):
        raise UserError(f"--out {str(out)!r} is not empty: choose a new folder, or continue it with "
                        f"`fedsl resume {out}`")
    from fedsl.experiments.compare import run_group
    from fedsl.experiments.interrupts import terminate_as_interrupt
    from fedsl.report.tables import write_comparison
    log = (lambda s: None) if quiet else _print_line
    from fedsl.experiments.results import folder_lock
    with folder_lock(out), terminate_as_interrupt(), _connected(backend):
        run_group(cfg, out, log=log, progress=None if not quiet else False, built=built, backend=backend)
    write_comparison(out)
    _print_tables(out, f"{cfg.name}  ({out})")
    if len(cfg.variants) > 1 or len(cfg.seeds) > 1:
        console.print(f"curves: {out / 'comparison.png'}   table: {out / 'comparison.md'}", markup=False)


app.command("tune")(tune)  # fedsl.cli_tune: a study per variant on validation data


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
    from fedsl.experiments import tune as T
    from fedsl.experiments.compare import group_config, group_runs, is_group, run_group
    if rounds is not None and T.is_tune_folder(path):
        raise UserError(f"--rounds {rounds}: {str(path)!r} is a study of `fedsl tune`, whose trials have their own "
                        "rounds (tune.rounds): expected a run or group folder of `fedsl run`")
    if rounds is not None and T.is_tune_folder(path / "tune") and group_config(path) is None:
        raise UserError(f"--rounds {rounds}: {str(path)!r} is a `fedsl run --tuned` still in its studies: expected "
                        "its runs started; finish it with `fedsl resume` alone first")
    if T.is_tune_folder(path):
        from fedsl.experiments.interrupts import terminate_as_interrupt
        from fedsl.experiments.results import folder_lock
        with folder_lock(path), terminate_as_interrupt():
            T.reopen(path, (lambda s: None) if quiet else _print_line).run(tune_workers(parallel or 1))
        print_tune(path)
        return
    if T.is_tune_folder(path / "tune") and group_config(path) is None:  # `fedsl run --tuned` stopped in its studies
        cfg = tune_first(T.planned_config(path / "tune"), path, parallel, quiet)
        from fedsl.experiments.interrupts import terminate_as_interrupt
        from fedsl.experiments.results import folder_lock
        from fedsl.report.tables import write_comparison
        with folder_lock(path), terminate_as_interrupt():
            run_group(cfg, path, log=(lambda s: None) if quiet else _print_line, progress=None if not quiet else False)
        write_comparison(path)
        _print_tables(path, str(path))
        return
    backend = _backend(parallel, ray, ray_resources, quiet)
    from fedsl.experiments import config as C
    from fedsl.experiments.interrupts import terminate_as_interrupt
    from fedsl.experiments.runner import run as run_one
    from fedsl.report.tables import write_comparison
    progress = None if not quiet else False
    group_cfg = group_config(path)
    log = (lambda s: None) if quiet else _print_line
    runs = group_runs(path)
    if group_cfg is None and not any(rd.is_run() for rd in runs.values()):
        raise UserError(f"{str(path)!r} holds no run: expected a folder written by `fedsl run`")
    from fedsl.experiments import extend
    from fedsl.experiments.results import folder_lock
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
    from fedsl.cli_flower import is_flower_folder, print_flower
    from fedsl.experiments import tune as T
    if T.is_tune_folder(path):
        print_tune(path)
        return
    if is_flower_folder(path):
        print_flower(path)
        return
    from fedsl.experiments.compare import group_runs
    if not any(rd.summary_file.is_file() or rd.is_run() for rd in group_runs(path).values()):
        raise UserError(f"{str(path)!r} holds no run: expected a folder written by `fedsl run` "
                        "(or a Flower ServerApp's out-dir)")
    _print_tables(path, str(path))


@app.command()
@_clean_errors
def report(path: Path = typer.Argument(..., help="a run group or sweep folder")) -> None:
    """Figures and a Markdown report (with the paper's numbers for paper presets) in PATH/report/."""
    from fedsl.experiments.compare import is_group
    from fedsl.report.report import write_report
    if not is_group(path):
        raise UserError(f"{str(path)!r} is not a run folder of `fedsl run`: expected group.json in it")
    md = write_report(path)
    console.print(f"report: {md}", markup=False)


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


data_app = typer.Typer(no_args_is_help=True, help="Datasets: list, show, prepare, synthesise, partition.")
app.add_typer(data_app, name="data")

def _data_config(name: str, data_dir: Optional[Path], download: bool, split: str, carve: bool):
    from pydantic import ValidationError

    from fedsl.experiments.config import ConfigError, DataConfig
    try:
        return DataConfig(dataset=name, data_dir=str(data_dir) if data_dir else None, download=download,
                          emnist_split=split, carve=carve)
    except ValidationError as e:
        raise ConfigError(f"dataset {name!r}: {e.errors()[0]['msg']}") from None


@data_app.command("list")
@_clean_errors
def data_list(data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP)) -> None:
    """Known datasets and where each is looked for."""
    from fedsl.data.datasets import data_root, locate
    from fedsl.data.registry import DATASETS
    table = Table(title=f"datasets (data root: {data_root(str(data_dir) if data_dir else None)})")
    table.add_column("name")
    table.add_column("found at", overflow="fold")  # a folder's path is the answer: folded, never cut short
    table.add_column("size (publisher)")
    for name, info in DATASETS.items():
        if info.generated:
            where = "generated"
        else:
            found = locate(name, str(data_dir) if data_dir else None)
            where = str(found) if found else "not found"
        table.add_row(name, where, info.describe())
    console.print(table)


@data_app.command("show")
@_clean_errors
def data_show(name: str = typer.Argument(..., help="dataset name"),
              data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
              split: str = typer.Option("balanced", "--split", help="EMNIST split"),
              carve: bool = typer.Option(False, "--carve", help="carve train/test out of the one local split"),
              out: Optional[Path] = typer.Option(None, "--out", "-o", help="PNG of samples (default "
                                                 "runs/NAME-samples-TIME.png)", show_default=False)) -> None:
    """Counts per class and a contact sheet of samples."""
    from fedsl.data.datasets import is_text, load_arrays
    from fedsl.report.plots import contact_sheet
    ds = load_arrays(_data_config(name, data_dir, False, split, carve))
    text, features = is_text(ds.train.x), ds.train.x.dtype.kind == "f"
    shape = (f"windows of {ds.train.x.shape[1]} characters" if text else
             f"features {tuple(ds.train.x.shape[1:])}" if features else f"image {tuple(ds.train.x.shape[1:])}")
    console.print(f"{name}: {len(ds.train)} train / {len(ds.test)} test, {shape}", markup=False, highlight=False)
    table = Table()
    for col in ("class", "train", "test"):
        table.add_column(col, justify="right" if col != "class" else "left")
    import numpy as np
    tr = np.bincount(ds.train.y, minlength=len(ds.class_names))
    te = np.bincount(ds.test.y, minlength=len(ds.class_names))
    for c, cname in enumerate(ds.class_names):
        table.add_row(repr(cname) if text else cname, str(tr[c]), str(te[c]))
    console.print(table)
    if features:  # no pixels to show: the features' scale instead
        lo, hi = float(ds.train.x.min()), float(ds.train.x.max())
        console.print(f"features: values from {lo:.4g} to {hi:.4g}; no contact sheet (they are not images)",
                      markup=False, highlight=False)
        return
    if text:  # a contact sheet of text is its lines: the last window of each of the first clients, and its target
        chars = np.asarray(ds.class_names)
        for i, owner in enumerate((ds.train.owner_names or [])[:5]):
            last = np.flatnonzero(ds.train.owners == i)[-1]
            console.print(f"{owner}: {''.join(chars[ds.train.x[last]])!r} -> {str(chars[ds.train.y[last]])!r}",
                          markup=False, highlight=False)
        return
    out = out or _default_picture(f"{name}-samples")
    out.parent.mkdir(parents=True, exist_ok=True)
    contact_sheet(ds.train.x, ds.train.y, ds.class_names, out, title=name)
    console.print(f"samples: {out}", markup=False)


@data_app.command("prepare")
@_clean_errors
def data_prepare(name: str = typer.Argument(..., help="dataset name"),
                 data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
                 download: bool = typer.Option(False, "--download", help="download missing files"),
                 split: str = typer.Option("balanced", "--split", help="EMNIST split")) -> None:
    """Find (or download), verify, decode and cache a dataset."""
    from fedsl.data.datasets import load_arrays
    ds = load_arrays(_data_config(name, data_dir, download, split, False))
    console.print(f"{name}: {len(ds.train)} train, {len(ds.test)} test, {len(ds.class_names)} classes — "
                  "decoded and cached", markup=False)


@data_app.command("synth")
@_clean_errors
def data_synth(out: Path = typer.Option(Path("synthetic-chars"), "--out", "-o", help="image folder to write"),
               chars: str = typer.Option("0123456789", "--chars", help="the characters, one class each"),
               per_class: int = typer.Option(100, "--per-class", min=1, help="images per character"),
               seed: int = typer.Option(0, "--seed", min=0, help="seed of fonts, sizes, rotations and noise"),
               fslsyn: bool = typer.Option(False, "--fslsyn", help="the paper's FSLsyn recipe (15 per class)")) -> None:
    """Write font-rendered characters to OUT/<char>/NNNN.png (an image folder)."""
    from PIL import Image

    from fedsl.data.synthetic import fslsyn_chars, make_font_chars
    try:
        x, y = fslsyn_chars(chars) if fslsyn else make_font_chars(chars, per_class=per_class, seed=seed)
    except ValueError as e:
        raise UserError(str(e)) from None
    for c, ch in enumerate(chars):
        # folder names must be distinct on case-insensitive file systems: 'a' and 'A' differ
        folder = out / (f"{ch}_lower" if ch.islower() else ch)
        folder.mkdir(parents=True, exist_ok=True)
        for k, i in enumerate(np.flatnonzero(y == c)):
            Image.fromarray(x[i]).save(folder / f"{k:04d}.png")
    console.print(f"wrote {len(y)} images of {len(chars)} classes to {out}", markup=False)


@data_app.command("partition")
@_clean_errors
def data_partition(config: Optional[Path] = typer.Argument(None, help="TOML config file"),
                   preset: Optional[str] = typer.Option(None, "--preset", "-p", help=PRESET_HELP),
                   set_: List[str] = typer.Option([], "--set", "-s", help="override a key: --set data.num_clients=50"),
                   data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
                   out: Optional[Path] = typer.Option(None, "--out", "-o", help="heat-map PNG (default "
                                                      "runs/NAME-partition-TIME.png)", show_default=False)) -> None:
    """Per-client class histograms of a config's partition, and a heat map."""
    import torch

    from fedsl.algorithms.label_counts import label_counts
    from fedsl.data.clients import ClientIndex
    from fedsl.data.datasets import build_federation
    from fedsl.report.plots import partition_heatmap
    cfg = _load_config(config, preset, set_, data_dir)
    fed = build_federation(cfg.data, cfg.seed)
    kind = f"{cfg.data.partition} partition" if fed.on_demand is None else "a client per generated device"
    if fed.on_demand is None:
        counts = label_counts(fed.y, fed.clients, fed.server, fed.num_classes).clients.astype(np.int64)
    else:  # clients made on demand: the first 50 made here, not all N
        ids = np.arange(min(fed.num_clients, 50))
        _, y = fed.on_demand.samples(ids)
        own = ClientIndex.from_sizes(fed.clients.sizes_of(ids))
        counts = label_counts(torch.from_numpy(y), own, np.zeros(0, np.int64), fed.num_classes).clients.astype(np.int64)
    console.print(f"{cfg.name}: {kind}, N={fed.num_clients}, n={fed.n}, n0={fed.n0}",
                  markup=False, highlight=False)
    table = Table()
    table.add_column("client")
    table.add_column("n_i", justify="right")
    table.add_column("classes (count)")
    shown = counts if len(counts) <= 50 else counts[:50]
    for i, row in enumerate(shown):
        table.add_row(str(i), str(row.sum()), " ".join(f"{fed.class_names[c]}:{row[c]}" for c in np.flatnonzero(row)))
    if fed.n0:
        h = fed.server_histogram()
        table.add_row("server", str(fed.n0), " ".join(f"{fed.class_names[c]}:{h[c]}" for c in range(len(h)) if h[c]))
    console.print(table)
    if fed.num_clients > 50:
        console.print(f"(first 50 of {fed.num_clients} clients shown)")
    out = out or _default_picture(f"{cfg.name}-partition")
    out.parent.mkdir(parents=True, exist_ok=True)
    partition_heatmap(counts, fed.class_names, out, title=f"{cfg.name}: {kind}")
    console.print(f"heat map: {out}", markup=False)


@data_app.command("assess")
@_clean_errors
def data_assess(config: Optional[Path] = typer.Argument(None, help="TOML config file (an FSL run)"),
                preset: Optional[str] = typer.Option(None, "--preset", "-p", help=PRESET_HELP),
                set_: List[str] = typer.Option([], "--set", "-s", help="override a key of the run"),
                candidate: List[str] = typer.Option([], "--candidate", "-c", help="a candidate D0: "
                                                    "NAME:key=value[,key=value...] over data.server_* keys, e.g. "
                                                    "'stl10:data.server_source=dataset,data.server_dataset=stl10' "
                                                    "(default: the config's variants that set only such keys)"),
                warmup_rounds: int = typer.Option(0, "--warmup-rounds", help="assess at x_R after R FedAvg rounds "
                                                  "(default: at x_0)"),
                hessian_samples: int = typer.Option(4096, "--hessian-samples", help="clients' samples the estimate "
                                                    "of L reads (0 = all)"),
                power_iters: int = typer.Option(30, "--power-iters", help="power iterations for L, at most"),
                data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
                quick: bool = typer.Option(False, "--quick", help="the config's quick form (small subsets)"),
                out: Optional[Path] = typer.Option(None, "--out", "-o", help="folder for assess.json and assess.csv "
                                                   "(default runs/NAME-assess-TIME)"),
                quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output")) -> None:
    """Before training: will a server dataset D0 help? ξ², G², cos(∇F, ∇f0), L and the paper's condition
    2⟨∇F,∇f0⟩ > L·γη0·‖∇f0‖² per candidate D0, ranked, with a verdict."""
    from fedsl.experiments import assess as A
    if warmup_rounds < 0:
        raise UserError(f"--warmup-rounds {warmup_rounds}: expected 0 or more FedAvg rounds")
    if hessian_samples < 0:
        raise UserError(f"--hessian-samples {hessian_samples}: expected 0 (all) or a number of samples")
    if not 1 <= power_iters <= 10_000:
        raise UserError(f"--power-iters {power_iters}: expected 1 to 10,000")
    cfg = _load_config(config, preset, set_, data_dir, quick)
    skipped: list[str] = []
    if candidate:
        cands = [A.parse_candidate(c) for c in candidate]
    else:
        cands, skipped = A.candidates_from_variants(cfg)
    if out is None:
        out = Path("runs") / f"{cfg.name}-assess-{time.strftime('%Y%m%d-%H%M%S')}"
    taken = [f for f in A.FILES if (out / f).exists()]
    if taken:
        raise UserError(f"--out {str(out)!r} already holds {taken[0]}: choose a new folder")
    say = (lambda s: None) if quiet else _print_line
    if skipped:
        say(f"not candidates (they change more than D0): {', '.join(skipped)}")
    t0 = time.perf_counter()
    results = A.assess(cfg, cands, warmup_rounds, hessian_samples, power_iters, log=say)
    wall = time.perf_counter() - t0
    meta = {"config": cfg.name, "seed": cfg.seeds[0] if cfg.seeds else cfg.seed, "warmup_rounds": warmup_rounds,
            "L_method": "power iteration on Hessian-vector products of F at x",
            "hessian_samples": hessian_samples, "power_iters": power_iters, "wall_time": round(wall, 3)}
    js, cs = A.write(results, out, meta)
    table = Table(title=f"{cfg.name}: candidate server datasets at x_{warmup_rounds} (best first)")
    for col in ("rank", "candidate", "n0", "ξ²", "G²", "cos(∇F,∇f0)", "L", "γη0", "K0", "condition",
                "pred./step", "meas./step", "pred./round", "verdict"):
        table.add_column(col, justify="left" if col in ("candidate", "condition", "verdict") else "right")
    for r in results:
        table.add_row(str(r.rank), r.name, str(r.n0), f"{r.xi2:.4g}", f"{r.G2:.4g}", f"{r.cos_F_f0:.3f}",
                      f"{r.L:.4g}", f"{r.server_lr:.4g}", str(r.server_steps), "holds" if r.condition else "fails",
                      f"{r.predicted_gain_rel:.3f}", f"{r.measured_gain_rel:.3f}", f"{r.round_gain_rel:.3f}", r.verdict)
    console.print(table)
    for r in results:
        console.print(f"{r.rank}. {r.name}: {r.verdict} — {r.reason}", markup=False, highlight=False)
    console.print("gains: the decrease of F by one full-batch server step (predicted by the descent lemma, and "
                  "measured) and by a round's K0 steps (predicted, ranks the candidates), in units of ‖∇F‖²/(2L), the "
                  f"best step on F itself; {wall:.1f} s", markup=False, highlight=False)
    console.print(f"written: {js}  {cs}", markup=False)


sweep_app = typer.Typer(no_args_is_help=True, help="Sweeps: a config with \\[sweep] lists runs every combination "
                                                    "(`fedsl run`); `fedsl resume` continues one.")
app.add_typer(sweep_app, name="sweep")


@sweep_app.command("status")
@_clean_errors
def sweep_status(path: Path = typer.Argument(..., help="a sweep (group) folder")) -> None:
    """Progress of a sweep: runs by status, and the index of runs."""
    from collections import Counter

    from fedsl.experiments.compare import is_group
    from fedsl.report.tables import write_index
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedsl`` script; returns the exit status."""
    try:
        app(args=argv, prog_name="fedsl", standalone_mode=True)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
