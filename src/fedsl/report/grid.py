"""A sweep over two keys read as the paper's Fig. 5: heat maps of final accuracy, η_l (rows) × C (columns), one
per method, and what the paper says of them, computed from the runs.

- **Cells** (``cells``): each method's per-seed final accuracies in every (η_l, C) cell. A run that diverged
  counts with its last measured accuracy; one that diverged before any evaluation has no score (its cell is
  kept, empty), as in ``fedsl.report.verdicts``.
- **Each method at its best η_l** (``best_rows``, ``judge_at_best``): in each column C, the η_l of the method's
  highest mean final accuracy (the paper picks Table 1's η_l so), and a claim "A beats B" judged between A's
  best cell and B's by ``verdicts.ordering`` (with one seed: the one-seed rule, against the claim's seed_std).
- **The loss of a fixed η_l** (``lr_loss``), for "learning rates are easy to pick": in column C,
  loss(η_l, C) = best(C) − acc(η_l, C) ≥ 0, the accuracy given up by running η_l instead of the column's best.
  Per η_l its maximum and mean over C; the **fixed η_l**, the one whose maximum is smallest (one η_l for every
  C, chosen knowing the whole grid), with that maximum; and **G**, the mean loss over the grid (mean over C of
  the mean over η_l): what an η_l picked blindly from the grid costs on average. A flat heat map has G near 0.
  A cell with no score counts as ``floor`` (chance): a diverged η_l is the costliest pick, not a missing one.
- **G compared** (``compare_lr_loss``): "η_l is easier to pick for A than for B" holds when G_B − G_A is beyond
  the seed noise. With each column's best cell held fixed, G is a weighted sum of cell means, Σ w·acc, with
  w = (1 − 1/R_C)/|C| at the column's best cell and −1/(R_C·|C|) at its other R_C − 1 cells; so
  SE(G_B − G_A) = σ·√(Σ_A w²/n + Σ_B w²/n) (n: the cell's seeds; a cell with no score adds nothing), and the
  difference is tested one-sided at 5% on t = d / SE, as ``verdicts.ordering`` does: σ the claim's seed_std
  on seed_std_seeds − 1 degrees of freedom, or, when every cell has at least 2 seeds, the pooled within-cell
  sample std on Σ(n − 1) degrees of freedom. Holding the best cell fixed ignores that the maximum picks the
  luckiest seed of a column; that raises every method's G by about the same amount when their seed noise is
  alike.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsl.report import verdicts

ROW, COL = "algorithm.local_lr", "data.classes_per_client"  # Fig. 5: η_l down, C across
Cells = dict[tuple[Any, Any], list[float]]  # (row value, column value) -> per-seed values


def cells(runs: list[verdicts.RunValue], row: str = ROW, col: str = COL,
          metric: str = "final_accuracy") -> dict[str, Cells]:
    """Method (variant base) -> (row, column) -> the per-seed values of ``metric`` there, in run order; a cell
    whose runs have no value (diverged before any score) is kept with an empty list."""
    out: dict[str, Cells] = {}
    for rv in runs:
        if row in rv.params and col in rv.params:
            cell = out.setdefault(rv.base, {}).setdefault((rv.params[row], rv.params[col]), [])
            if metric in rv.values:
                cell.append(rv.values[metric])
    return out


def _mean(values: list[float], floor: float) -> float:
    return float(np.mean(values)) if values else floor


def _columns(grid: Cells) -> dict[Any, list[Any]]:
    """Column value -> its row values, both sorted."""
    out: dict[Any, list[Any]] = {}
    for r, c in sorted(grid):
        out.setdefault(c, []).append(r)
    return dict(sorted(out.items()))


def best_rows(grid: Cells, floor: float = math.nan) -> dict[Any, tuple[Any, float]]:
    """Column -> (the row of the highest mean, that mean); ties go to the smaller row value. Cells with no
    score count as ``floor``."""
    out = {}
    for c, rows in _columns(grid).items():
        means = [_mean(grid[(r, c)], floor) for r in rows]
        i = int(np.nanargmax(means)) if not all(math.isnan(m) for m in means) else 0
        out[c] = (rows[i], means[i])
    return out


@dataclass
class LrLoss:
    """``lr_loss``'s answer for one method (accuracies; losses ≥ 0)."""
    loss: dict[tuple[Any, Any], float]     # (row, column) -> best(column) − acc(row, column)
    row_max: dict[Any, float]              # row -> its largest loss over the columns
    row_mean: dict[Any, float]             # row -> its mean loss over the columns
    fixed: Any                             # the row whose largest loss is smallest (ties: the smaller row)
    fixed_loss: float                      # that largest loss
    mean: float                            # G: the mean over columns of the mean loss over rows
    weights: dict[tuple[Any, Any], float]  # G = Σ w·acc with each column's best cell fixed (for its SE)


def lr_loss(grid: Cells, floor: float) -> LrLoss:
    """The loss of a fixed η_l over one method's grid (the module docstring); cells with no score count as
    ``floor``. Rows missing from a column are not in that column's mean."""
    cols = _columns(grid)
    best = best_rows(grid, floor)
    loss = {(r, c): best[c][1] - _mean(grid[(r, c)], floor) for c, rows in cols.items() for r in rows}
    rows = sorted({r for r, _ in grid})
    row_max = {r: max(v for (rr, _), v in loss.items() if rr == r) for r in rows}
    row_mean = {r: float(np.mean([v for (rr, _), v in loss.items() if rr == r])) for r in rows}
    fixed = min(rows, key=lambda r: (row_max[r], r))
    weights = {}
    for c, rs in cols.items():
        for r in rs:
            weights[(r, c)] = ((1 - 1 / len(rs)) if r == best[c][0] else -1 / len(rs)) / len(cols)
    mean = float(np.mean([np.mean([loss[(r, c)] for r in rs]) for c, rs in cols.items()]))
    return LrLoss(loss, row_max, row_mean, fixed, row_max[fixed], mean, weights)


def _var_terms(grid: Cells, weights: dict) -> float:
    """Σ w²/n over the cells with a score (a cell counted as the floor is a constant)."""
    return float(sum(w * w / len(grid[k]) for k, w in weights.items() if grid[k]))


def compare_lr_loss(claim: Any, grids: dict[str, Cells], floor: float) -> verdicts.Verdict:
    """'η_l is easier to pick for ``claim.better`` than for ``claim.worse``': G_worse − G_better tested as the
    module docstring states (σ: the claim's seed_std, or the pooled within-cell std when every cell has 2 seeds
    or more). ``means`` holds (G_better, G_worse); ``n`` the cells of each."""
    a, b = grids.get(claim.better, {}), grids.get(claim.worse, {})
    v = verdicts.Verdict(f"learning rates are easier to pick for {claim.better} than for {claim.worse}",
                         "lr loss", "final_accuracy", {}, "no runs", (len(a), len(b)),
                         names=(claim.better, claim.worse))
    if not a or not b:
        return v
    la, lb = lr_loss(a, floor), lr_loss(b, floor)
    v.means, v.diff = (la.mean, lb.mean), lb.mean - la.mean
    scored = [x for g in (a, b) for x in g.values() if x]
    if all(len(x) >= 2 for x in scored):
        dof = sum(len(x) - 1 for x in scored)
        sigma = math.sqrt(sum(float(np.var(x, ddof=1)) * (len(x) - 1) for x in scored) / dof)
        v.test = f"t against the pooled within-cell std {sigma:.3g}"
    elif claim.seed_std is not None:
        sigma, dof = claim.seed_std, claim.seed_std_seeds - 1
        v.test = f"t against seed std {claim.seed_std:g}"
    else:
        v.verdict, v.test = "not shown", "one seed, no measured seed spread"
        return v
    v.se = sigma * math.sqrt(_var_terms(a, la.weights) + _var_terms(b, lb.weights))
    v.df = float(dof)
    verdicts.t_test(v)  # t = d / SE on df, one-sided both ways (SE = 0: the sign decides)
    return v


def judge_at_best(claim: Any, runs: list[verdicts.RunValue], row: str = ROW) -> list[verdicts.Verdict]:
    """``claim`` judged once per value of the other swept keys (a column C), between each side at its own best
    ``row`` value there (by mean ``claim.metric``: accuracy highest, rounds fewest); the verdict's cell names
    both rows, 'A's vs B's'."""
    higher = verdicts.HIGHER_IS_BETTER[claim.metric]
    runs = [rv for rv in runs if verdicts._matches(rv, claim.at) and claim.metric in rv.values and row in rv.params]
    out = []
    columns: dict[tuple, dict[str, Any]] = {}
    for rv in runs:
        rest = {k: v for k, v in sorted(rv.params.items()) if k != row}
        columns.setdefault(tuple(rest.items()), rest)
    for key, rest in columns.items():
        best = []
        for side in (claim.better, claim.worse):
            by_row: dict[Any, list[verdicts.RunValue]] = {}
            for rv in runs:
                if rv.base == side and tuple((k, v) for k, v in sorted(rv.params.items()) if k != row) == key:
                    by_row.setdefault(rv.params[row], []).append(rv)
            pick = (max if higher else min)(sorted(by_row), key=lambda r: np.mean([rv.values[claim.metric] for rv in
                                                                                  by_row[r]])) if by_row else None
            best.append((pick, by_row.get(pick, [])))
        cell = {**rest, row: f"{best[0][0]} vs {best[1][0]}"}
        # the two best cells share the column's partition and sampling seed by seed: the rule pairs them
        ra, rb = best[0][1], best[1][1]
        out.append(verdicts.ordering(claim, [rv.values[claim.metric] for rv in ra],
                                     [rv.values[claim.metric] for rv in rb], cell,
                                     seeds=([rv.seed for rv in ra], [rv.seed for rv in rb])))
    return out


def chance(path: Path) -> float | None:
    """1/L for the L classes of the group's test set (its runs' summary.json), or None if none says."""
    spec = json.loads((path / "group.json").read_text())
    for rs in spec.get("runs", {}).values():
        f = path / rs.get("dir", "") / "summary.json"
        if f.is_file():
            hist = (json.loads(f.read_text()).get("test_data") or {}).get("class_histogram")
            if hist:
                return 1 / len(hist)
    return None


def _short(key: str) -> str:
    return {ROW: "η_l", COL: "C"}.get(key, key.split(".")[-1])


def _word(verdict: str) -> str:
    return verdict if verdict == "not shown" else f"**{verdict}**"


def _judged(v: verdicts.Verdict | None) -> str:
    if v is None or v.verdict == "no runs":
        return "no runs"
    return f"{v.diff:+.3f}, p = {verdicts._p(v.p)}: {_word(v.verdict)}"


def _head(first: list[str], cols: list, name: str) -> list[str]:
    return ["| " + " | ".join(first) + " | " + " | ".join(f"{name} = {c}" for c in cols) + " |",
            "|" + "---|" * (len(first) + len(cols))]


def _diverged(path: Path, row: str, col: str) -> set[tuple]:
    """(method, row, column) of every cell with a run that diverged (index.csv's status)."""
    with open(path / "index.csv", newline="") as f:
        gone = {r["run"] for r in csv.DictReader(f) if r["status"] == "diverged"}
    spec = json.loads((path / "group.json").read_text())
    return {(s["base"], s["params"].get(row), s["params"].get(col)) for r, s in spec["runs"].items() if r in gone}


def _accuracy_table(grids: dict[str, Cells], rows: list, cols: list, floor: float, diverged: set[tuple],
                    R: str, C: str) -> list[str]:
    out = _head(["method", R], cols, C)
    for m, g in grids.items():
        best = best_rows(g, floor)
        for r in rows:
            line = []
            for c in cols:
                if (r, c) not in g:
                    line.append("—")
                    continue
                text = f"{np.mean(g[(r, c)]):.3f}" + ("†" if (m, r, c) in diverged else "") if g[(r, c)] else "div."
                line.append(f"**{text}**" if best[c][0] == r and g[(r, c)] else text)
            out.append(f"| {m} | {r} | " + " | ".join(line) + " |")
    return out


def _cell_verdicts(claims: list, runs: list[verdicts.RunValue], rows: list, cols: list, row: str, col: str,
                   R: str, C: str) -> list[str]:
    out = _head(["claim", R], cols, C)
    every = verdicts.judge_all(claims, runs)  # Holm over every claim in every cell: the summary's family
    for claim, vs in every:
        judged = {(v.cell.get(row), v.cell.get(col)): v for v in vs}
        out += [f"| {claim.better} vs {claim.worse} | {r} | " + " | ".join(_judged(judged.get((r, c))) for c in cols)
                + " |" for r in rows]
    return out + _holm_line(every)


def _holm_line(judged: list) -> list[str]:
    """The table's multiplicity statement (``verdicts.multiplicity``) as a paragraph under it."""
    line = verdicts.multiplicity(judged)
    return ["", f"{line} (Holm's adjusted p, `fedsl.report.verdicts`)."] if line else []


def _best_tables(claims: list, runs: list[verdicts.RunValue], grids: dict[str, Cells], cols: list, floor: float,
                 row: str, col: str, R: str, C: str) -> list[str]:
    best = {m: best_rows(g, floor) for m, g in grids.items()}
    out = [f"| {C} | " + " | ".join(grids) + " |", "|---|" + "---|" * len(grids)]
    out += [f"| {c} | " + " | ".join(f"{best[m][c][1]:.3f} ({R} = {best[m][c][0]})" if c in best[m] else "—"
                                     for m in grids) + " |" for c in cols]
    out += [""] + _head([f"claim, at each side's best {R}"], cols, C)
    every = verdicts.with_holm([(claim, judge_at_best(claim, runs, row)) for claim in claims])
    for claim, vs in every:
        judged = {v.cell.get(col): v for v in vs}
        out.append(f"| {claim.text} | " + " | ".join(_judged(judged.get(c)) for c in cols) + " |")
    return out + _holm_line(every)


def _loss_tables(claims: list, grids: dict[str, Cells], rows: list, floor: float, easy: tuple[str, ...],
                 R: str) -> list[str]:
    losses = {m: lr_loss(g, floor) for m, g in grids.items()}
    out = [f"| {R} | " + " | ".join(grids) + " |", "|---|" + "---|" * len(grids)]
    out += [f"| {r} | " + " | ".join(f"{lo.row_max[r]:.3f} / {lo.row_mean[r]:.3f}" if r in lo.row_max else "—"
                                     for lo in losses.values()) + " |" for r in rows]
    out.append(f"| fixed {R}: largest loss | " + " | ".join(f"{lo.fixed}: {lo.fixed_loss:.3f}"
                                                          for lo in losses.values()) + " |")
    out.append("| G | " + " | ".join(f"{lo.mean:.3f}" for lo in losses.values()) + " |")
    out += ["", "| claim | G, claimed side | G, other | difference | verdict |", "|---|---|---|---|---|"]
    compared = [(claim, [compare_lr_loss(claim, grids, floor)]) for claim in claims
                if claim.better in easy and claim.worse not in easy]
    compared = verdicts.with_holm([(c, vs) for c, vs in compared if vs[0].verdict != "no runs"])
    for _, (v,) in compared:
        out.append(f"| {v.text} | {v.means[0]:.3f} | {v.means[1]:.3f} | {v.diff:+.3f} ± {v.se:.3f} (SE), "
                   f"{v.test}, p = {verdicts._p(v.p)} | {_word(v.verdict)} |")
    return out + _holm_line(compared)


def markdown(path: str | Path, row: str = ROW, col: str = COL, easy: tuple[str, ...] = ()) -> str:
    """The group at ``path`` read as Fig. 5 (a sweep over ``row`` × ``col``), as Markdown: the final accuracies,
    each claim of the group per cell and at each method's best ``row``, and the loss of a fixed ``row``; G of the
    methods ``easy`` (those said to have learning rates easy to pick) is compared with G of each method a claim
    of the group sets them against (with that claim's seed std). Every number comes from the group's files; a
    cell with no score counts as chance (1/L of the test set's classes)."""
    path = Path(path)
    spec = json.loads((path / "group.json").read_text())
    runs = verdicts.group_values(path)
    grids = cells(runs, row, col)
    floor = chance(path) or 0.0
    cols = sorted({c for g in grids.values() for _, c in g})
    rows = sorted({r for g in grids.values() for r, _ in g})
    seeds = sorted({rv.seed for rv in runs if rv.seed is not None})
    claims = verdicts.claims_for(spec)
    sigma = next((c for c in claims if c.seed_std is not None), None)
    R, C = _short(row), _short(col)
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {', '.join(map(str, seeds))}"
    rule = "p one-sided, by the rule of `fedsl.report.verdicts`" + (
        f"; one seed a side: t against the claim's seed std {sigma.seed_std:g} over {sigma.seed_std_seeds} seeds, "
        f"{sigma.seed_std_seeds - 1} degrees of freedom" if sigma is not None and len(seeds) == 1 else "")
    out = [f"**Final accuracy** ({which}; bold: the method's best {R} in each column; †: a run that diverged, at "
           "its last accuracy; div.: diverged before any evaluation):", ""]
    out += _accuracy_table(grids, rows, cols, floor, _diverged(path, row, col), R, C)
    out += ["", f"**Each claim in each cell** (final accuracy, claimed side minus the other; {rule}):", ""]
    out += _cell_verdicts(claims, runs, rows, cols, row, col, R, C)
    out += ["", f"**Each method at its best {R} in each column** (highest final accuracy; ties: the smaller {R}), "
                "and the claims between those cells:", ""]
    out += _best_tables(claims, runs, grids, cols, floor, row, col, R, C)
    out += ["", f"**The accuracy lost by a fixed {R}** against the column's best: its largest / mean loss over {C}; "
                f"a cell with no score counts as chance ({floor:g}). The fixed {R}: the one whose largest loss is "
                f"smallest. G: the mean loss over the grid (an {R} picked blindly). G compared: SE from the seed "
                "std with each column's best cell held fixed (`fedsl.report.grid`):", ""]
    out += _loss_tables(claims, grids, rows, floor, easy, R)
    return "\n".join(out) + "\n"
