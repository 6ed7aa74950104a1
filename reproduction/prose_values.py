"""What one folder lets the prose quote plainly (``variant_values``): the values a plain number of
reproduction/prose_plain.py may be, per variant.

- a run's or a variant's final accuracy, T_0.5, rise time or time from summary.json / index.csv, their mean or sample
  std over seeds, a difference of two variants' means or its paired SE, a chosen hyper-parameter, best value, top
  three and their spread from best.json (and a widened range's ends), on a grid of η_l × C a cell's loss against its
  column's best (and its row's largest and mean loss, the fixed η_l's loss, G: ``fedsl.report.grid``), a time of the
  folder's round_cost.md (reproduction/round_cost.py's table: its row's variant's), an assessment's score or
  Spearman's ρ; a variant the folder's claims read that has no runs of its own ("FedAvg+FT", FedAvg's runs
  fine-tuned) is a variant like the others;
- a setting: any number of the variant's config.json, summary.json's hyper-parameters or its sweep cell, and, in
  a preset's own folder (reproduction/NAME whose group.json is named NAME, a preset's name), of that preset: its
  settings and the variant's table (``PRESET_NOT_SETTINGS``: not its claims, paper numbers, quick form or ranges);
- the counts of its runs, seeds and trials (``Values.counts``), which the prose's counting words are checked against.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prose_base import METRICS, NUMBER, _cells, _sample_std, assessment_pairs

from fedsl.config import presets
from fedsl.report import grid, verdicts

# a preset's tables that are no setting of its runs: what it claims and quotes, its quick form, its sweep's and
# tuning's ranges (a run's own cell is its group.json's params), and the variants (each reads its own table)
PRESET_NOT_SETTINGS = {"claims", "paper", "paper_claims", "paper_rounds", "quick", "sweep", "tune", "variants"}
PAIRS = ("pairs",)  # kept for callers of variant_values: its table key of pair differences


def _leaves(obj, out: list[float]) -> None:
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        if not (isinstance(obj, float) and math.isnan(obj)):
            out.append(float(obj))
    elif isinstance(obj, dict):
        for v in obj.values():
            _leaves(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _leaves(v, out)


@dataclass
class Values:
    """What one folder lets the prose quote plainly."""
    name: str = ""
    variants: dict[str, list[float]] = field(default_factory=dict)  # results, settings and choices per variant
    pairs: dict[frozenset, list[float]] = field(default_factory=dict)  # two variants' differences of means, SEs
    folder: list[float] = field(default_factory=list)  # what no variant owns (Spearman's ρ of an assessment, ...)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # variant -> {kind of count: n}
    runs: dict[str, list[Path]] = field(default_factory=dict)  # variant -> its runs' folders (for per-round values)
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> {metric: mean over seeds}


def variant_values(folder: Path) -> Values:
    """What the prose may quote of the folder: per variant, each run's final metrics (summary.json's final_*,
    initial_*, T_*, rise_time, rounds_done, wall_time), their mean and sample std over seeds, every number of its
    runs' config.json and summary.json's hyper-parameters (a setting), its study's best value, chosen values, top
    three and their spread (best.json), an assessment's scores (assess.csv); each pair's difference of means and
    paired SE; Spearman's ρ of an assessment; and the counts of runs, seeds and trials (``Values.counts``)."""
    out = Values(name=folder.name)
    per: dict[tuple[str, str], dict[str, float]] = {}
    rows: list[dict] = []
    if (folder / "index.csv").is_file():
        with open(folder / "index.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    for r in rows:
        v = r["variant"]
        vals = out.variants.setdefault(v, [])
        out.runs.setdefault(v, []).append(folder / r["run"])
        n = out.counts.setdefault(v, {})
        n["runs"] = n.get("runs", 0) + 1
        n["completed"] = n.get("completed", 0) + (r["status"] == "completed")
        n["diverged"] = n.get("diverged", 0) + (r["status"] != "completed")
        for m in (*METRICS, "rounds_done", "wall_time"):
            if r.get(m) not in (None, "", "nan"):
                per.setdefault((v, m), {})[r["seed"]] = float(r[m])
        summary = folder / r["run"] / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            _leaves({k: x for k, x in s.items() if k.startswith(("final_", "initial_", "T_", "rise", "wall"))}, vals)
            _leaves({k: h.get("value") for k, h in s.get("hyperparameters", {}).items()}, vals)
        config = folder / r["run"] / "config.json"
        if config.is_file():
            _leaves(json.loads(config.read_text()), vals)
    group = json.loads((folder / "group.json").read_text()) if (folder / "group.json").is_file() else {}
    for run in group.get("runs", {}).values():  # a sweep cell's settings (index-only folders keep no config.json)
        if run.get("variant") in out.variants:
            _leaves(run.get("params", {}), out.variants[run["variant"]])
    if group.get("name") == folder.name and folder.name in presets.names():  # a preset's own folder: its settings
        preset = presets.load(folder.name)
        common = {k: x for k, x in preset.items() if k not in PRESET_NOT_SETTINGS}
        tables = preset.get("variants", {})
        for v in list(out.variants):
            _leaves([common, tables.get(v) or tables.get(_method(v)) or {}], out.variants[v])
    for v, n in out.counts.items():
        n["seeds"] = len({r["seed"] for r in rows if r["variant"] == v})
    if rows:  # a variant the claims read that has no run of its own (FedAvg+FT: FedAvg's runs fine-tuned)
        own = set(out.counts) | {_method(v) for v in out.counts}
        for rv in verdicts.group_values(folder):
            if rv.base not in own:
                v = "-".join([rv.base, *(f"{k.split('.')[-1]}={x}" for k, x in rv.params.items())])
                out.variants.setdefault(v, [])
                out.counts.setdefault(v, {})
                for m, x in rv.values.items():
                    per.setdefault((v, m), {})[str(rv.seed)] = float(x)
    for (v, _), by_seed in per.items():
        xs = list(by_seed.values())
        out.variants[v] += xs + [float(np.mean(xs))] + ([_sample_std(xs)] if len(xs) > 1 else [])
        out.means.setdefault(v, {})[_] = float(np.mean(xs))
        out.counts[v]["with a value"] = max(out.counts[v].get("with a value", 0), len(xs))
    for (v, m), (w, m2) in ((a, b) for a in per for b in per if a != b and a[1] == b[1]):
        a, b = per[(v, m)], per[(w, m2)]
        d = float(np.mean(list(a.values())) - np.mean(list(b.values())))
        both = out.pairs.setdefault(frozenset((v, w)), [])
        both += [d, -d]
        common = sorted(set(a) & set(b))
        if len(common) > 1:
            both.append(float(np.std([a[s] - b[s] for s in common], ddof=1) / math.sqrt(len(common))))
    for best in folder.rglob("best.json"):
        for e in json.loads(best.read_text()):
            vals = out.variants.setdefault(e["variant"], [])
            _leaves([e.get("best"), e.get("params"), e.get("top_spread"), e.get("rounds_run"), e.get("top")], vals)
            for widened in e.get("widened", {}).values():  # "low 0.316228 -> 0.0316228": a range's ends
                vals += [float(x) for x in re.findall(NUMBER, widened)]
            top = [t[1] for t in e.get("top", [])]
            vals += [abs(a - b) for a in top for b in top if a != b]  # how far apart the top trials are
            n = out.counts.setdefault(e["variant"], {})
            for k in ("budget", "complete", "pruned", "failed"):
                if isinstance(e.get(k), int):
                    n[f"trials {k}"] = n.get(f"trials {k}", 0) + e[k]
            n["trials failed or pruned"] = n.get("trials failed", 0) + n.get("trials pruned", 0)
    if {grid.ROW, grid.COL} <= set(group.get("sweep", [])):  # a grid of η_l × C: each cell's loss (``grid``)
        where = {(r["base"], r["params"].get(grid.ROW), r["params"].get(grid.COL)): r["variant"]
                 for r in group.get("runs", {}).values() if "params" in r and "base" in r}
        for base, cells in grid.cells(verdicts.group_values(folder)).items():
            loss = grid.lr_loss(cells, grid.chance(folder) or 0.0)
            for (r, c), x in loss.loss.items():
                if (base, r, c) in where and where[(base, r, c)] in out.variants:
                    vals = out.variants[where[(base, r, c)]]
                    vals += [x, loss.row_max[r], loss.row_mean[r], loss.fixed_loss, loss.mean]
    for cost in folder.glob("round_cost*.md"):  # reproduction/round_cost.py's table: a row per variant, in seconds
        for line in cost.read_text().splitlines():
            cells = _cells(line) if line.startswith("|") else []
            if cells and cells[0] in out.variants:
                out.variants[cells[0]] += [float(x) for c in cells[1:] for x in re.findall(rf"^{NUMBER}$", c)]
    for tune in folder.rglob("tune.json"):
        _leaves(json.loads(tune.read_text()).get("config", {}).get("tune", {}), out.folder)
    for csv_path in sorted(folder.glob("assess-*/assess.csv")):
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                for x in r.values():
                    try:
                        out.variants.setdefault(r["name"], []).append(float(x))
                    except (TypeError, ValueError):
                        pass
    if any(folder.glob("assess-*/assess.csv")):
        out.folder += _assessment_rhos(folder)
    return out


def _assessment_rhos(folder: Path) -> list[float]:
    """Spearman's ρ of each assessment score against FSL's gain (reproduction/assess_validation.py), at each
    point assessed, and the exact one-sided p of ρ = 0.5 .. 1 over the candidates (the rule's examples)."""
    av, pairs = assessment_pairs(folder)
    return [x for score, measured in pairs for x in (av.spearman(score, measured), av.exact_p(score, measured))]


def _method(variant: str) -> str:
    """A variant's name without its sweep cell: "FSL-p" of "FSL-p-classes_per_client=2-clients_per_round=4"."""
    return "-".join(p for p in variant.split("-") if "=" not in p) or variant
