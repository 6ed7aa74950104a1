"""Does `fedsl data assess` predict which D0 helps FSL? Spearman's ρ between the assessment and the measured gain.

    python reproduction/assess_validation.py reproduction/assess-validation          # CIFAR-10, C = 2
    python reproduction/assess_validation.py reproduction/assess-validation-emnist   # EMNIST, C = 2

reads FOLDER/index.csv (the runs: final accuracy per variant and seed; the baseline variant is FedAvg) and
FOLDER/assess-x0/assess.csv, FOLDER/assess-x20/assess.csv (the assessment at x_0 and after 20 FedAvg rounds), and
prints, per candidate D0, its measured gain (mean final accuracy over seeds − FedAvg's) beside the assessment,
then Spearman's ρ of each assessment score against the gain with its exact one-sided p-value (all n! orderings
of the candidates; with n = 5, ρ = 1 has p = 1/120 and ρ = 0.9 has p = 0.042). The rule: the assessment
"predicts" the gain when ρ > 0 with p < 0.05.
"""

from __future__ import annotations

import csv
import itertools
import sys
from pathlib import Path

import numpy as np

# the assessment's scores, each oriented so that larger = predicted to help more
SCORES = {
    "round_gain_rel": ("predicted decrease of F per round (the ranking)", 1.0),
    "predicted_gain_rel": ("predicted decrease per server step", 1.0),
    "measured_gain_rel": ("measured decrease of F by one full-batch server step", 1.0),
    "cos_F_f0": ("cos(∇F, ∇f0)", 1.0),
    "xi2": ("−ξ² (dissimilarity of D0 from the clients)", -1.0),
}


def ranks(values: list[float]) -> np.ndarray:
    """Ranks 1..n (ties: the mean of their ranks)."""
    v = np.asarray(values, dtype=float)
    order = v.argsort(kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(1, len(v) + 1)
    for value in np.unique(v):
        tied = v == value
        r[tied] = r[tied].mean()
    return r


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def exact_p(a: list[float], b: list[float]) -> float:
    """One-sided p-value of ρ(a, b) under independence: the share of the n! orderings of b with ρ ≥ the observed."""
    rho = spearman(a, b)
    perms = list(itertools.permutations(b))
    return sum(spearman(a, list(p)) >= rho - 1e-12 for p in perms) / len(perms)


def gains(folder: Path, baseline: str = "FedAvg") -> dict[str, tuple[float, list[float]]]:
    """variant -> (mean final accuracy − the baseline's mean, the variant's accuracies by seed)."""
    acc: dict[str, list[float]] = {}
    with open(folder / "index.csv") as f:
        for row in csv.DictReader(f):
            if row["status"] == "completed":
                acc.setdefault(row["variant"], []).append(float(row["final_accuracy"]))
    base = float(np.mean(acc[baseline]))
    return {v: (float(np.mean(a)) - base, a) for v, a in acc.items() if v != baseline}


def main(folder: Path) -> None:
    g = gains(folder)
    for point in ("x0", "x20"):
        path = folder / f"assess-{point}" / "assess.csv"
        if not path.exists():
            print(f"({path} missing)")
            continue
        with open(path) as f:
            rows = {r["name"]: r for r in csv.DictReader(f)}
        names = [n for n in rows if n in g]
        print(f"\n### assessed at {point}: {len(names)} candidates\n")
        print("| D0 | gain over FedAvg | seeds | rank | verdict | round gain | cos | ξ² |")
        print("|---|---|---|---|---|---|---|---|")
        for n in sorted(names, key=lambda n: -g[n][0]):
            r = rows[n]
            print(f"| {n} | {g[n][0]:+.3f} | {', '.join(f'{a:.3f}' for a in g[n][1])} | {r['rank']} | {r['verdict']} | "
                  f"{float(r['round_gain_rel']):.2f} | {float(r['cos_F_f0']):.2f} | {float(r['xi2']):.3g} |")
        print("\n| score | Spearman ρ with the gain | one-sided p (exact) |")
        print("|---|---|---|")
        measured = [g[n][0] for n in names]
        for key, (label, sign) in SCORES.items():
            score = [sign * float(rows[n][key]) for n in names]
            print(f"| {label} | {spearman(score, measured):+.2f} | {exact_p(score, measured):.3f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("reproduction/assess-validation"))
