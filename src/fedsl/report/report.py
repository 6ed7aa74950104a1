"""``fedsl report DIR``: figures and a Markdown report of a run group (variants × sweep × seeds).

Writes into ``DIR/report/``: accuracy curves (mean ± std over seeds), bars of final
accuracy, rise time and T_0.5, plots of a swept parameter (one sweep key) or a heat map
(two sweep keys, as the paper's Fig. 5), the diagnostics ξ² and G² over rounds when they
were measured, and ``report.md`` with the tables — and, for presets of the paper, our
numbers next to the paper's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsl.engine import metrics
from fedsl.report import verdicts
from fedsl.report.plots import accuracy_curves, colours, plt
from fedsl.report.tables import VARIANT_COLUMNS, fmt, markdown_table, variant_curves, variant_rows
from fedsl.sweeps.compare import group_runs


def _spec(path: Path) -> dict:
    f = path / "group.json"
    return json.loads(f.read_text()) if f.is_file() else {"name": path.name, "runs": {}}


NOT_REACHED = "not reached"


def bars_figure(rows: list[dict]) -> Figure:
    """Final accuracy, rise time and T_0.5 per variant (``variant_rows``). A variant whose runs never
    reached the level has no bar but the words "not reached" (a zero-height bar would read as
    round 0); one whose seeds reached it only in part has a hatched bar (the mean of those that did, no error
    bar) marked "k of n" above it; error bars only for variants with several seeds (one seed has no spread)."""
    from matplotlib.transforms import blended_transform_factory

    names = [r["variant"] for r in rows]
    palette = colours(names)
    fig, axes = plt.subplots(1, 3, figsize=(min(4 + 0.9 * len(names), 16), 3.6), dpi=110)
    for ax, col, label in zip(axes, ("final_accuracy", "rise_time", "T_0.5"),
                              ("final accuracy", "rise time (rounds)", "T_0.5 (rounds)")):
        means = np.array([r[col][0] for r in rows], dtype=float)
        partial = np.array([bool(getattr(r[col], "partial", False)) for r in rows])
        stds = np.array([r[col][1] if r.get("seeds", 1) > 1 and not p else np.nan for r, p in zip(rows, partial)],
                        dtype=float)
        shown = np.isfinite(means)
        xs = np.flatnonzero(shown)
        ax.bar(xs, means[shown], color=[palette[names[i]] for i in xs],
               hatch=["//" if partial[i] else None for i in xs], edgecolor="white", linewidth=0)
        for i in np.flatnonzero(shown & partial):  # a mean over the seeds that got there: not the variant's
            ax.annotate(f"{rows[i][col].k} of {rows[i][col].n}", (i, means[i]), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7, color="0.25")
        if (shown & partial).any():
            ax.set_ylim(top=means[shown].max() * 1.12)  # room for the marks
        spread = shown & np.isfinite(stds)
        if spread.any():
            ax.errorbar(np.flatnonzero(spread), means[spread], yerr=stds[spread], fmt="none", ecolor="black",
                        capsize=3, lw=1)
        # x in data units, y in axes units: the words stand at the bar's place whatever the scale
        at = blended_transform_factory(ax.transData, ax.transAxes)
        for i in np.flatnonzero(~shown):
            seeds = getattr(rows[i][col], "n", 1)
            words = NOT_REACHED + (f" (0 of {seeds})" if seeds > 1 else "")
            ax.text(i, 0.03, words if col != "final_accuracy" else "no data", transform=at, rotation=90,
                    ha="center", va="bottom", fontsize=8, color="0.35")
        ax.set_xlim(-0.6, len(names) - 0.4)
        if col != "final_accuracy":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # rounds
        if not shown.any():
            ax.set_yticks([])
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _bars(rows: list[dict], path: Path) -> Path:
    fig = bars_figure(rows)
    fig.savefig(path)
    plt.close(fig)
    return path


def _sweep_points(path: Path, spec: dict) -> list[dict]:
    """One record per run: variant base name (without sweep suffix), swept values, summary."""
    out = []
    for r, rd in group_runs(path).items():
        s = spec["runs"].get(r, {})
        base = s.get("base")  # the variant's name without the sweep suffix (older groups: guessed)
        if base is None:
            base = s.get("variant", r).split("-")[0] if s.get("params") else s.get("variant", r)
        out.append({"base": base, "params": s.get("params", {}), "summary": rd.read_summary()})
    return out


def _on_axis(x: Any) -> bool:
    """Whether a swept value has a place on a numeric axis (a finite number; not inf or a name)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _sweep_plot(points: list[dict], keys: list[str], path: Path) -> Path:
    """Final accuracy and rise time against the first swept key (the paper's Fig. 3 layout): a
    line per variant and value of the other keys; a variant pinned at one value (DS at γ = 0)
    is a single point, one pinned off the axis (the non-private runs at privacy.target_epsilon = inf)
    a dashed horizontal line at its mean."""
    key, others = keys[0], keys[1:]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=110)
    bases = sorted({p["base"] for p in points})
    palette = colours(bases)
    markers = "osD^v<>p*h"
    for base in bases:
        mine = [p for p in points if p["base"] == base]
        series = sorted({tuple(p["params"].get(k) for k in others) for p in mine}, key=str)
        for m, rest in enumerate(series):
            pts = [p for p in mine if tuple(p["params"].get(k) for k in others) == rest]
            xs = sorted({p["params"][key] for p in pts})
            label = base + "".join(f", {k.split('.')[-1]}={v}" for k, v in zip(others, rest))
            if not any(_on_axis(x) for x in xs):  # pinned off the axis (privacy.target_epsilon = inf, the
                for ax, col in zip(axes, ("final_accuracy", "rise_time")):  # non-private runs): a reference line
                    mu, _ = metrics.mean_std([p["summary"].get(col) for p in pts])
                    if not math.isnan(mu):
                        ax.axhline(mu, linestyle="--", color=palette[base], label=f"{label} ({key} = {xs[0]})")
                continue
            xs = [x for x in xs if _on_axis(x)]
            for ax, col in zip(axes, ("final_accuracy", "rise_time")):
                values = [[p["summary"].get(col) for p in pts if p["params"][key] == x] for x in xs]
                stats = [metrics.mean_std(v) for v in values]
                several = any(sum(x is not None for x in v) > 1 for v in values)  # one seed: no spread to draw
                ax.errorbar(xs, [mu for mu, _ in stats], yerr=[sd for _, sd in stats] if several else None, capsize=3,
                            marker=markers[m % len(markers)], color=palette[base], label=label,
                            alpha=1.0 if len(series) == 1 else 0.5 + 0.5 * (m + 1) / len(series))
    for ax, label in zip(axes, ("final accuracy", "rise time (rounds)")):
        ax.set_xlabel(key)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


AXIS_LABELS = {"algorithm.local_lr": r"$\eta_l$ (local learning rate)",
               "data.classes_per_client": "C (classes per client)"}


def _heatmaps(points: list[dict], keys: list[str], path: Path, title: str = "", digits: int = 2) -> Path:
    """Final accuracy over two swept parameters, one panel per method in the group's order (the paper's Fig. 5
    layout), the value in each cell (mean over seeds). A cell with a diverged run is marked: '†' after a run
    that diverged with a last accuracy, 'div.' where no run has one."""
    k1, k2 = keys[:2]
    bases = list(dict.fromkeys(p["base"] for p in points))
    v1 = sorted({p["params"][k1] for p in points})
    v2 = sorted({p["params"][k2] for p in points})
    fig, axes = plt.subplots(1, len(bases), figsize=(3.4 * len(bases) + 0.8, 3.2), dpi=110, squeeze=False)
    for col, (ax, base) in enumerate(zip(axes[0], bases)):
        grid = np.full((len(v1), len(v2)), np.nan)
        marks = np.full((len(v1), len(v2)), "", dtype=object)
        for i, a in enumerate(v1):
            for j, b in enumerate(v2):
                here = [p["summary"] for p in points if p["base"] == base and p["params"][k1] == a
                        and p["params"][k2] == b]
                # a run that diverged before its first evaluation has NaN: no score, not a NaN mean
                accs = [s.get("final_accuracy") for s in here]
                grid[i, j] = metrics.mean_std([x for x in accs if x is not None and math.isfinite(x)])[0]
                if any(s.get("status") == "diverged" for s in here):
                    marks[i, j] = "†" if np.isfinite(grid[i, j]) else "div."
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for i in range(len(v1)):
            for j in range(len(v2)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.{digits}f}{marks[i, j]}", ha="center", va="center", fontsize=7,
                            color="white" if grid[i, j] < 0.6 else "black")
                elif marks[i, j]:
                    ax.text(j, i, marks[i, j], ha="center", va="center", fontsize=7, color="0.35")
        ax.set_xticks(range(len(v2)), [str(v) for v in v2], fontsize=8)
        # one y axis labelled for the row of panels (they share it): others' labels ran into the panel before
        ax.set_yticks(range(len(v1)), [str(v) for v in v1] if col == 0 else [], fontsize=8)
        ax.set_xlabel(AXIS_LABELS.get(k2, k2))
        if col == 0:
            ax.set_ylabel(AXIS_LABELS.get(k1, k1))
        ax.set_title(base, fontsize=10)
    fig.colorbar(im, ax=axes[0].tolist(), label="final accuracy")
    if title:
        fig.suptitle(title, fontsize=10, y=1.02)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def write_heatmaps(path: str | Path, png: str | Path, title: str = "", digits: int = 3) -> Path:
    """The heat maps of the group at ``path`` (its first two swept keys: rows × columns, a panel per method) saved
    to ``png``, as ``fedsl report`` draws them but with ``digits`` decimals and ``title``."""
    path = Path(path)
    spec = _spec(path)
    return _heatmaps(_sweep_points(path, spec), spec.get("sweep", []), Path(png), title, digits)


def _diagnostics(path: Path, out: Path) -> Path | None:
    series = {}
    for r, rd in group_runs(path).items():
        rows = [m for m in rd.read_metrics() if m.get("G2") is not None]
        if rows:
            series[r] = rows
    if not series:
        return None
    fig = diagnostics_figure(series)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


def diagnostics_figure(series: dict[str, list[dict]]) -> Figure:
    """ξ² and G² over rounds, a line per run (metrics.csv rows with the diagnostics), the legend beside the plots."""
    palette = colours(list(series))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    for r, rows in series.items():
        rounds = [m["round"] for m in rows]
        axes[0].plot(rounds, [m["xi2"] for m in rows], marker="o", color=palette[r], label=r)
        axes[1].plot(rounds, [m["G2"] for m in rows], marker="o", color=palette[r], label=r)
    for ax, label in zip(axes, ("ξ² = ‖∇f0 − ∇F‖²", "G² = (1/N)Σ‖∇f_i − ∇F‖²")):
        ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    # beside the plots, never over a curve: one entry a run, in columns when there are many
    fig.legend(*axes[1].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7,
               ncols=1 + len(series) // 16, frameon=False)
    fig.tight_layout()
    return fig


def _paper_rounds(spec: dict) -> int | None:
    """Rounds of the paper's runs behind the group's paper numbers: the config's ``paper_rounds``;
    for groups written before it existed, the rounds of the preset of the group's name."""
    cfg = spec.get("config") or {}
    if cfg.get("paper_rounds"):
        return int(cfg["paper_rounds"])
    if not (spec.get("paper") or spec.get("paper_claims")):
        return None
    from fedsl.config import presets
    try:
        rounds = presets.load(spec.get("name", "")).get("rounds")
    except Exception:  # not a preset's name: nothing to compare with
        return None
    return rounds if isinstance(rounds, int) else None


def _variant_rounds(path: Path, spec: dict) -> dict[str, int]:
    """Variant -> the rounds its runs completed (the fewest over its seeds)."""
    out: dict[str, int] = {}
    for r, rd in group_runs(path).items():
        v = spec["runs"].get(r, {}).get("variant", r)
        done = rd.read_summary().get("rounds_done")
        if done is None:  # not started (or not kept): the variant's length is that of the runs it has
            continue
        out[v] = min(out.get(v, done), done)
    return out


def length_note(rounds: int | None, paper_rounds: int | None, quick: bool) -> str:
    """How our run's length compares with the paper's, to stand beside the paper's numbers:
    'quick: 2 of 1,000 rounds', 'shorter: 300 of 1,000 rounds', 'did not run', or '' (as long)."""
    if paper_rounds is None:
        return ""
    if rounds is None:
        return "did not run"
    if rounds >= paper_rounds:
        return ""
    return f"{'quick' if quick else 'shorter'}: {rounds:,} of {paper_rounds:,} rounds"


def _fmt_ours(v, column: str) -> str:
    if column.startswith("T_") or column == "rise_time":
        m = v[0] if isinstance(v, tuple) else v
        if m is None or (isinstance(m, float) and np.isnan(m)):
            return NOT_REACHED
    return fmt(v, column)


def _tuning(best: Path) -> list[str]:
    """A group run by ``fedsl run --tuned``: each variant's study (its budget, the rounds it ran, the chosen values,
    any still at an edge of its range), from the study's best.json (``fedsl show GROUP/tune`` writes it)."""
    if not best.is_file():
        return []
    rows = json.loads(best.read_text())
    lines = ["## Tuning (validation data; `fedsl show tune`)\n",
             "| variant | trials | rounds run | best validation | chosen values | at an edge |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        finished = r.get("complete", 0) + r.get("pruned", 0) + r.get("failed", 0)
        trials = f"{finished}/{r['budget']}" if r.get("budget") is not None else str(finished)
        values = ", ".join(f"{k.split('.')[-1]} = {v:.4g}" if isinstance(v, float) else f"{k.split('.')[-1]} = {v}"
                           for k, v in (r.get("params") or {}).items())
        edges = "; ".join(f"{k.split('.')[-1]} ({w})" for k, w in (r.get("at_edge") or {}).items()) or "none"
        best_val = "—" if r.get("best") is None else f"{r['best']:.4f} ({r.get('folder')})"
        lines.append(f"| {r['variant']} | {trials} | {r.get('rounds_run', '—')} | {best_val} | {values} | {edges} |")
    return ["\n".join(lines) + "\n"]


def _server_sizes(path: Path) -> dict[str, int]:
    """Each variant's n0 as its runs record it (summary.json's server_data.size; 0 or none: left out)."""
    sizes: dict[str, int] = {}
    for run, rd in group_runs(path).items():
        s = rd.read_summary()
        n0 = (s.get("server_data") or {}).get("size")
        if n0:
            sizes.setdefault(s.get("name", run), int(n0))
    return sizes


CLIENT_METRICS = (("final_client_acc_mean", "mean"), ("final_client_acc_std", "std over clients"),
                  ("final_client_acc_worst10", "worst 10%"))


def _clients(path: Path) -> list[str]:
    """The clients' accuracies at the last evaluation (runs with ``eval_per_client``), per variant: mean ± sample std
    over seeds of each run's mean, spread and worst 10% over its N clients; nothing when no run measured them."""
    by: dict[str, list[dict]] = {}
    for run, rd in group_runs(path).items():
        s = rd.read_summary()
        if s.get("final_client_acc_mean") is not None:
            by.setdefault(s.get("name", run), []).append(s)
    if not by:
        return []
    lines = ["## The clients' accuracy\n",
             "The global model's test accuracy on each client's label mix at the last evaluation "
             "(`eval_per_client`): over the N clients, its mean, its spread and the mean of the worst 10%; mean ± "
             "sample std over seeds.\n",
             "| variant | seeds | " + " | ".join(w for _, w in CLIENT_METRICS) + " |",
             "|---|---|" + "---|" * len(CLIENT_METRICS)]
    for v, sums in by.items():
        cells = [fmt(metrics.mean_std([s[k] for s in sums])) for k, _ in CLIENT_METRICS]
        lines.append(f"| {v} | {len(sums)} | " + " | ".join(cells) + " |")
    return ["\n".join(lines) + "\n"]


def write_report(path: str | Path) -> Path:
    """Write ``path/report/`` (figures and report.md) for the group at ``path``; returns report.md."""
    path = Path(path)
    spec = _spec(path)
    out = path / "report"
    out.mkdir(exist_ok=True)
    window = spec.get("window", metrics.WINDOW)
    title = spec.get("name", path.name)
    rows = variant_rows(path)
    parts = [f"# {title}\n", spec.get("description", ""), ""]

    accuracy_curves(variant_curves(path), out / "curves.png", title, window)
    _bars(rows, out / "bars.png")
    resolution = max((rd.read_summary().get("time_resolution") or 1 for rd in group_runs(path).values()), default=1)
    timing = (f" Rise time and T_0.5 are found to within {resolution} rounds (evaluation every {resolution}; the "
              "final window every round)." if resolution > 1 else "")
    parts += [f"Rolling window {window} rounds; mean ± sample std (n − 1) over seeds where there are several."
              f"{timing}\n",
              markdown_table(rows, VARIANT_COLUMNS), "![accuracy](curves.png)\n", "![summary](bars.png)\n"]

    keys = spec.get("sweep", [])
    points = _sweep_points(path, spec)
    if len(keys) == 1 or (keys and spec.get("plot") == "lines"):  # a heat map needs two keys
        _sweep_plot(points, keys, out / "sweep.png")
        parts.append(f"## Sweep over {keys[0]}\n\n![sweep](sweep.png)\n")
    elif len(keys) >= 2:
        _heatmaps(points, keys, out / "heatmap.png")
        parts.append(f"## Final accuracy over {keys[0]} × {keys[1]}\n\n![heat map](heatmap.png)\n")
    if _diagnostics(path, out / "diagnostics.png"):
        parts.append("## Non-IIDness diagnostics\n\n![diagnostics](diagnostics.png)\n")
    parts += _clients(path)

    parts += _tuning(path / "tune" / "best.json")
    paper = spec.get("paper") or {}
    group_note = ""
    if paper or spec.get("paper_claims"):
        parts.append("## Ours next to the paper's\n")
        paper_rounds = _paper_rounds(spec)
        cfg = spec.get("config") or {}
        quick = bool(cfg.get("quick")) and cfg.get("quick", {}).get("rounds") == cfg.get("rounds")
        done = _variant_rounds(path, spec)
        shortest = min(done.values(), default=None)
        group_note = length_note(shortest, paper_rounds, quick)
        if group_note:  # said once above the table, and again on every row it concerns
            what = "a `--quick` run (few rounds, one seed, small subsets)" if quick else "a shorter run"
            parts.append(f"**Not comparable: this is {what}.** Our numbers are after {shortest:,} rounds, the "
                         f"paper's after {paper_rounds:,} ({group_note}).\n")
        if quick:  # the names and claims are the full preset's ("FSL-500", "n0 = 500"): say what ran here
            sizes = _server_sizes(path)
            if sizes:
                parts.append("**Names and claims are the full preset's;** the server data of this quick form: "
                             + ", ".join(f"{v}: n0 = {n:,}" for v, n in sizes.items()) + ".\n")
        test_size = (cfg.get("data") or {}).get("test_size")
        if test_size:
            parts.append(f"**Our accuracies are on {test_size:,} test samples** (`data.test_size`, a class-balanced "
                         "subset); the paper's are on the whole test set.\n")
        if paper:
            ours = {r["variant"]: r for r in rows}
            cols = sorted({c for v in paper.values() for c in v})
            head = "| variant | " + " | ".join(f"{c} (ours) | {c} (paper)" for c in cols) + " | our run |\n"
            head += "|---|" + "---|---|" * len(cols) + "---|\n"
            body = ""
            for v, numbers in paper.items():
                mine = ours.get(v, {}) if ours.get(v, {}).get("seeds") else {}  # a variant with no finished run
                note = length_note(done.get(v), paper_rounds, quick) if mine else "did not run"
                ran = note or (f"{done[v]:,} rounds" if v in done else "")
                body += f"| {v} | " + " | ".join(f"{_fmt_ours(mine.get(c), c) if mine else '—'} | "
                                                 f"{fmt(numbers.get(c), c)}" for c in cols) + f" | {ran} |\n"
            parts.append(head + body)
        for claim in spec.get("paper_claims", []):
            parts.append(f"- Paper: {claim}" + (f" (ours: {group_note})" if group_note else ""))
    claims = verdicts.claims_for(spec)
    if claims:
        parts.append("\n## The paper's claims, judged from these runs\n")
        if group_note:
            parts.append(f"These runs are shorter than the paper's ({group_note}): a verdict is about them.\n")
        parts.append(verdicts.markdown(verdicts.judge_group(path, claims)))
    md = out / "report.md"
    md.write_text("\n".join(parts) + "\n")
    return md
