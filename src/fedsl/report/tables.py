"""Tables, curves and the CSV index of a run group: what `fedsl show`, `fedsl sweep status`,
``comparison.md`` / ``comparison.png`` and ``fedsl report`` print.

Reads the group layout that ``fedsl.sweeps.compare.run_group`` writes (``group.json`` and
one run folder per run); writes nothing into the runs themselves.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedsl.engine import metrics
from fedsl.report.plots import accuracy_curves
from fedsl.sweeps.compare import group_runs, group_spec

RUN_COLUMNS = ("run", "status", "final_accuracy", "rise_time", "T_0.5", "rounds_done", "wall_time")
VARIANT_COLUMNS = ("variant", "seeds", "final_accuracy", "rise_time", "T_0.5")
ROUND_COUNTS = ("rise_time", "T_0.5")  # a round at which a run reached a level: it may never have


class Reached(tuple):
    """A round count over a variant's seeds: (mean, sample std) over the seeds that reached its level, with ``k``
    of the ``n`` seeds that did. A mean over some seeds is never a variant's mean: ``fmt`` says "k of n seeds",
    bars.png marks the bar, and one that no seed reached is "not reached"."""

    k: int
    n: int

    def __new__(cls, values: list) -> "Reached":
        got = [float(v) for v in values if v not in (None, "") and math.isfinite(float(v))]
        self = super().__new__(cls, metrics.mean_std(got))
        self.k, self.n = len(got), len(values)
        return self

    @property
    def partial(self) -> bool:
        return self.k < self.n


def _variant_of(path: Path) -> dict[str, str]:
    spec = group_spec(path)
    return {r: s["variant"] for r, s in spec["runs"].items()} if spec else {path.name: path.name}


def run_rows(path: str | Path) -> list[dict]:
    """One row per run: status and its summary metrics; a run killed or in progress, which has no summary.json of
    where it is, as its other files say (``run_status.shown_summary``: 'interrupted' or 'running')."""
    from fedsl.runs.status import shown_summary
    return [{"run": r, **{c: s.get(c) for c in RUN_COLUMNS[1:]}}
            for r, s in ((r, shown_summary(rd)) for r, rd in group_runs(path).items())]


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
            values = [s.get(c) for s in sums]
            row[c] = Reached(values) if c in ROUND_COUNTS else metrics.mean_std(values)
        rows.append(row)
    return rows


def fmt(v, column: str = "") -> str:
    if column == "wall_time" and isinstance(v, (int, float)):
        return f"{v:.1f}"
    if isinstance(v, Reached) and v.partial:  # some seeds never reached the level: say how many did
        seeds = f"{v.k} of {v.n} seeds"
        if v.k == 0:
            return "not reached" + (f" ({seeds})" if v.n > 1 else "")
        return f"{fmt(tuple(v), column)} ({seeds})"
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


def legend(window: int, rounds: list[int | None], multi: bool = False) -> str:
    """What the tables' columns mean (the paper's metrics, ``fedsl.engine.metrics``), for the terminal and
    comparison.md; ``rounds``: the runs' rounds done. The window of a run of at most ``window`` rounds holds all its
    rounds, so its final accuracy is the mean over the whole run, which the legend then says."""
    text = (f"Final accuracy = rolling mean over {window} rounds at the last round; rise time = first round "
            "reaching 90% of it; T_0.5 = first round whose rolling accuracy reaches 0.5"
            + (" (mean ± sample std over seeds)" if multi else "") + ".")
    if any(r is not None and r <= window for r in rounds):
        text += (f" In a run of at most {window} rounds the window holds every round: its final accuracy is the "
                 "mean over the whole run, below its last round's accuracy while it still learns (that is in its "
                 "metrics.csv).")
    return text


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
            + legend(window, [r["rounds_done"] for r in run_rows(path)], multi) + "\n\n"
            + markdown_table(vrows, VARIANT_COLUMNS)
            + ("\n## Runs\n\n" + markdown_table(run_rows(path), RUN_COLUMNS) if multi else "")
            + "\n![accuracy curves](comparison.png)\n")
    md = path / "comparison.md"
    md.write_text(text)
    write_index(path)
    return md, png


INDEX_METRICS = ("status", "final_accuracy", "rise_time", "T_0.5", "rounds_done", "wall_time")


def index_csv(path: str | Path) -> str:
    """index.csv's text for the group at ``path``: one row per run of group.json (run, variant, seed, swept
    parameters, then ``INDEX_METRICS`` from the run's summary.json; 'pending' for a run without one), as
    ``csv.writer`` writes it (CRLF line ends)."""
    import csv
    import io

    path = Path(path)
    spec = group_spec(path).get("runs", {})
    params = sorted({k for s in spec.values() for k in s.get("params", {})})
    cols = ["run", "variant", "seed", *params, *INDEX_METRICS]
    out = io.StringIO(newline="")
    w = csv.writer(out)
    w.writerow(cols)
    for r, rd in group_runs(path).items():
        s, sp = rd.read_summary(), spec.get(r, {})
        row = {"run": r, "variant": sp.get("variant", r), "seed": sp.get("seed"), **sp.get("params", {}),
               **{c: s.get(c) for c in INDEX_METRICS}, "status": s.get("status", "pending")}
        w.writerow(["" if row.get(c) is None else row[c] for c in cols])
    return out.getvalue()


def write_index(path: str | Path) -> Path:
    """index.csv: one row per run (run, variant, seed, swept parameters, status, metrics), for pandas
    (``index_csv``)."""
    path = Path(path)
    with open(path / "index.csv", "w", newline="") as f:
        f.write(index_csv(path))
    return path / "index.csv"


def index_differences(path: str | Path) -> list[str]:
    """The lines of the group's committed index.csv that ``index_csv`` does not rebuild from its runs' summary.json
    ('line 4: committed ..., rebuilt ...'); [] when every line agrees."""
    path = Path(path)
    committed = (path / "index.csv").read_bytes().decode().splitlines()
    rebuilt = index_csv(path).splitlines()
    out = [f"line {i + 1}: committed {a!r}, rebuilt {b!r}"
           for i, (a, b) in enumerate(zip(committed, rebuilt)) if a != b]
    if len(committed) != len(rebuilt):
        out.append(f"{len(committed)} lines committed, {len(rebuilt)} rebuilt")
    return out


def summary_differences(path: str | Path) -> list[str]:
    """Each run's paper metrics (final accuracy, rise time, T_0.5, the time resolution) re-computed from its
    metrics.csv (``metrics.summarize`` over rounds 1..T with the config's rolling window, as the run computed them)
    against its summary.json: one line per difference; runs without both files are skipped."""
    import csv
    import json

    path = Path(path)
    spec = json.loads((path / "group.json").read_text())
    cfg = spec.get("config", {})
    out = []
    for name, run in spec.get("runs", {}).items():
        folder = path / run.get("dir", name)
        if not ((folder / "summary.json").is_file() and (folder / "metrics.csv").is_file()):
            continue
        summary = json.loads((folder / "summary.json").read_text())
        with open(folder / "metrics.csv", newline="") as f:
            rows = [(int(float(r["round"])), float(r["accuracy"])) for r in csv.DictReader(f)]
        rows = [(t, a) for t, a in rows if t > 0]  # round 0 is x_0: not in the paper's metrics
        override = (cfg.get("variants") or {}).get(run.get("base", ""), {}) or {}
        window = override.get("rolling_window") or cfg.get("rolling_window") or metrics.WINDOW
        again = metrics.summarize([t for t, _ in rows], [a for _, a in rows], window)
        out += [f"{name}: {k} = {summary.get(k)!r} in summary.json, {v!r} from metrics.csv"
                for k, v in again.items() if not _same_number(summary.get(k), v)]
    return out


def _same_number(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return a == b
