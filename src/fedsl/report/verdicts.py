"""Claims of the paper judged from runs, by one stated rule.

Each claim (``fedsl.experiments.config.Claim``) compares per-seed values of a metric: the final
accuracy (higher is better) or T_0.5 / rise time (fewer rounds is better). The rule, at the 5%
level, one-sided in the claimed direction:

- **ordering** (A beats B), in each sweep cell: d = mean(A) − mean(B), signed so that d > 0 is what
  the paper claims. With at least 2 seeds on each side: Welch's t-test (unequal variances,
  Welch–Satterthwaite degrees of freedom). With one seed on a side there is no spread to test
  against, so the test uses the seed-to-seed sample std σ of that setting measured elsewhere
  (the claim's ``seed_std``, over ``seed_std_seeds`` seeds): t = d / (σ·√(1/n_A + 1/n_B)) with
  seed_std_seeds − 1 degrees of freedom. Without such a σ, one seed is *not shown*.
- **trend** (A improves as a swept key grows): least-squares slope of the metric on the key's
  value over every run (seeds and cells together), t = slope / its standard error, n − 2 degrees
  of freedom; residuals measure the noise, so one seed per point can be judged.

Verdict: **holds** when the one-sided p-value in the claimed direction is below 0.05,
**contradicted** when the one in the opposite direction is, **not shown** otherwise (inside
the noise), **no runs** when a side has none. A T_a that was never reached counts as the
run's last round (a lower bound: it understates the gap when the slower side never got there).
A diverged run counts with its last measured accuracy; one that diverged before any was measured
has no final accuracy and is left out (the verdict's seed counts show it).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

ALPHA = 0.05
RULE = ("one-sided tests at the 5% level over seeds: Welch's t-test for an ordering with ≥ 2 seeds a side, a "
        "t-test against the setting's measured seed std with one seed, the slope's t-test for a trend; "
        "'holds' (p < 0.05 in the claimed direction), 'contradicted' (p < 0.05 against it), else 'not shown'")
HIGHER_IS_BETTER = {"final_accuracy": True, "T_0.5": False, "rise_time": False}
# A run fine-tuned on D0 after its last round (server.finetune_epochs) is also judged as the variant
# "NAME+FT", whose final accuracy is the fine-tuned model's (summary.json: final_accuracy_finetuned).
FINETUNED = "+FT"


@dataclass
class Verdict:
    """One claim judged in one sweep cell (``cell``: the swept values it holds fixed)."""
    text: str
    kind: str                # "ordering" or "trend"
    metric: str
    cell: dict[str, Any]
    verdict: str             # holds | not shown | contradicted | no runs
    n: tuple[int, int]       # seeds (ordering: A, B) or (runs, key values) for a trend
    means: tuple[float, float] = (math.nan, math.nan)   # ordering: A, B; trend: (slope, 0)
    diff: float = math.nan   # signed so that > 0 is what the claim says
    se: float = math.nan
    df: float = math.nan
    p: float = math.nan      # one-sided, in the claimed direction
    test: str = ""
    names: tuple[str, str] = ("", "")

    def line(self) -> str:
        """One line of evidence, e.g. 'FSL-500 0.6120 vs FSL-250 0.5901 (3; 3 seeds): +0.0219 ± 0.0061, Welch t,
        p = 0.012'."""
        if self.verdict == "no runs":
            return "no runs"
        where = ", ".join(f"{k.split('.')[-1]} = {v}" for k, v in self.cell.items())
        where = f" [{where}]" if where else ""
        if self.kind == "trend" and math.isnan(self.se):
            return f"{self.names[0]}: {self.n[0]} runs at {self.n[1]} values of {self.names[1]}: {self.test}{where}"
        if self.kind == "trend":
            return (f"{self.names[0]}: slope {self.means[0]:+.4g} per unit of {self.names[1]} ± {self.se:.2g} "
                    f"({self.n[0]} runs, {self.n[1]} values), {self.test}, p = {_p(self.p)}{where}")
        fa, fb = (_num(m, self.metric) for m in self.means)
        head = f"{self.names[0]} {fa} vs {self.names[1]} {fb} ({self.n[0]}; {self.n[1]} seeds): {self.diff:+.4g}"
        if math.isnan(self.se):
            return f"{head}, {self.test}{where}"
        return f"{head} ± {self.se:.2g}, {self.test}, p = {_p(self.p)}{where}"


@dataclass
class RunValue:
    base: str
    seed: int | None
    params: dict[str, Any]
    values: dict[str, float] = field(default_factory=dict)


def _p(p: float) -> str:
    return "—" if math.isnan(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _num(v: float, metric: str) -> str:
    return f"{v:.1f}" if metric != "final_accuracy" else f"{v:.4f}"


def run_value(summary: dict, metric: str) -> float | None:
    """A run's ``metric`` from its summary.json or index.csv row: None for a final accuracy it never had (not
    recorded, or NaN: diverged before the first evaluation); a T_a never reached is its last round."""
    v = summary.get(metric)
    if v in (None, ""):
        if metric == "final_accuracy":
            return None
        done = summary.get("rounds_done")  # never reached: its last round, a lower bound
        return float(done) if done not in (None, "") else None
    # a run that diverged before its accuracy was first measured has none (NaN): left out, not a NaN mean
    return float(v) if math.isfinite(float(v)) else None


def base_of(entry: dict, run: str = "") -> str:
    """A run's variant before its sweep values (group.json's "base"; older groups: the variant name less
    its '-key=value' suffixes)."""
    if entry.get("base"):
        return entry["base"]
    variant = entry.get("variant", run)
    for key in entry.get("params", {}):
        variant = variant.replace(f"-{key.split('.')[-1]}=", "\0", 1)
    return variant.split("\0")[0]


def group_values(path: str | Path) -> list[RunValue]:
    """Every finished run of the group at ``path`` (completed or diverged) with its metrics: from each run's
    summary.json, else from the group's index.csv (folders that keep only the index). A run fine-tuned on D0
    after its last round counts twice: as itself and as the variant ``NAME+FT`` (``FINETUNED``)."""
    path = Path(path)
    spec = json.loads((path / "group.json").read_text())
    index = {}
    if (path / "index.csv").is_file():
        with open(path / "index.csv", newline="") as f:
            index = {row["run"]: row for row in csv.DictReader(f)}
    out = []
    for run, rs in spec.get("runs", {}).items():
        s_file = path / rs.get("dir", run) / "summary.json"
        summary = json.loads(s_file.read_text()) if s_file.is_file() else index.get(run, {})
        if summary.get("status") not in ("completed", "diverged"):
            continue
        vals = {m: v for m in HIGHER_IS_BETTER if (v := run_value(summary, m)) is not None}
        out.append(RunValue(base_of(rs, run), rs.get("seed"), dict(rs.get("params", {})), vals))
        if summary.get("final_accuracy_finetuned") not in (None, ""):  # server.finetune_epochs: its own variant
            out.append(RunValue(base_of(rs, run) + FINETUNED, rs.get("seed"), dict(rs.get("params", {})),
                                {"final_accuracy": float(summary["final_accuracy_finetuned"])}))
    return out


def _matches(rv: RunValue, at: dict[str, Any]) -> bool:
    return all(k in rv.params and _same(rv.params[k], v) for k, v in at.items())


def _same(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def _cells(runs: list[RunValue], skip: str | None) -> dict[tuple, dict[str, Any]]:
    cells: dict[tuple, dict[str, Any]] = {}
    for rv in runs:
        cell = {k: v for k, v in sorted(rv.params.items()) if k != skip}
        cells.setdefault(tuple(cell.items()), cell)
    return cells


def _decide(p_for: float, p_against: float) -> str:
    if p_for < ALPHA:
        return "holds"
    if p_against < ALPHA:
        return "contradicted"
    return "not shown"


def ordering(claim: Any, a: list[float], b: list[float], cell: dict[str, Any]) -> Verdict:
    """Judge 'A beats B' on per-seed values ``a`` and ``b`` (see the module docstring for the rule)."""
    metric = claim.metric
    v = Verdict(claim.text, "ordering", metric, cell, "no runs", (len(a), len(b)), names=(claim.better, claim.worse))
    if not a or not b:
        return v
    sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    v.means = (float(xa.mean()), float(xb.mean()))
    v.diff = sign * (v.means[0] - v.means[1])
    if len(a) >= 2 and len(b) >= 2:
        va, vb = xa.var(ddof=1) / len(a), xb.var(ddof=1) / len(b)
        v.se = float(math.sqrt(va + vb))
        v.test = "Welch t"
        if v.se == 0:  # every seed equal on both sides: the sign decides
            v.df, v.p = math.inf, (0.0 if v.diff > 0 else 1.0)
            v.verdict = "holds" if v.diff > 0 else ("contradicted" if v.diff < 0 else "not shown")
            return v
        v.df = float((va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)))
    elif claim.seed_std is not None:
        v.se = float(claim.seed_std * math.sqrt(1 / len(a) + 1 / len(b)))
        v.df = float(claim.seed_std_seeds - 1)
        v.test = f"t against seed std {claim.seed_std:g}" + (f" ({claim.seed_std_source})" if claim.seed_std_source
                                                              else "")
    else:
        v.verdict, v.test = "not shown", "one seed, no measured seed spread"
        return v
    t = v.diff / v.se
    v.p = float(stats.t.sf(t, v.df))
    v.verdict = _decide(v.p, float(stats.t.cdf(t, v.df)))
    return v


def trend(claim: Any, xs: list[float], ys: list[float], cell: dict[str, Any]) -> Verdict:
    """Judge 'A improves as the key grows' (``direction``) from (key value, metric) pairs."""
    metric = claim.metric
    v = Verdict(claim.text, "trend", metric, cell, "no runs", (len(xs), len(set(xs))),
                names=(claim.better, claim.trend.split(".")[-1]))
    if len(set(xs)) < 2 or len(xs) < 3:
        v.verdict = "no runs" if not xs else "not shown"
        v.test = "too few for a trend (3 runs at 2 values at least)"
        return v
    fit = stats.linregress(np.asarray(xs, float), np.asarray(ys, float))
    sign = (1.0 if HIGHER_IS_BETTER[metric] else -1.0) * (1.0 if claim.direction == "up" else -1.0)
    v.means = (float(fit.slope), 0.0)
    v.diff, v.se, v.df, v.test = sign * float(fit.slope), float(fit.stderr), float(len(xs) - 2), "slope t"
    if v.se == 0:
        v.p = 0.0 if v.diff > 0 else 1.0
        v.verdict = "holds" if v.diff > 0 else ("contradicted" if v.diff < 0 else "not shown")
        return v
    t = v.diff / v.se
    v.p = float(stats.t.sf(t, v.df))
    v.verdict = _decide(v.p, float(stats.t.cdf(t, v.df)))
    return v


def judge(claim: Any, runs: list[RunValue]) -> list[Verdict]:
    """``claim`` judged on ``runs``: one verdict per sweep cell (one in all for a group without a sweep)."""
    runs = [rv for rv in runs if _matches(rv, claim.at) and claim.metric in rv.values]
    mine = [rv for rv in runs if rv.base == claim.better]
    if claim.trend is not None:
        out = []
        for key, cell in _cells(mine, claim.trend).items():
            pts = [(float(rv.params[claim.trend]), rv.values[claim.metric]) for rv in mine
                   if claim.trend in rv.params and tuple((k, v) for k, v in sorted(rv.params.items())
                                                         if k != claim.trend) == key]
            out.append(trend(claim, [x for x, _ in pts], [y for _, y in pts], cell))
        return out or [trend(claim, [], [], {})]
    theirs = [rv for rv in runs if rv.base == claim.worse]
    cells = _cells(mine + theirs, None)
    out = []
    for key, cell in cells.items():
        a = [rv.values[claim.metric] for rv in mine if tuple(sorted(rv.params.items())) == key]
        b = [rv.values[claim.metric] for rv in theirs if tuple(sorted(rv.params.items())) == key]
        out.append(ordering(claim, a, b, cell))
    return out or [ordering(claim, [], [], {})]


def overall(verdicts: list[Verdict]) -> str:
    """One word for a claim over its cells: its verdict when all cells agree, else 'holds in k of n cells
    (m contradicted)'; cells with no runs are left out."""
    judged = [v.verdict for v in verdicts if v.verdict != "no runs"]
    if not judged:
        return "no runs"
    if len(set(judged)) == 1:
        return judged[0]
    n_hold, n_con = judged.count("holds"), judged.count("contradicted")
    return f"holds in {n_hold} of {len(judged)} cells" + (f" ({n_con} contradicted)" if n_con else "")


def claims_for(spec: dict) -> list:
    """The claims to judge on a group (its group.json ``spec``): those it was run with, else, for a group
    run before claims were stated, those of the preset of its name (none for other configs)."""
    from fedsl.experiments import config, presets

    if spec.get("claims"):
        return [config.Claim.model_validate(c) for c in spec["claims"]]
    if spec.get("name") not in presets.names():
        return []
    return config.validate(presets.load(spec["name"])).claims


def judge_group(path: str | Path, claims: list[Any] | None = None) -> list[tuple[Any, list[Verdict]]]:
    """Each claim of the group at ``path`` (its group.json's ``claims``, or ``claims``) with its verdicts."""
    path = Path(path)
    if claims is None:
        claims = claims_for(json.loads((path / "group.json").read_text()))
    runs = group_values(path)
    return [(c, judge(c, runs)) for c in claims]


def markdown(judged: list[tuple[Any, list[Verdict]]]) -> str:
    """The claims as a Markdown table: claim, verdict, evidence (one line per cell)."""
    if not judged:
        return ""
    rows = ["| claim of the paper | verdict | evidence |", "|---|---|---|"]
    for claim, verdicts in judged:
        shown = [v for v in verdicts if v.verdict != "no runs"] or verdicts[:1]  # cells this group did not run
        evidence = "<br>".join(f"{v.verdict}: {v.line()}" if len(shown) > 1 else v.line() for v in shown)
        rows.append(f"| {claim.text} | **{overall(verdicts)}** | {evidence} |")
    return "\n".join(rows) + "\n\nRule: " + RULE + ".\n"
