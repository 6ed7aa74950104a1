"""Every statistic the record's prose quotes (REPRODUCTION.md and each experiment's page, reproduction/pages/*.md),
checked against what the folders of its section compute.

    python reproduction/prose.py     # each number of the prose that no folder of its section gives, or "ok"

The generated blocks (between `<!-- NAME: computed by ... -->` and `<!-- end of NAME -->`) are what `python
reproduction/summary.py --check` checks. This checks the words around them, section by section (a section: a `## `
heading and what follows it, up to the next; a page without one is one section): every "A ± B" must be a mean ± sample
std over a variant's seeds (all its finished seeds, or its completed ones), a difference ± its standard error of a
claim judged by the project's rule, and every "p = X" / "p < X" a p-value of such a claim (one-sided in the claimed
direction, against it, or Holm's adjusted p; Fig. 5's grid claims and G; Spearman's exact p of the assessment's
scores; on a line that names Welch, Welch's p of the same runs unpaired), computed from a folder the section names as
`reproduction/NAME`, to the decimals the prose writes. Numbers in code (lines indented by 4 spaces or more), the
rule's own threshold ("p < 0.05") and a p written to one decimal (the availability p of its section: "at p = 0.5") are
not checked. tests/test_reproduction_numbers.py fails on anything this lists.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import sys
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


def _assessment(path: Path) -> Computed:
    """Spearman's ρ of each assessment score against FSL's gain, with its exact one-sided p
    (reproduction/assess_validation.py), at each point assessed."""
    spec = importlib.util.spec_from_file_location("assess_validation", HERE / "assess_validation.py")
    av = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(av)
    gain = av.gains(path)
    out = Computed()
    for csv_path in sorted(path.glob("assess-*/assess.csv")):
        with open(csv_path, newline="") as f:
            rows = {r["name"]: r for r in csv.DictReader(f)}
        names = [n for n in rows if n in gain]
        measured = [gain[n][0] for n in names]
        for key, (_, sign) in av.SCORES.items():
            out.ps.append(av.exact_p([sign * float(rows[n][key]) for n in names], measured))
    return out


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


# a sentence saying a run or study has not happened ("has not run yet", "is pending", "not started")
NOT_RUN = re.compile(r"ha(?:s|ve) not (?:yet )?(?:run|been run|started)|(?:is|are) pending|not run yet")


def stale(text: str) -> list[str]:
    """'line N: ...' for each sentence that says a folder's runs have not run while the folder holds finished runs:
    a sentence (to its full stop) with NOT_RUN and a backticked name `X` where reproduction/X has a finished run."""
    problems = []
    flat = without_blocks(text)
    for m in NOT_RUN.finditer(flat):
        start = max(flat.rfind(". ", 0, m.start()), flat.rfind(".\n", 0, m.start()),
                    flat.rfind("\n\n", 0, m.start())) + 1
        ends = [e for e in (flat.find(". ", m.end()), flat.find(".\n", m.end())) if e >= 0]
        sentence = flat[start:min(ends) if ends else len(flat)]
        for name in re.findall(r"`(?:reproduction/)?([\w.-]+)/?`", sentence):
            folder = HERE / name
            if (folder / "group.json").is_file() and any(
                    json.loads(s.read_text()).get("status") == "completed" for s in folder.glob("*/summary.json")):
                line = flat.count("\n", 0, m.start()) + 1
                problems.append(f"line {line}: says `{name}` has not run, but reproduction/{name} holds finished runs")
    return problems


def check(text: str) -> list[str]:
    """'line N: "the number" is no ...' for each statistic of the prose no folder of its section computes, and each
    sentence that says a folder has not run while it holds finished runs (``stale``)."""
    problems = stale(text)
    cache: dict[Path, Computed] = {}
    for start, lines in sections(without_blocks(text)):
        have = Computed()
        for folder in _folders(lines):
            if folder not in cache:
                cache[folder] = computed(folder)
            have.add(cache[folder])
        for n, line in enumerate(lines, start):
            if re.match(r" {4,}", line):  # code
                continue
            for sign, a, b in PLUS_MINUS.findall(line):
                if not any(_reads(x, sign, a) and _near(s, b) for x, s in have.pairs if not math.isnan(s)):
                    problems.append(f"line {n}: '{sign}{a} ± {b}' is no mean ± sample std or difference ± SE of "
                                    f"the section's folders ({', '.join(f.name for f in _folders(lines)) or 'none'})")
            for op, p in P_VALUE.findall(line):
                if op == "<":
                    ok = p == THRESHOLD or any(x < float(p) for x in have.ps)
                else:  # Welch's p of a paired comparison only where the line says it is Welch's
                    ok = any(_near(x, p) for x in have.ps + (have.welch if "Welch" in line else []))
                if not ok:
                    problems.append(f"line {n}: 'p {op} {p}' is no p-value of the section's folders' claims "
                                    f"({', '.join(f.name for f in _folders(lines)) or 'none'})")
    return problems


# ---------------------------------------------------------------------------------------------- plain numbers
# A report, not yet a check (the test does not enforce it): each plain decimal of the prose (two places or more, not
# part of an "A ± B" or a p) against the values of the variants its line (else its paragraph) names. Lines that
# name no variant, paper quotes, per-round values and settings are not told apart yet, so most of what it lists is
# not wrong, only unchecked: `python reproduction/prose.py --plain`. Nor is a match strong evidence yet: a name
# such as "FSL" pools every cell of a grid folder (FSL-lr0.02-C2, ...), and a matched three-decimal number shifted
# by +0.007 still matched in about three cases of four over the record (rarely on a page of a few variants).
DECIMAL = re.compile(r"(?<![\w.])([+−-]?)(\d+\.\d{2,})(?![\w.])")
PAIRS = ("pairs",)  # a folder's table key: {variant pair: their differences of means and paired SEs}


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


def variant_values(folder: Path) -> dict:
    """variant -> what the prose may quote of it: each run's final metrics (summary.json's final_*, initial_*, T_*,
    rise_time), its mean and sample std over seeds, its η_l, η_g, γ, decay and β, and its study's best value, chosen
    values, top-3 spread and rounds run; and under ``PAIRS`` each pair's difference of means and paired SE."""
    out: dict = {}
    per: dict[tuple[str, str], dict[str, float]] = {}
    rows: list[dict] = []
    if (folder / "index.csv").is_file():
        with open(folder / "index.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    for r in rows:
        vals = out.setdefault(r["variant"], [])
        for m in METRICS:
            if r.get(m) not in (None, "", "nan"):
                per.setdefault((r["variant"], m), {})[r["seed"]] = float(r[m])
        summary = folder / r["run"] / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            _leaves({k: v for k, v in s.items() if k.startswith(("final_", "initial_", "T_", "rise"))}, vals)
        config = folder / r["run"] / "config.json"
        if config.is_file():
            c = json.loads(config.read_text())
            a, sv = c.get("algorithm", {}), c.get("server", {})
            _leaves([a.get("local_lr"), a.get("global_lr"), a.get("feddu_decay"), a.get("feddum_beta"),
                     sv.get("gamma")], vals)
    for (v, _), by_seed in per.items():
        xs = list(by_seed.values())
        out[v] += xs + [float(np.mean(xs))] + ([_sample_std(xs)] if len(xs) > 1 else [])
    pairs: dict[frozenset, list[float]] = {}
    for (v, m), (w, m2) in ((a, b) for a in per for b in per if a != b and a[1] == b[1]):
        a, b = per[(v, m)], per[(w, m2)]
        d = float(np.mean(list(a.values())) - np.mean(list(b.values())))
        both = pairs.setdefault(frozenset((v, w)), [])
        both += [d, -d]
        common = sorted(set(a) & set(b))
        if len(common) > 1:
            both.append(float(np.std([a[s] - b[s] for s in common], ddof=1) / math.sqrt(len(common))))
    out[PAIRS] = pairs
    for best in folder.rglob("best.json"):
        for e in json.loads(best.read_text()):
            vals = out.setdefault(e["variant"], [])
            _leaves([e.get("best"), e.get("params"), e.get("top_spread"), e.get("rounds_run")], vals)
            _leaves([t[1] for t in e.get("top", [])], vals)
    return out


def _named(line: str, names: list[str]) -> list[str]:
    return [n for n in names if re.search(r"(?<![\w-])" + re.escape(n) + r"(?![\w-])", line)]


def _paragraphs(lines: list[str]) -> list[str]:
    """For each line, the text of its paragraph or list item (lines up to a blank one or the next item)."""
    out, group = [], []

    def close() -> None:
        out.extend([" ".join(group)] * len(group))
        group.clear()
    for line in lines:
        if not line.strip() or line.lstrip().startswith(("- ", "| ")):
            close()
            if not line.strip():
                out.append("")
                continue
        group.append(line)
    close()
    return out


def plain(text: str) -> list[str]:
    """'line N: X' for each plain decimal of ``text``'s prose that no value of the variants its line names gives
    (``variant_values`` of the section's folders); a line naming no variant has nothing to match (listed)."""
    problems = []
    cache: dict[Path, dict] = {}
    for start, lines in sections(without_blocks(text)):
        tables = [cache.setdefault(f, variant_values(f)) for f in _folders(lines)]
        names = sorted({v for t in tables for v in t if isinstance(v, str)}
                       | {v.split("-")[0] for t in tables for v in t if isinstance(v, str)}, key=len, reverse=True)
        paragraph = _paragraphs(lines)
        for n, line in enumerate(lines, start):
            if re.match(r" {4,}", line):
                continue
            said = _named(line, names) or _named(paragraph[n - start], names)  # else the paragraph's, if it names
            pool: list[float] = []
            for t in tables:
                hit = [v for v in t if isinstance(v, str) and (v in said or any(v.startswith(f"{c}-") for c in said))]
                for v in hit:
                    pool += t[v]
                pool += [x for pair, xs in t[PAIRS].items() if pair <= set(hit) for x in xs]
            rest = re.sub(r"Holm \d\.\d+", " ", P_VALUE.sub(" ", PLUS_MINUS.sub(" ", line)))
            for sign, num in DECIMAL.findall(rest):
                if not any(_reads(x, sign, num) for x in pool):
                    problems.append(f"line {n}: '{sign}{num}' is no value of {', '.join(said) or 'a variant named'}")
    return problems


def check_record() -> list[str]:
    """``check`` of every document of the record, each problem prefixed with its file."""
    return [f"{p.relative_to(HERE.parent)}: {problem}" for p in documents() for problem in check(p.read_text())]


if __name__ == "__main__":
    if "--plain" in sys.argv:
        listed = [f"{p.relative_to(HERE.parent)}: {x}" for p in documents() for x in plain(p.read_text())]
        print("\n".join(listed) + f"\n{len(listed)} plain numbers not matched (a report: see plain())")
        sys.exit(0)
    found = check_record()
    print("\n".join(found) if found else "ok")
    sys.exit(1 if found else 0)
