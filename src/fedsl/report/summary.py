"""One table over many run groups: what was run, at what scale, our numbers and the claims' verdicts.

REPRODUCTION.md's summary table is this table over ``reproduction/`` (``reproduction/summary.py``
writes it, ``tests/test_reproduction.py`` re-computes it): every number in it comes from the
groups' files (``group.json`` and ``index.csv``, or each run's ``summary.json``), and every
verdict from the claims of the group's preset judged by ``fedsl.report.verdicts``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

from fedsl.engine import metrics
from fedsl.report import verdicts

PAPER_SCALE = (1000, 3)  # the paper's rounds × seeds for every experiment (Section 4.1)
_SHORT = {"local_lr": "η_l", "classes_per_client": "C", "gamma": "γ", "server_size": "n0",
          "server_samples_per_client": "s", "clients_per_round": "S"}


def short_variant(name: str) -> str:
    """'FSL-local_lr=0.02-classes_per_client=2' -> 'FSL η_l=0.02 C=2'."""
    return re.sub(r"-(\w+)=", lambda m: f" {_SHORT.get(m.group(1), m.group(1))}=", name)


def scale(runs: list[verdicts.RunValue], rounds_done: list[int]) -> tuple[int, int]:
    """(rounds, seeds): the fewest rounds any finished run completed and the most seeds of one variant/cell."""
    per: dict[tuple, set] = {}
    for rv in runs:
        per.setdefault((rv.base, tuple(sorted(rv.params.items()))), set()).add(rv.seed)
    return (min(rounds_done, default=0), max((len(s) for s in per.values()), default=0))


def _finished(path: Path) -> list[dict]:
    """The rows of the group's index.csv whose run finished (completed or diverged)."""
    with open(path / "index.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["status"] in ("completed", "diverged")]


def _rounds_done(path: Path) -> list[int]:
    """Rounds done by the completed runs (a diverged run stops early by definition: it says nothing of scale)."""
    return [int(float(r["rounds_done"])) for r in _finished(path)
            if r.get("rounds_done") and r["status"] == "completed"]


GRID = 8  # a group with more variants × cells than this is summed up per method: the range over its cells


def our_numbers(path: Path) -> str:
    """Each variant (sweep cell) of the group: final accuracy mean ± sample std over seeds, T_0.5 in brackets;
    for a grid of more than ``GRID`` cells, each method's range of mean final accuracy over its cells."""
    by: dict[str, list[dict]] = {}
    for r in _finished(path):
        by.setdefault(r["variant"], []).append(r)
    runs = json.loads((path / "group.json").read_text())["runs"]
    if len(by) > GRID and any(s.get("params") for s in runs.values()):  # a sweep's grid, not a list of methods
        base = {s["variant"]: verdicts.base_of(s, r) for r, s in runs.items()}
        ranges: dict[str, list[float]] = {}
        for v, rows in by.items():
            # a run that diverged before any score has none: it joins no cell's mean
            accs = [a for r in rows if (a := verdicts.run_value(r, "final_accuracy")) is not None]
            ranges.setdefault(base.get(v, v), [])
            if accs:
                ranges[base.get(v, v)].append(metrics.mean_std(accs)[0])
        return "; ".join(f"{b} {min(a):.3f}–{max(a):.3f} over {len(a)} cells" if a else f"{b}: no score in any cell"
                         for b, a in ranges.items())
    parts = []
    for v, all_rows in by.items():
        rows = [r for r in all_rows if r["status"] == "completed"]
        lost = len(all_rows) - len(rows)  # diverged: no final accuracy to average
        if not rows:
            parts.append(f"{short_variant(v)} diverged ({lost} of {lost})")
            continue
        acc = metrics.mean_std([float(r["final_accuracy"]) for r in rows if r["final_accuracy"]])
        t = [float(r["T_0.5"]) for r in rows if r.get("T_0.5")]
        a = f"{acc[0]:.3f}" + (f" ± {acc[1]:.3f}" if len(rows) > 1 else "") + (
            f", {lost} of {len(all_rows)} diverged" if lost else "")
        some = "" if len(t) == len(rows) else f" ({len(t)} of {len(rows)})"
        tt = "—" if not t else f"{sum(t) / len(t):.0f}{some}"
        parts.append(f"{short_variant(v)} {a} ({tt})")
    return "; ".join(parts)


def verdict_words(vs: list[verdicts.Verdict]) -> str:
    """A claim's verdict as the summary gives it: the word by the rule, then, for one cell, its p and Holm's
    adjusted p ('**holds** (p = 0.012, Holm 0.048)'), for several cells how many stand after Holm."""
    word = f"**{verdicts.overall(vs)}**"
    judged = [v for v in vs if v.verdict != "no runs" and not math.isnan(v.p)]
    if len(judged) == 1:
        v = judged[0]
        return f"{word} ({v.p_text(bracket=False)})"
    note = verdicts.after_holm(vs)
    return f"{word} ({note})" if note else word


def group_row(path: Path) -> dict[str, Any]:
    """Scale, our numbers, the verdicts of the group at ``path`` (Holm's adjusted p over its tests) and its
    multiplicity statement."""
    spec = json.loads((path / "group.json").read_text())
    runs = verdicts.group_values(path)
    rounds, seeds = scale(runs, _rounds_done(path))
    judged = verdicts.judge_all(verdicts.claims_for(spec), runs)
    shown = [(c, v) for c, v in judged if verdicts.overall(v) != "no runs"]
    return {"scale": (rounds, seeds), "ours": our_numbers(path),
            "verdicts": [(c, verdict_words(v)) for c, v in shown],
            "multiplicity": verdicts.multiplicity(shown)}


def _fmt_scale(rounds: int, seeds: int) -> str:
    r, s = PAPER_SCALE
    full = rounds >= r and seeds >= s
    return f"{rounds:,} × {seeds}" + (" (full)" if full else f" ({rounds * seeds / (r * s):.0%} of {r:,} × {s})")


def summary_markdown(root: str | Path, entries: list[dict]) -> str:
    """The Markdown table over ``entries`` (dicts with paper, preset, folders, paper_result and optionally page and
    budget; folders relative to ``root``): one row per entry, one line per folder in the computed columns; the first
    cell links the experiment's page (``reproduction/pages/PAGE.md``: what ran and what it found) and names its
    preset; the scale column names every folder, the others only when a row has several, and ends with the entry's
    budget (tuned at what cost, or untuned and whence its values), the scope every verdict of the row is read in."""
    root = Path(root)
    lines = ["| experiment (its page; preset) | scale (rounds × seeds) and budget | our result: final accuracy, "
             "mean ± sample std over seeds (mean T_0.5) | the paper | verdicts (computed; p one-sided, Holm's p over "
             "the folder) |",
             "|---|---|---|---|---|"]
    for e in entries:
        scales, ours, judged = [], [], []
        for folder in e["folders"]:
            row = group_row(root / folder)
            tag = f"`{folder}`: " if len(e["folders"]) > 1 else ""
            # the scale cell always names the folder it was read from, so each row cites its files
            scales.append(f"`{folder}`: " + _fmt_scale(*row["scale"]))
            ours.append(tag + row["ours"])
            judged += [f"{v}: {c.text}" + (f" (`{folder}`)" if len(e["folders"]) > 1 else "")
                       for c, v in row["verdicts"]]
            if row["multiplicity"]:
                judged.append(f"*{row['multiplicity']}*" + (f" (`{folder}`)" if len(e["folders"]) > 1 else ""))
        if e.get("budget"):  # the verdicts hold at this budget only: how the values were chosen, or that they were not
            scales.append(f"budget: {e['budget']}")
        name = f"[{e['paper']}](reproduction/pages/{e['page']}.md)" if e.get("page") else e["paper"]
        lines.append(f"| {name}<br>`{e['preset']}` | {'<br>'.join(scales)} | {'<br>'.join(ours)} "
                     f"| {e['paper_result']} | {'<br>'.join(judged) or 'no claim judged'} |")
    return "\n".join(lines) + "\n"


def seconds_per_round(path: Path) -> float | None:
    """Median over the group's finished runs of wall_time / rounds_done: one run's round on the machine
    it ran on, evaluation included (at that group's eval_every)."""
    per = [float(r["wall_time"]) / float(r["rounds_done"]) for r in _finished(path)
           if r["status"] == "completed" and r.get("wall_time") and r.get("rounds_done")]
    return float(sorted(per)[len(per) // 2]) if per else None


def full_scale_runs(preset: str) -> int:
    """Runs of the preset at the paper's scale: its variants × sweep points × 3 seeds."""
    from fedsl.config import expand, presets
    from fedsl.config import schema as config

    cfg = config.validate({**presets.load(preset), "seeds": list(range(PAPER_SCALE[1]))})
    return expand.count_runs(cfg)


def cost_markdown(root: str | Path, entries: list[dict]) -> str:
    """What full scale costs on the CPU these runs used: measured seconds per round × 1,000 rounds × the
    preset's runs (× ``cpu_factor`` where our runs were reduced), and the GPU's measured or projected
    cost as the entry states it. The CPU's seconds come from the entry's ``cost_folder`` (a CPU run kept for
    its timing when the row's folders ran on a GPU), else its first folder."""
    root = Path(root)
    lines = ["| experiment | runs at full scale | measured s/round per run, CPU (`folder`) | CPU core-hours at full "
             "scale | one H100/H200 |", "|---|---|---|---|---|"]
    for e in entries:
        if e.get("cost") is False:
            continue
        folder = e.get("cost_folder", e["folders"][0])
        spr = seconds_per_round(root / folder)
        runs = full_scale_runs(e["preset"])
        factor = float(e.get("cpu_factor", 1))
        hours = "—" if spr is None else f"{runs * PAPER_SCALE[0] * spr * factor / 3600:,.0f}"
        note = f" × {factor:g} ({e['cpu_factor_why']})" if factor != 1 else ""
        lines.append(f"| {e['paper']} | {runs} | {'—' if spr is None else f'{spr:.2f}'} (`{folder}`){note} | "
                     f"{hours} | {e.get('gpu', 'not measured')} |")
    return "\n".join(lines) + "\n"


def paper_markdown(path: str | Path) -> str:
    """A group's variants as columns, ours (mean ± sample std over finished seeds) beside the paper's numbers
    (group.json's ``paper``, else its preset's): final accuracy, T_0.5 and rise time."""
    from fedsl.config import presets

    path = Path(path)
    spec = json.loads((path / "group.json").read_text())
    paper = spec.get("paper") or (presets.load(spec["name"]).get("paper", {}) if spec.get("name") in presets.names()
                                  else {})
    variants = list(dict.fromkeys(s["variant"] for s in spec["runs"].values()))
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    for r in _finished(path):
        rows[r["variant"]].append(r)

    def ours(v: str, col: str, digits: int) -> str:
        vals = [float(r[col]) for r in rows[v] if r.get(col)]
        if not rows[v]:
            return "not yet run"
        if not vals:
            return "not reached"
        m, s = metrics.mean_std(vals)
        some = "" if len(vals) == len(rows[v]) else f", {len(vals)} of {len(rows[v])} seeds"
        return (f"{m:.{digits}f}" + (f" ± {s:.{digits}f}" if len(vals) > 1 else "") + some)

    def theirs(v: str, col: str, digits: int) -> str:
        x = paper.get(v, {}).get(col)
        return "—" if x is None else f"{x:.{digits}f}"

    lines = ["| | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants),
             "| seeds finished | " + " | ".join(str(len(rows[v])) for v in variants) + " |"]
    for col, label, digits in (("final_accuracy", "final accuracy", 3), ("T_0.5", "T_0.5", 0),
                               ("rise_time", "rise time", 0)):
        lines.append(f"| {label}, ours (mean ± sample std) | " + " | ".join(ours(v, col, digits) for v in variants)
                     + " |")
        if any(col in p for p in paper.values()):
            lines.append(f"| {label}, paper | " + " | ".join(theirs(v, col, digits) for v in variants) + " |")
    return "\n".join(lines) + "\n"


def _paper_numbers(spec: dict) -> dict[str, dict[str, float]]:
    """The paper's numbers per variant: group.json's ``paper``, else its preset's."""
    from fedsl.config import presets

    if spec.get("paper"):
        return spec["paper"]
    return presets.load(spec["name"]).get("paper", {}) if spec.get("name") in presets.names() else {}


def _se(se: float, digits: int) -> str:
    """An SE to ``digits`` decimals, or to one significant figure when that would read 0."""
    return f"{se:.{digits}f}" if se == 0 or se >= 10 ** -digits else f"{se:.1g}"


def _mean_sd(mean: float, sd: float, digits: int) -> str:
    return f"{mean:.{digits}f}" + ("" if math.isnan(sd) else f" ± {sd:.{digits}f}")


def claims_markdown(path: str | Path) -> str:
    """Every claim of the group at ``path`` judged in each cell, one row each: our two sides (mean ± sample std over
    seeds), the paper's two numbers, the difference d ± its standard error (signed so that d > 0 is the claim), the
    test, the one-sided p (for a contradicted claim: against it), Holm's adjusted p over the group's tests, and the
    verdict with whether it stands after Holm (``fedsl.report.verdicts``)."""
    path = Path(path)
    spec = json.loads((path / "group.json").read_text())
    judged = verdicts.judge_group(path)
    paper = _paper_numbers(spec)
    lines = ["| claim of the paper | ours: A vs B (mean ± sample std over seeds) | the paper: A vs B | d ± SE of d "
             "| test | one-sided p | Holm's p | verdict |", "|---|---|---|---|---|---|---|---|"]
    for claim, vs in judged:
        for v in vs:
            if v.verdict == "no runs":
                continue
            digits = 3 if v.metric == "final_accuracy" else 0
            unit = "" if v.metric == "final_accuracy" else " rounds"
            ours = " vs ".join(_mean_sd(m, sd, digits) for m, sd in zip(v.means, v.stds))
            theirs = [paper.get(name, {}).get(v.metric) for name in v.names]
            theirs_text = "—" if None in theirs else " vs ".join(f"{x:.{digits}f}" for x in theirs)
            d = f"{v.diff:+.{digits}f}" + ("" if math.isnan(v.se) else f" ± {_se(v.se, digits)}")
            against = " against" if v.verdict == "contradicted" else ""
            where = "".join(f" ({k.split('.')[-1]} = {x})" for k, x in v.cell.items())
            stands = (" (stands after Holm)" if v.stands_after_holm() else " (not after Holm)") \
                if v.verdict in ("holds", "contradicted") else ""
            lines.append(f"| {claim.text}{where} | {v.metric}: {ours}{unit} | {theirs_text} | {d} | {v.test} "
                         f"| {verdicts._p(v.p_own)}{against} | {verdicts._p(v.p_holm)} | **{v.verdict}**{stands} |")
    holm_line = verdicts.multiplicity(judged)
    return "\n".join(lines) + ("\n\n" + holm_line + "." if holm_line else "") + "\n"
