"""Tables, curves and the CSV index of a run group: what `fedsl show`, `fedsl sweep status`,
``comparison.md`` / ``comparison.png`` and ``fedsl report`` print.

Reads the group layout that ``fedsl.experiments.compare.run_group`` writes (``group.json`` and
one run folder per run); writes nothing into the runs themselves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsl.engine import metrics
from fedsl.experiments.compare import group_runs, group_spec
from fedsl.report.plots import accuracy_curves

RUN_COLUMNS = ("run", "status", "final_accuracy", "rise_time", "T_0.5", "rounds_done", "wall_time")
VARIANT_COLUMNS = ("variant", "seeds", "final_accuracy", "rise_time", "T_0.5")


def _variant_of(path: Path) -> dict[str, str]:
    spec = group_spec(path)
    return {r: s["variant"] for r, s in spec["runs"].items()} if spec else {path.name: path.name}


def run_rows(path: str | Path) -> list[dict]:
    """One row per run: status and its summary metrics."""
    return [{"run": r, **{c: rd.read_summary().get(c) for c in RUN_COLUMNS[1:]}}
            for r, rd in group_runs(path).items()]


def variant_rows(path: str | Path) -> list[dict]:
    """One row per variant: metric means and stds over its seeds (as (mean, std) tuples)."""
    path = Path(path)
    variant = _variant_of(path)
    by_variant: dict[str, list[dict]] = {}
    for r, rd in group_runs(path).items():
        summary = rd.read_summary()  # {} for a run not started (or not kept): not a seed of the row
        by_variant.setdefault(variant[r], []).extend([summary] if summary.get("status") else [])
    rows = []
    for v, sums in by_variant.items():
        row: dict = {"variant": v, "seeds": len(sums)}
        for c in VARIANT_COLUMNS[2:]:
            row[c] = metrics.mean_std([s.get(c) for s in sums])
        rows.append(row)
    return rows


def fmt(v, column: str = "") -> str:
    if column == "wall_time" and isinstance(v, (int, float)):
        return f"{v:.1f}"
    if (column in ("rise_time", "rounds_done") or column.startswith("T_")) and v is not None:
        if isinstance(v, tuple):  # mean ± std of round numbers
            m, s = v
            return "—" if np.isnan(m) else (f"{m:.0f}" if s == 0 else f"{m:.1f} ± {s:.1f}")
        return str(int(v)) if float(v).is_integer() else f"{v:.1f}"
    if v is None:
        return "—"
    if isinstance(v, tuple):  # (mean, std)
        m, s = v
        if np.isnan(m):
            return "—"
        return fmt(m) if s == 0 else f"{fmt(m)} ± {fmt(s)}"
    if isinstance(v, float):
        if np.isnan(v):
            return "—"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(fmt(r.get(c), c) for c in columns) + " |\n" for r in rows)


def variant_curves(path: Path) -> dict[str, tuple]:
    """Variant -> (rounds, mean accuracy, mean rolling accuracy, sample std of rolling) over its seeds."""
    runs = group_runs(path)
    variant = _variant_of(path)
    grouped: dict[str, list[list[dict]]] = {}
    for r, rd in runs.items():
        grouped.setdefault(variant[r], []).append(rd.read_metrics())
    curves = {}
    for v, ms in grouped.items():
        ms = [m for m in ms if m]
        if not ms:
            continue
        n = min(len(m) for m in ms)  # rounds all seeds have reached
        rounds = [m["round"] for m in ms[0][:n]]
        acc = np.array([[r["accuracy"] for r in m[:n]] for m in ms])
        roll = np.array([[r["rolling_accuracy"] for r in m[:n]] for m in ms])
        spread = roll.std(0, ddof=1) if len(roll) > 1 else np.zeros(roll.shape[1])  # sample std over seeds
        curves[v] = (rounds, acc.mean(0).tolist(), roll.mean(0).tolist(), spread.tolist())
    return curves


def write_comparison(path: str | Path) -> tuple[Path, Path]:
    """comparison.md (tables) and comparison.png (accuracy curves) in the group folder."""
    path = Path(path)
    spec = group_spec(path)
    title = spec.get("name", path.name)
    window = spec.get("window", metrics.WINDOW)
    png = accuracy_curves(variant_curves(path), path / "comparison.png", title, window)
    vrows = variant_rows(path)
    multi = any(r["seeds"] > 1 for r in vrows)
    text = (f"# {title}\n\n{spec.get('description', '')}\n\n"
            f"Final accuracy = rolling mean over {window} rounds at the last round; rise time = first round "
            "reaching 90% of it; T_0.5 = first round whose rolling accuracy reaches 0.5"
            + (" (mean ± sample std over seeds)" if multi else "") + ".\n\n"
            + markdown_table(vrows, VARIANT_COLUMNS)
            + ("\n## Runs\n\n" + markdown_table(run_rows(path), RUN_COLUMNS) if multi else "")
            + "\n![accuracy curves](comparison.png)\n")
    md = path / "comparison.md"
    md.write_text(text)
    write_index(path)
    return md, png


def write_index(path: str | Path) -> Path:
    """index.csv: one row per run (run, variant, seed, swept parameters, status, metrics), for pandas."""
    import csv

    path = Path(path)
    spec = group_spec(path).get("runs", {})
    params = sorted({k for s in spec.values() for k in s.get("params", {})})
    cols = ["run", "variant", "seed", *params, "status", "final_accuracy", "rise_time", "T_0.5", "rounds_done",
            "wall_time"]
    with open(path / "index.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r, rd in group_runs(path).items():
            s, sp = rd.read_summary(), spec.get(r, {})
            row = {"run": r, "variant": sp.get("variant", r), "seed": sp.get("seed"), **sp.get("params", {}),
                   "status": s.get("status", "pending"), **{c: s.get(c) for c in cols[len(params) + 4:]}}
            w.writerow(["" if row.get(c) is None else row[c] for c in cols])
    return path / "index.csv"
