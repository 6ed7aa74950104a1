"""Claims of the paper judged from runs, by one stated rule.

Each claim (``fedsl.config.schema.Claim``) compares per-seed values of a metric: the final
accuracy (higher is better) or T_0.5 / rise time (fewer rounds is better). The rule, at the 5%
level, one-sided in the claimed direction:

- **ordering** (A beats B), in each sweep cell: d = mean(A) − mean(B), signed so that d > 0 is what
  the paper claims.
  - **Paired t-test** when the two sides were run with the same seeds: at least 2 values a side, one
    value per seed on each side, and the same set of seeds on both (``paired_seeds``). Then
    d_s = A_s − B_s per seed s, t = mean(d_s) / (sd(d_s)/√n) on n − 1 degrees of freedom. Why this is
    valid: a seed fixes everything random in a run but the method (``fedsl.core.rng``: the partition of
    the data over the clients, D0 drawn from the clients, the clients sampled each round, their batch
    order; ``fedsl.models.build_model``: the initial weights of a given model), so A_s and B_s share the
    seed's luck, and the seeds' differences d_s are independent draws of one distribution. The test needs
    no assumption on how strongly A_s and B_s go together; where they do, the seed's luck cancels from d_s.
  - **Welch's t-test** (unequal variances, Welch–Satterthwaite degrees of freedom) with at least 2 values
    a side otherwise (different seeds, or a run left out on one side), and also when every seed's
    difference d_s is the same while the sides vary (T_a is found on the grid of evaluated rounds, so
    three seeds can differ by exactly 30 rounds each): the pairs then estimate no noise at all, and the
    sides' own spread is the estimate there is. Only when neither side varies does the sign decide.
  - With one seed on a side there is no spread to test against, so the test uses the seed-to-seed sample
    std σ of that setting measured elsewhere (the claim's ``seed_std``, over ``seed_std_seeds`` seeds):
    t = d / (σ·√(1/n_A + 1/n_B)) with seed_std_seeds − 1 degrees of freedom. Without such a σ, one seed
    is *not shown*.
- **trend** (A improves as a swept key grows): least-squares slope of the metric on the key's
  value over every run (seeds and cells together), t = slope / its standard error, n − 2 degrees
  of freedom; residuals measure the noise, so one seed per point can be judged.

Verdict: **holds** when the one-sided p-value in the claimed direction is below 0.05,
**contradicted** when the one in the opposite direction is, **not shown** otherwise (inside
the noise), **no runs** when a side has none. The verdict's words are this per-claim rule and
nothing else. A T_a that was never reached is censored: it counts as the run's planned rounds T (a lower bound: it
understates the gap when the slower side never got there), also for a run that diverged before T; the evidence
gives such a side's mean as a bound ("≥ 100 (0 of 3 reached)"), and when no seed of either side reached it the
claim is *not shown* (both sides sit at the bound: nothing was measured).
A diverged run counts with its last measured accuracy; one that diverged before any was measured has
no final accuracy and is left out (the verdict's seed counts show it).

**Multiplicity** (``holm``, ``with_holm``): a group's claims make m tests (each claim in each sweep
cell), each at 5%. Beside each p stands Holm's adjusted p over those m: p_(k) sorted ascending is
adjusted to max over j ≤ k of min(1, (m − j + 1)·p_(j)). The p of "holds" is adjusted among the m
p's in the claimed direction, the p of "contradicted" among the m p's against it, so that the chance
of any false "holds" in the group is at most 5% whatever the tests' dependence, and likewise for
"contradicted". A verdict whose Holm p is below 0.05 *stands after Holm*; one whose raw p is below
0.05 but whose Holm p is not keeps its word (the rule above) and the table says it does not stand.

The "±" of a verdict is the **standard error of the difference** d (SE); the "±" of a mean over
seeds elsewhere in the reports is the **sample std** (n − 1) of the seeds' values.
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
RULE = ("one-sided tests at the 5% level over seeds: a paired t-test for an ordering whose two sides ran the same "
        "seeds (≥ 2), Welch's t-test with ≥ 2 seeds a side otherwise, a t-test against the setting's measured seed "
        "std with one seed, the slope's t-test for a trend; 'holds' (p < 0.05 in the claimed direction), "
        "'contradicted' (p < 0.05 against it), else 'not shown'; ± is the standard error (SE) of the difference; "
        "Holm's adjusted p over the group's tests beside each p (a verdict stands after Holm when it is below 0.05)")
HIGHER_IS_BETTER = {"final_accuracy": True, "T_0.5": False, "rise_time": False,
                    # eval_per_client: the clients' accuracies at the last evaluation (fairness: a higher worst 10%,
                    # a narrower spread)
                    "final_client_acc_mean": True, "final_client_acc_worst10": True, "final_client_acc_std": False}
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
    stds: tuple[float, float] = (math.nan, math.nan)    # ordering: the sample std (n − 1) of A's and B's seeds
    diff: float = math.nan   # signed so that > 0 is what the claim says
    se: float = math.nan
    df: float = math.nan
    p: float = math.nan      # one-sided, in the claimed direction
    test: str = ""
    names: tuple[str, str] = ("", "")
    p_against: float = math.nan  # one-sided, against the claimed direction (what 'contradicted' reads)
    p_holm: float = math.nan     # Holm's adjusted p of the verdict's own p over its group's tests (``with_holm``)
    seeds_paired: tuple = ()     # the seeds a paired test paired on (empty: not paired)
    reached: tuple = ()          # T_a / rise time: (A's, B's) seeds that reached the level (empty: all did)

    @property
    def p_own(self) -> float:
        """The p that decides the verdict: against the claim for 'contradicted', else in the claimed direction."""
        return self.p_against if self.verdict == "contradicted" else self.p

    def stands_after_holm(self) -> bool:
        """Whether a 'holds' or 'contradicted' keeps its word at the family-wise 5% level (Holm)."""
        return self.verdict in ("holds", "contradicted") and self.p_holm < ALPHA

    def p_text(self, bracket: bool = True) -> str:
        """'p = 0.012 (Holm 0.048)' (``bracket`` False: 'p = 0.012, Holm 0.048'); for a contradicted claim the p
        against it: 'p = 0.004 against (Holm 0.040)'."""
        against = " against" if self.verdict == "contradicted" else ""
        holm = "" if math.isnan(self.p_holm) else (f" (Holm {_p(self.p_holm)})" if bracket
                                                   else f", Holm {_p(self.p_holm)}")
        return f"p {_eq(self.p_own)}{against}{holm}"

    def line(self) -> str:
        """One line of evidence, e.g. 'FSL-500 0.6120 vs FSL-250 0.5901 (3; 3 seeds): +0.0219 ± 0.0061 (SE), paired
        t, p = 0.012 (Holm 0.13)'."""
        if self.verdict == "no runs":
            return "no runs"
        where = ", ".join(f"{k.split('.')[-1]} = {v}" for k, v in self.cell.items())
        where = f" [{where}]" if where else ""
        if self.kind == "trend" and math.isnan(self.se):
            return f"{self.names[0]}: {self.n[0]} runs at {self.n[1]} values of {self.names[1]}: {self.test}{where}"
        if self.kind == "trend":
            return (f"{self.names[0]}: slope {self.means[0]:+.4g} per unit of {self.names[1]} ± {self.se:.2g} (SE) "
                    f"({self.n[0]} runs, {self.n[1]} values), {self.test}, {self.p_text()}{where}")
        fa, fb = (_num(m, self.metric) if not self.reached or k == n else f"≥ {_num(m, self.metric)} ({k} of {n} "
                  "reached)" for m, k, n in zip(self.means, self.reached or self.n, self.n))
        head = f"{self.names[0]} {fa} vs {self.names[1]} {fb} ({self.n[0]}; {self.n[1]} seeds): {self.diff:+.4g}"
        if math.isnan(self.se):
            return f"{head}, {self.test}{where}"
        return f"{head} ± {self.se:.2g} (SE), {self.test}, {self.p_text()}{where}"


@dataclass
class RunValue:
    base: str
    seed: int | None
    params: dict[str, Any]
    values: dict[str, float] = field(default_factory=dict)
    censored: frozenset = frozenset()  # the metrics whose value is the bound T: a level never reached


def _p(p: float) -> str:
    return "—" if math.isnan(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _eq(p: float) -> str:
    """'= 0.012' or '< 0.001', to follow 'p '."""
    text = _p(p)
    return text if text.startswith("<") else f"= {text}"


ROUND_METRICS = ("T_0.5", "rise_time")  # round counts (a level may never be reached); the others are accuracies


def _num(v: float, metric: str) -> str:
    return f"{v:.1f}" if metric in ROUND_METRICS else f"{v:.4f}"


def run_value(summary: dict, metric: str, planned: int | None = None) -> float | None:
    """A run's ``metric`` from its summary.json or index.csv row: None for a final accuracy it never had (not
    recorded, or NaN: diverged before the first evaluation).

    A T_a never reached is censored at the run's planned rounds T (``summary["rounds"]``, else ``planned``, else
    its last round): a lower bound, and the same one for a run that diverged early as for a run that ran all T
    rounds without reaching a. Its last round would rank a run that diverged at round 10 as the fastest."""
    v = summary.get(metric)
    if v in (None, ""):
        if metric not in ROUND_METRICS:
            return None
        for bound in (summary.get("rounds"), planned, summary.get("rounds_done")):
            if bound not in (None, ""):
                return float(bound)
        return None
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
    planned = spec.get("config", {}).get("rounds")  # T, for index rows (they do not record it)
    out = []
    for run, rs in spec.get("runs", {}).items():
        s_file = path / rs.get("dir", run) / "summary.json"
        summary = json.loads(s_file.read_text()) if s_file.is_file() else index.get(run, {})
        if summary.get("status") not in ("completed", "diverged"):
            continue
        vals = {m: v for m in HIGHER_IS_BETTER if (v := run_value(summary, m, planned)) is not None}
        censored = frozenset(m for m in vals if m in ROUND_METRICS and summary.get(m) in (None, ""))
        out.append(RunValue(base_of(rs, run), rs.get("seed"), dict(rs.get("params", {})), vals, censored))
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


def _cell_key(rv: RunValue, skip: set[str]) -> tuple:
    """The run's sweep cell, without the keys in ``skip`` (the trend's key; each side's own values)."""
    return tuple((k, v) for k, v in sorted(rv.params.items()) if k not in skip)


def _cells(runs: list[RunValue], skip: set[str]) -> dict[tuple, dict[str, Any]]:
    cells: dict[tuple, dict[str, Any]] = {}
    for rv in runs:
        key = _cell_key(rv, skip)
        cells.setdefault(key, dict(key))
    return cells


def _decide(p_for: float, p_against: float) -> str:
    if p_for < ALPHA:
        return "holds"
    if p_against < ALPHA:
        return "contradicted"
    return "not shown"


def paired_seeds(seeds_a: list[Any] | None, seeds_b: list[Any] | None) -> list[Any] | None:
    """The seeds to pair A's and B's values on, in A's order, or None when they cannot be paired: pairing needs at
    least 2 values a side, every value with a seed, each seed once a side, and the same seeds on both sides (a run
    left out on one side, e.g. diverged before any score, breaks the pairing: then Welch)."""
    if seeds_a is None or seeds_b is None or len(seeds_a) < 2 or None in seeds_a or None in seeds_b:
        return None
    if len(set(seeds_a)) != len(seeds_a) or len(set(seeds_b)) != len(seeds_b) or set(seeds_a) != set(seeds_b):
        return None
    return list(seeds_a)


def _welch(v: Verdict, xa: np.ndarray, xb: np.ndarray) -> None:
    """Welch's t: SE = √(s_A²/n_A + s_B²/n_B) (sample variances), Welch–Satterthwaite degrees of freedom."""
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    v.se, v.test = float(math.sqrt(va + vb)), "Welch t"
    v.df = float((va + vb) ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1))) if v.se > 0 else math.inf


def _paired(v: Verdict, d: np.ndarray) -> None:
    """The paired t on the per-seed differences d_s (signed as the claim): SE = sd(d_s)/√n, n − 1 degrees of
    freedom."""
    v.se, v.df = float(d.std(ddof=1) / math.sqrt(len(d))), float(len(d) - 1)
    v.test = f"paired t (seeds {', '.join(map(str, v.seeds_paired))})" if v.seeds_paired else "paired t"


def t_test(v: Verdict) -> None:
    """p in the claimed direction and against it from t = diff / se on v.df degrees of freedom, and the verdict;
    with no spread left (se = 0) the sign decides."""
    if v.se == 0:
        v.p, v.p_against = (0.0, 1.0) if v.diff > 0 else ((1.0, 0.0) if v.diff < 0 else (1.0, 1.0))
    else:
        t = v.diff / v.se
        v.p, v.p_against = float(stats.t.sf(t, v.df)), float(stats.t.cdf(t, v.df))
    v.verdict = _decide(v.p, v.p_against)


def ordering(claim: Any, a: list[float], b: list[float], cell: dict[str, Any],
             seeds: tuple[list[Any], list[Any]] | None = None, reached: tuple[int, int] | None = None) -> Verdict:
    """Judge 'A beats B' on per-seed values ``a`` and ``b`` (see the module docstring for the rule); ``seeds``, the
    seed of each value of ``a`` and of ``b``, lets the test pair them (``paired_seeds``); ``reached``, for a round
    count, how many of each side's values are measured rather than the bound T of a level never reached."""
    metric = claim.metric
    v = Verdict(claim.text, "ordering", metric, cell, "no runs", (len(a), len(b)), names=(claim.better, claim.worse))
    if not a or not b:
        return v
    sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    v.means = (float(xa.mean()), float(xb.mean()))
    v.stds = tuple(float(x.std(ddof=1)) if len(x) > 1 else math.nan for x in (xa, xb))
    v.diff = sign * (v.means[0] - v.means[1]) + 0.0  # + 0.0: no '-0' for a tie
    if reached is not None and tuple(reached) != v.n:
        v.reached = tuple(reached)
        if not any(reached):  # both sides at the bound T: nothing measured to compare
            v.verdict, v.test = "not shown", "no seed of either side reached it (both censored at T)"
            return v
    pair = paired_seeds(*seeds) if seeds is not None else None
    d = None
    if pair is not None:
        at_b = {s: x for s, x in zip(seeds[1], b)}
        d = sign * (xa - np.asarray([at_b[s] for s in pair], float))
    # every seed's difference equal (T_a lies on the grid of evaluated rounds, so this happens) while the sides
    # vary: the pairs give no estimate of the noise, and the sides' own spread (Welch) is the one there is
    if d is not None and (d.std() > 0 or (xa.std() == 0 and xb.std() == 0)):
        v.seeds_paired = tuple(sorted(pair))
        _paired(v, d)
    elif len(a) >= 2 and len(b) >= 2:
        _welch(v, xa, xb)
        if d is not None:
            v.test += " (every seed's difference equal: the pairs show no spread)"
    elif claim.seed_std is not None:
        v.se = float(claim.seed_std * math.sqrt(1 / len(a) + 1 / len(b)))
        v.df = float(claim.seed_std_seeds - 1)
        v.test = f"t against seed std {claim.seed_std:g}" + (f" ({claim.seed_std_source})" if claim.seed_std_source
                                                              else "")
    else:
        v.verdict, v.test = "not shown", "one seed, no measured seed spread"
        return v
    t_test(v)
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
    t_test(v)
    return v


def judge(claim: Any, runs: list[RunValue]) -> list[Verdict]:
    """``claim`` judged on ``runs``: one verdict per sweep cell (one in all for a group without a sweep)."""
    runs = [rv for rv in runs if _matches(rv, claim.at) and claim.metric in rv.values]
    mine = [rv for rv in runs if rv.base == claim.better]
    if claim.trend is not None:
        out = []
        for key, cell in _cells(mine, {claim.trend}).items():
            pts = [(float(rv.params[claim.trend]), rv.values[claim.metric]) for rv in mine
                   if claim.trend in rv.params and _cell_key(rv, {claim.trend}) == key]
            out.append(trend(claim, [x for x, _ in pts], [y for _, y in pts], cell))
        return out or [trend(claim, [], [], {})]
    theirs = [rv for rv in runs if rv.base == claim.worse]
    # each side's own values (DS pinned at γ = 0 against FSL at γ = 1): those keys do not tell cells apart
    mine = [rv for rv in mine if _matches(rv, claim.better_at)]
    theirs = [rv for rv in theirs if _matches(rv, claim.worse_at)]
    apart = set(claim.better_at) | set(claim.worse_at)
    out = []
    for key, cell in _cells(mine + theirs, apart).items():
        ra = [rv for rv in mine if _cell_key(rv, apart) == key]
        rb = [rv for rv in theirs if _cell_key(rv, apart) == key]
        out.append(ordering(claim, [rv.values[claim.metric] for rv in ra], [rv.values[claim.metric] for rv in rb],
                            cell, seeds=([rv.seed for rv in ra], [rv.seed for rv in rb]),
                            reached=tuple(sum(claim.metric not in rv.censored for rv in r) for r in (ra, rb))))
    return out or [ordering(claim, [], [], {})]


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: with the m finite p's sorted ascending,
    p_(k) -> max over j ≤ k of min(1, (m − j + 1)·p_(j)). NaN (no test) stays NaN and does not count in m."""
    idx = [i for i, x in enumerate(ps) if not math.isnan(x)]
    order = sorted(idx, key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * ps[i]))
        out[i] = running
    return out


def with_holm(judged: list[tuple[Any, list[Verdict]]]) -> list[tuple[Any, list[Verdict]]]:
    """Set each verdict's ``p_holm``: Holm over every test of ``judged`` (each claim in each cell), the p in the
    claimed direction among those in the claimed direction, and for a contradicted verdict its p against the claim
    among those against (the module docstring). Returns ``judged``."""
    tests = [v for _, vs in judged for v in vs if not math.isnan(v.p)]
    for_, against = holm([v.p for v in tests]), holm([v.p_against for v in tests])
    for v, hf, ha in zip(tests, for_, against):
        v.p_holm = ha if v.verdict == "contradicted" else hf
    return judged


def judge_all(claims: list[Any], runs: list[RunValue]) -> list[tuple[Any, list[Verdict]]]:
    """Each claim judged on ``runs`` (``judge``), with Holm's adjusted p over all of them (``with_holm``)."""
    return with_holm([(c, judge(c, runs)) for c in claims])


def multiplicity(judged: list[tuple[Any, list[Verdict]]]) -> str:
    """One sentence on the group's tests after Holm, e.g. 'Holm over the 22 tests: 3 of the 11 that hold and 1 of
    the 3 contradicted stand at the family-wise 5% level'; '' when nothing was tested."""
    tests = [v for _, vs in judged for v in vs if not math.isnan(v.p)]
    parts = []
    for word, said in (("that hold", "holds"), ("contradicted", "contradicted")):
        these = [v for v in tests if v.verdict == said]
        if these:
            parts.append(f"{sum(v.stands_after_holm() for v in these)} of the {len(these)} {word}")
    what = " and ".join(parts) + " stand" if parts else "nothing holds or is contradicted"
    noun = "test" if len(tests) == 1 else "tests"
    return f"Holm over the {len(tests)} {noun}: {what} at the family-wise 5% level" if tests else ""


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
    from fedsl.config import presets
    from fedsl.config import schema as config

    if spec.get("claims"):
        return [config.Claim.model_validate(c) for c in spec["claims"]]
    if spec.get("name") not in presets.names():
        return []
    return config.validate(presets.load(spec["name"])).claims


def judge_group(path: str | Path, claims: list[Any] | None = None) -> list[tuple[Any, list[Verdict]]]:
    """Each claim of the group at ``path`` (its group.json's ``claims``, or ``claims``) with its verdicts, Holm's
    adjusted p set over all of them."""
    path = Path(path)
    if claims is None:
        claims = claims_for(json.loads((path / "group.json").read_text()))
    return judge_all(claims, group_values(path))


def after_holm(verdicts: list[Verdict]) -> str:
    """How many of a claim's 'holds' / 'contradicted' cells stand after Holm, e.g. 'stands after Holm',
    'not after Holm' (one such cell), '2 of 6 stand after Holm'; '' when nothing holds or is contradicted."""
    said = [v for v in verdicts if v.verdict in ("holds", "contradicted")]
    if not said:
        return ""
    standing = sum(v.stands_after_holm() for v in said)
    if len(verdicts) == 1 or len(said) == 1:
        return "stands after Holm" if standing else "not after Holm"
    return f"{standing} of {len(said)} stand after Holm"


def markdown(judged: list[tuple[Any, list[Verdict]]]) -> str:
    """The claims as a Markdown table: claim, verdict (with how much of it stands after Holm), evidence (one line
    per cell), and the group's multiplicity statement under it."""
    if not judged:
        return ""
    rows = ["| claim of the paper | verdict | evidence |", "|---|---|---|"]
    for claim, verdicts in judged:
        shown = [v for v in verdicts if v.verdict != "no runs"] or verdicts[:1]  # cells this group did not run
        evidence = "<br>".join(f"{v.verdict}: {v.line()}" if len(shown) > 1 else v.line() for v in shown)
        holm_note = after_holm(verdicts)
        rows.append(f"| {claim.text} | **{overall(verdicts)}**{f' ({holm_note})' if holm_note else ''} | {evidence} |")
    holm_line = multiplicity(judged)
    return "\n".join(rows) + "\n\n" + (holm_line + ".\n\n" if holm_line else "") + "Rule: " + RULE + ".\n"
