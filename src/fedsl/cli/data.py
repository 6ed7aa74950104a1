"""``fedsl data``: list, show, prepare, synthesise, partition and assess datasets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import numpy as np
import typer
from rich.table import Table

from fedsl.cli.app import app
from fedsl.cli.common import DATA_DIR_HELP, PRESET_HELP, UserError, console
from fedsl.cli.common import clean_errors as _clean_errors
from fedsl.cli.common import load_config as _load_config
from fedsl.cli.common import print_line as _print_line
from fedsl.cli.runs import _default_picture

data_app = typer.Typer(no_args_is_help=True, help="Datasets: list, show, prepare, synthesise, partition.")
app.add_typer(data_app, name="data")

def _data_config(name: str, data_dir: Optional[Path], download: bool, split: str, carve: bool):
    from pydantic import ValidationError

    from fedsl.config.schema import ConfigError, DataConfig
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

    from fedsl.sources.synthetic import fslsyn_chars, make_font_chars
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
    import fedsl.assess as A
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
