"""What the two checks of reproduction/prose.py share: the record's documents and their sections (generated blocks
blanked), the folders a section names, how a number the prose writes reads a value, and what each folder computes
for the prose's "A ± B" and "p = X" (``computed``: each variant's mean ± sample std over seeds, each claim's
difference ± SE and p-values judged by the project's rule, an assessment's exact p; prose.py's docstring gives the
rule).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsl.report import grid, verdicts

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "REPRODUCTION.md"
PAGES = HERE / "pages"  # one page per experiment, linked from REPRODUCTION.md's index


def documents() -> list[Path]:
    """The record: REPRODUCTION.md, then each experiment's page."""
    return [DOC, *sorted(PAGES.glob("*.md"))]


METRICS = ("final_accuracy", "T_0.5", "rise_time",
           "final_client_acc_mean", "final_client_acc_std", "final_client_acc_worst10")  # eval_per_client's
NUMBER = r"\d+(?:\.\d+)?"
PLUS_MINUS = re.compile(rf"([+−-]?)({NUMBER}) ± ({NUMBER})")
# a p-value written to 2 decimals or more ("p = 0.5" with one is the availability p of its section)
P_VALUE = re.compile(r"\bp ([=<≈]) ?(\d+\.\d\d+)")
THRESHOLD = "0.05"  # "p < 0.05": the rule, not a result


@dataclass
class Computed:
    """What a section's folders compute: (value, spread) pairs and p-values."""
    pairs: list[tuple[float, float]] = field(default_factory=list)
    ps: list[float] = field(default_factory=list)
    welch: list[float] = field(default_factory=list)  # Welch's p on the same runs, unpaired (quoted as such)

    def add(self, other: Computed) -> None:
        self.pairs += other.pairs
        self.ps += other.ps
        self.welch += other.welch


def _sample_std(xs: list[float]) -> float:
    return float(np.std(xs, ddof=1)) if len(xs) > 1 else math.nan


def _spread_pairs(groups: dict[object, list[float]]) -> list[tuple[float, float]]:
    return [(float(np.mean(xs)), _sample_std(xs)) for xs in groups.values() if len(xs) > 1]


def _means(path: Path) -> list[tuple[float, float]]:
    """Each variant's (sweep cell's) mean ± sample std of each metric over its seeds: over every finished seed with
    a value (a diverged run at its last accuracy, a T_a never reached at the last round), and over the completed
    seeds that reached it (as the summary's numbers count them)."""
    every: dict[tuple, list[float]] = {}
    for rv in verdicts.group_values(path):
        for m, x in rv.values.items():
            every.setdefault((rv.base, tuple(sorted(rv.params.items())), m), []).append(x)
    done: dict[tuple, list[float]] = {}
    with open(path / "index.csv", newline="") as f:
        for row in csv.DictReader(f):
            for m in METRICS:
                if row["status"] == "completed" and row.get(m) not in (None, "", "nan"):
                    done.setdefault((row["variant"], m), []).append(float(row[m]))
    return _spread_pairs(every) + _spread_pairs(done)


def _verdict_numbers(vs: list[verdicts.Verdict]) -> Computed:
    out = Computed()
    for v in vs:
        if not math.isnan(v.se):
            out.pairs.append((v.diff, v.se))
        out.ps += [p for p in (v.p, v.p_against, v.p_holm) if not math.isnan(p)]
    return out


def _claims(path: Path, spec: dict) -> Computed:
    """Every claim of the group judged by the rule (Holm over the group), and, for a grid of η_l × C, each claim at
    each side's best η_l and G compared (``fedsl.report.grid``, with Holm over each table)."""
    runs = verdicts.group_values(path)
    claims = verdicts.claims_for(spec)
    out = _verdict_numbers([v for _, vs in verdicts.judge_all(claims, runs) for v in vs])
    unpaired = [verdicts.RunValue(rv.base, None, rv.params, rv.values) for rv in runs]  # no seed: no pairing
    out.welch = [v.p_own for c in claims for v in verdicts.judge(c, unpaired) if v.test == "Welch t"]
    if {grid.ROW, grid.COL} <= set(spec.get("sweep", [])):
        at_best = verdicts.with_holm([(c, grid.judge_at_best(c, runs)) for c in claims if c.worse])
        out.add(_verdict_numbers([v for _, vs in at_best for v in vs]))
        cells, floor = grid.cells(runs), grid.chance(path) or 0.0
        g = verdicts.with_holm([(c, [grid.compare_lr_loss(c, cells, floor)]) for c in claims if c.worse])
        out.add(_verdict_numbers([v for _, vs in g for v in vs if v.verdict != "no runs"]))
    return out


def assessment_pairs(path: Path):
    """reproduction/assess_validation.py, and for each assessment score at each point assessed the candidates'
    scores (signed: larger predicts more gain) and FSL's measured gains, as two lists."""
    spec = importlib.util.spec_from_file_location("assess_validation", HERE / "assess_validation.py")
    av = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(av)
    gain = av.gains(path)
    pairs = []
    for csv_path in sorted(path.glob("assess-*/assess.csv")):
        with open(csv_path, newline="") as f:
            rows = {r["name"]: r for r in csv.DictReader(f)}
        names = [n for n in rows if n in gain]
        measured = [gain[n][0] for n in names]
        pairs += [([sign * float(rows[n][key]) for n in names], measured) for key, (_, sign) in av.SCORES.items()]
    return av, pairs


def _assessment(path: Path) -> Computed:
    """Spearman's ρ of each assessment score against FSL's gain, with its exact one-sided p
    (reproduction/assess_validation.py), at each point assessed."""
    av, pairs = assessment_pairs(path)
    out = Computed()
    out.ps = [av.exact_p(score, measured) for score, measured in pairs]
    out.ps += _holm(out.ps)  # Holm over the folder's tests (every score at every point assessed)
    return out


def _holm(ps: list[float]) -> list[float]:
    """Holm's adjusted p-values of ``ps`` (in ascending order of p)."""
    adjusted, top = [], 0.0
    for i, p in enumerate(sorted(ps)):
        top = max(top, min(1.0, (len(ps) - i) * p))
        adjusted.append(top)
    return adjusted


_COMPUTED: dict[Path, Computed] = {}


def computed_cached(path: Path) -> Computed:
    """``computed(path)``, once per folder and process."""
    if path not in _COMPUTED:
        _COMPUTED[path] = computed(path)
    return _COMPUTED[path]


def computed(path: Path) -> Computed:
    """What the folder at ``path`` computes (``Computed``)."""
    spec = json.loads((path / "group.json").read_text())
    out = Computed(pairs=_means(path))
    out.add(_claims(path, spec))
    if any(path.glob("assess-*/assess.csv")):
        out.add(_assessment(path))
    return out


def without_blocks(text: str) -> str:
    """``text`` with each generated block's lines blanked (line numbers kept)."""
    lines = text.splitlines()
    inside = False
    for i, line in enumerate(lines):
        if re.match(r"<!-- [\w-]+: computed by", line):
            inside = True
        elif re.match(r"<!-- end of [\w-]+ -->", line):
            inside = False
        elif inside:
            lines[i] = ""
    return "\n".join(lines)


def sections(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each `## ` section (the text before the first is one too)."""
    out: list[tuple[int, list[str]]] = [(1, [])]
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            out.append((i, []))
        out[-1][1].append(line)
    return out


def _decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def _near(x: float, written: str) -> bool:
    """Whether ``x`` reads ``written`` at its decimals."""
    return abs(x - float(written)) <= 0.5 * 10 ** -_decimals(written) + 1e-9


def _reads(x: float, sign: str, written: str) -> bool:
    """Whether ``x`` reads as the prose's signed ``sign``+``written`` ('+0.008', '−0.020'), or, unsigned, as its
    size (a mean, or a difference whose direction the words give)."""
    if not sign:
        return _near(abs(x), written)
    return (x < 0) == (sign in "−-") and _near(abs(x), written)


def _folders(lines: list[str]) -> list[Path]:
    names = set(re.findall(r"reproduction/([\w.-]+)", "\n".join(lines)))
    return sorted(HERE / n for n in names if (HERE / n / "group.json").is_file())


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]
