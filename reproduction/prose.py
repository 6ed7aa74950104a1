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

Plain numbers (``plain``). Every other decimal written to two places or more must be, to the decimals written:
- a value of the variants it names (``variant_values``): a run's or a variant's final accuracy, T_0.5, rise time or
  time from summary.json / index.csv, their mean or sample std over seeds, a difference of two named variants' means
  (in one folder or in two of the section's) or its paired SE, a chosen hyper-parameter, best value, top three and
  their spread from best.json, on a grid of η_l × C a cell's loss against its column's best (and its row's largest
  and mean loss, the fixed η_l's loss, G: ``fedsl.report.grid``), an assessment's score or Spearman's ρ, a list of
  p-values continuing a "p = " ("p = 0.223, 0.078 and 0.458") or a Holm p; a variant the folder's claims read that
  has no runs of its own ("FedAvg+FT", FedAvg's runs fine-tuned) is a variant like the others;
- the result of a sum the prose writes out ("0.999^300 = 0.74", "10 × 50 = 500"), computed; a value written in
  powers of ten ("1.62·10^-5") is its mantissa at that power; a best.json's widened range gives its ends; a time of
  the folder's round_cost.md (reproduction/round_cost.py's table) is its row's variant's; a "Holm" at a line's end
  takes the p that starts the next;
- a setting: any number of the variant's config.json, summary.json's hyper-parameters or its sweep cell, and, in
  a preset's own folder (reproduction/NAME whose group.json is named NAME, a preset's name), of that preset: its
  settings and the variant's table (``PRESET_NOT_SETTINGS``: not its claims, paper numbers, quick form or ranges);
- with "round N" / "N rounds" / "round 50 / 100 / 150" on its line or paragraph (in a table, its row or its
  column's header), a number of the named variants' metrics.csv at those rounds;
- a number quoted from a paper, MARKED: inside a parenthesis, or a clause of one after "; ", that opens with
  "paper:" ("FSL 0.47 (paper: 0.61)", "(the paper: 0.61 and 0.59)", "(FSL 0.47; the paper: 0.61)"), or in a table
  column whose header, or a row whose first cell, says "paper". Nothing else is a paper quote;
- a number quoted from an independent implementation, marked the same way with "independent" for "paper" ("FSL
  0.595 (independent: 0.594)", a table column headed "independent"). Nothing else is such a quote.
Which variants it names: in a table, those its row's first cell and its column header name together; else its line's,
else its paragraph's (a number not among its line's may also be one of its paragraph's), else every variant of the
section. A variant is named by its name ("FSL-500"), by its method without the sweep cell ("FSL-p"), by a part where
no method has that name ("FedAvg" for "signflip-FedAvg-fraction=0.4"; not an everyday word such as "only"), and
``ALIASES`` reads a few prose forms ("f = 0.4", "η_l = 0.02", "ε = 1", "sign flipping", "IID 500", "D0 only") as the
names they stand for; two names of the same variants ("D0", "D0-only") are one vote. Sweep cells named narrow the
variants swept on that setting to those cells (all of them: "at ε = 1 ... at ε = 4" keeps both), and leave the
variants not swept on it.
Counting words: "24 trials", "3 fresh seeds", "the 21 runs" must be a count of the section's folders of that noun (a
study's trials, completed, pruned or failed; a variant's seeds; runs of a variant, completed or diverged, or all;
each also summed over the folder and over the section), and "two of each method's six trials" a count every variant
shares. A count of one, a bound ("at least 2 seeds") and a section naming no folder are not checked.

Enforced on REPRODUCTION.md and every page except ``NOT_YET``, the pages whose prose still quotes numbers that no
committed file gives (runs of the old defaults no longer kept, metrics.csv not kept, per-round values of other
pages): appendix-diagnostics, appendix-no-pretrain, emnist-reduced, fig3-cifar10. `python reproduction/prose.py
--plain` lists what each still has.
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

from fedsl.config import presets
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
    for start, lines in sections(without_blocks(text)):
        have = Computed()
        for folder in _folders(lines):
            have.add(computed_cached(folder))
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
# Each plain decimal of the prose (two places or more, not part of an "A ± B", a p or a Holm p) must be a value of
# the variants its line names (``variant_values``); each count of runs, trials or seeds ("24 trials", "3 seeds",
# "two of each method's six trials") a count of its section's folders (``Values.counts``).
DECIMAL = re.compile(r"(?<![\w.])([+−-]?)(\d+\.\d{2,})(?!\w|\.\d)")  # a full stop may end it
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}
_NUM = r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d+|" + "|".join(WORDS) + r")"
# "24 trials", "3 fresh seeds", "the 21 runs"; and "two of each method's six trials" (the "two" is a count too)
COUNT = re.compile(rf"\b{_NUM} (?:(?!of |for |and |in |at |per |to )[\w-]+ )?(trials?|runs?|seeds?)\b", re.IGNORECASE)
COUNT_OF = re.compile(rf"\b{_NUM} of ((?:[\w'’-]+ ){{0,3}}?)(?:{_NUM} )?(?:[\w-]+ )?(trials?|runs?|seeds?)\b",
                      re.IGNORECASE)
# a quote from a paper: a parenthesis, or a clause of one after "; ", that opens with "paper:" ("(paper: 0.61)",
# "(the paper: 0.61 and 0.59)", "(FSL 0.47; the paper: 0.61)"), or a table column whose header, or a row whose first
# cell, says "paper"; its numbers are the paper's, not ours, and are not checked. A number quoted from an independent
# implementation is marked the same way with "independent" ("(independent: 0.594)", a column headed "independent").
QUOTED = ("paper", "independent")
PAPER = re.compile(r"(?:\(|; )(?:the |its )?(?:paper|independent)\b[^():]{0,30}:[^();]*(?=[);])")  # to ")" or ";"
# how the prose names a cell of a sweep: "f = 0.4" is the variant suffix "fraction=0.4", and so on
ALIASES = ((r"\bf = (\d[\d.]*)", r"fraction=\1"), (r"\bη_l = (\d[\d.]*)", r"local_lr=\1"),
           (r"\bC = (\d+)", r"classes_per_client=\1"), (r"\bn0 = (\d+)", r"server_size=\1"),
           (r"\bsign flip(?:ping)?\b", "signflip"), (r"\blabel flip(?:ping)?\b", "labelflip"),
           (r"\bFedDyn \+ SL\b", "FedDyn-SL"), (r"\bD0 only\b", "D0-only"),
           (r"\bε = (\d+)\b", r"target_epsilon=\1"), (r"\b(FSL|FedAvg) with DP\b", r"\1-DP"), (r" \+ ", "+"),
           # the candidate D0s of the assessment pages
           (r"\bIID (\d+)\b", r"iid\1"), (r"\bSTL-10 504\b", "stl10-504"), (r"\b10 clients × 50\b", "clients500"),
           (r"\b9 clients × 30\b", "clients450"), (r"\bone client's (?:50|30)\b|\bone-client D0\b", "skewed50"),
           (r"\b675 font renderings\b", "synthchars675"), (r"\bFSLsyn 675\b", "fslsyn675"))
WORDS_NOT_NAMES = {"only"}  # a part of a variant's name that is an everyday word ("D0-only"): no name by itself
P_LIST = re.compile(r"(\bp [=<≈] ?\d+\.\d+|\bHolm \d+\.\d+)((?:(?:,| and| or) \d+\.\d+)+)")
# a sum written out with its result ("0.999^300 = 0.74", "10 × 50 = 500"): the result is checked by computing it
ARITHMETIC = re.compile(rf"(?<![\w.^])({NUMBER}) ?([\^×*/]) ?({NUMBER}) ?= ?({NUMBER})(?![\w^]|\.\d)")
_OPS = {"^": lambda a, b: a ** b, "×": lambda a, b: a * b, "*": lambda a, b: a * b,
        "/": lambda a, b: a / b if b else math.nan}
SCIENTIFIC = re.compile(rf"({NUMBER}) ?[·×] ?10\^([−-]?\d+)")
# "round 50", "300 rounds", and a list of rounds: "round 50 / 100 / 150", "rounds 281 and 284"
ROUND = re.compile(r"\brounds? (\d+(?:(?: ?/ ?|, | and )\d+)*)\b|\b(\d+) rounds\b")
# a preset's tables that are no setting of its runs: what it claims and quotes, its quick form, its sweep's and
# tuning's ranges (a run's own cell is its group.json's params), and the variants (each reads its own table)
PRESET_NOT_SETTINGS = {"claims", "paper", "paper_claims", "paper_rounds", "quick", "sweep", "tune", "variants"}
PAIRS = ("pairs",)  # kept for callers of variant_values: its table key of pair differences


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


@dataclass
class Values:
    """What one folder lets the prose quote plainly."""
    name: str = ""
    variants: dict[str, list[float]] = field(default_factory=dict)  # results, settings and choices per variant
    pairs: dict[frozenset, list[float]] = field(default_factory=dict)  # two variants' differences of means, SEs
    folder: list[float] = field(default_factory=list)  # what no variant owns (Spearman's ρ of an assessment, ...)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # variant -> {kind of count: n}
    runs: dict[str, list[Path]] = field(default_factory=dict)  # variant -> its runs' folders (for per-round values)
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> {metric: mean over seeds}


def variant_values(folder: Path) -> Values:
    """What the prose may quote of the folder: per variant, each run's final metrics (summary.json's final_*,
    initial_*, T_*, rise_time, rounds_done, wall_time), their mean and sample std over seeds, every number of its
    runs' config.json and summary.json's hyper-parameters (a setting), its study's best value, chosen values, top
    three and their spread (best.json), an assessment's scores (assess.csv); each pair's difference of means and
    paired SE; Spearman's ρ of an assessment; and the counts of runs, seeds and trials (``Values.counts``)."""
    out = Values(name=folder.name)
    per: dict[tuple[str, str], dict[str, float]] = {}
    rows: list[dict] = []
    if (folder / "index.csv").is_file():
        with open(folder / "index.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    for r in rows:
        v = r["variant"]
        vals = out.variants.setdefault(v, [])
        out.runs.setdefault(v, []).append(folder / r["run"])
        n = out.counts.setdefault(v, {})
        n["runs"] = n.get("runs", 0) + 1
        n["completed"] = n.get("completed", 0) + (r["status"] == "completed")
        n["diverged"] = n.get("diverged", 0) + (r["status"] != "completed")
        for m in (*METRICS, "rounds_done", "wall_time"):
            if r.get(m) not in (None, "", "nan"):
                per.setdefault((v, m), {})[r["seed"]] = float(r[m])
        summary = folder / r["run"] / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            _leaves({k: x for k, x in s.items() if k.startswith(("final_", "initial_", "T_", "rise", "wall"))}, vals)
            _leaves({k: h.get("value") for k, h in s.get("hyperparameters", {}).items()}, vals)
        config = folder / r["run"] / "config.json"
        if config.is_file():
            _leaves(json.loads(config.read_text()), vals)
    group = json.loads((folder / "group.json").read_text()) if (folder / "group.json").is_file() else {}
    for run in group.get("runs", {}).values():  # a sweep cell's settings (index-only folders keep no config.json)
        if run.get("variant") in out.variants:
            _leaves(run.get("params", {}), out.variants[run["variant"]])
    if group.get("name") == folder.name and folder.name in presets.names():  # a preset's own folder: its settings
        preset = presets.load(folder.name)
        common = {k: x for k, x in preset.items() if k not in PRESET_NOT_SETTINGS}
        tables = preset.get("variants", {})
        for v in list(out.variants):
            _leaves([common, tables.get(v) or tables.get(_method(v)) or {}], out.variants[v])
    for v, n in out.counts.items():
        n["seeds"] = len({r["seed"] for r in rows if r["variant"] == v})
    if rows:  # a variant the claims read that has no run of its own (FedAvg+FT: FedAvg's runs fine-tuned)
        own = set(out.counts) | {_method(v) for v in out.counts}
        for rv in verdicts.group_values(folder):
            if rv.base not in own:
                v = "-".join([rv.base, *(f"{k.split('.')[-1]}={x}" for k, x in rv.params.items())])
                out.variants.setdefault(v, [])
                out.counts.setdefault(v, {})
                for m, x in rv.values.items():
                    per.setdefault((v, m), {})[str(rv.seed)] = float(x)
    for (v, _), by_seed in per.items():
        xs = list(by_seed.values())
        out.variants[v] += xs + [float(np.mean(xs))] + ([_sample_std(xs)] if len(xs) > 1 else [])
        out.means.setdefault(v, {})[_] = float(np.mean(xs))
        out.counts[v]["with a value"] = max(out.counts[v].get("with a value", 0), len(xs))
    for (v, m), (w, m2) in ((a, b) for a in per for b in per if a != b and a[1] == b[1]):
        a, b = per[(v, m)], per[(w, m2)]
        d = float(np.mean(list(a.values())) - np.mean(list(b.values())))
        both = out.pairs.setdefault(frozenset((v, w)), [])
        both += [d, -d]
        common = sorted(set(a) & set(b))
        if len(common) > 1:
            both.append(float(np.std([a[s] - b[s] for s in common], ddof=1) / math.sqrt(len(common))))
    for best in folder.rglob("best.json"):
        for e in json.loads(best.read_text()):
            vals = out.variants.setdefault(e["variant"], [])
            _leaves([e.get("best"), e.get("params"), e.get("top_spread"), e.get("rounds_run"), e.get("top")], vals)
            for widened in e.get("widened", {}).values():  # "low 0.316228 -> 0.0316228": a range's ends
                vals += [float(x) for x in re.findall(NUMBER, widened)]
            top = [t[1] for t in e.get("top", [])]
            vals += [abs(a - b) for a in top for b in top if a != b]  # how far apart the top trials are
            n = out.counts.setdefault(e["variant"], {})
            for k in ("budget", "complete", "pruned", "failed"):
                if isinstance(e.get(k), int):
                    n[f"trials {k}"] = n.get(f"trials {k}", 0) + e[k]
            n["trials failed or pruned"] = n.get("trials failed", 0) + n.get("trials pruned", 0)
    if {grid.ROW, grid.COL} <= set(group.get("sweep", [])):  # a grid of η_l × C: each cell's loss (``grid``)
        where = {(r["base"], r["params"].get(grid.ROW), r["params"].get(grid.COL)): r["variant"]
                 for r in group.get("runs", {}).values() if "params" in r and "base" in r}
        for base, cells in grid.cells(verdicts.group_values(folder)).items():
            loss = grid.lr_loss(cells, grid.chance(folder) or 0.0)
            for (r, c), x in loss.loss.items():
                if (base, r, c) in where and where[(base, r, c)] in out.variants:
                    vals = out.variants[where[(base, r, c)]]
                    vals += [x, loss.row_max[r], loss.row_mean[r], loss.fixed_loss, loss.mean]
    for cost in folder.glob("round_cost*.md"):  # reproduction/round_cost.py's table: a row per variant, in seconds
        for line in cost.read_text().splitlines():
            cells = _cells(line) if line.startswith("|") else []
            if cells and cells[0] in out.variants:
                out.variants[cells[0]] += [float(x) for c in cells[1:] for x in re.findall(rf"^{NUMBER}$", c)]
    for tune in folder.rglob("tune.json"):
        _leaves(json.loads(tune.read_text()).get("config", {}).get("tune", {}), out.folder)
    for csv_path in sorted(folder.glob("assess-*/assess.csv")):
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                for x in r.values():
                    try:
                        out.variants.setdefault(r["name"], []).append(float(x))
                    except (TypeError, ValueError):
                        pass
    if any(folder.glob("assess-*/assess.csv")):
        out.folder += _assessment_rhos(folder)
    return out


def _assessment_rhos(folder: Path) -> list[float]:
    """Spearman's ρ of each assessment score against FSL's gain (reproduction/assess_validation.py), at each
    point assessed, and the exact one-sided p of ρ = 0.5 .. 1 over the candidates (the rule's examples)."""
    spec = importlib.util.spec_from_file_location("assess_validation", HERE / "assess_validation.py")
    av = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(av)
    gain = av.gains(folder)
    out = []
    for csv_path in sorted(folder.glob("assess-*/assess.csv")):
        with open(csv_path, newline="") as f:
            rows = {r["name"]: r for r in csv.DictReader(f)}
        names = [n for n in rows if n in gain]
        measured = [gain[n][0] for n in names]
        for key, (_, sign) in av.SCORES.items():
            score = [sign * float(rows[n][key]) for n in names]
            out += [av.spearman(score, measured), av.exact_p(score, measured)]
    return out


# which kinds of count (``Values.counts``) a noun may state: a trial is a study's, a seed a variant's seeds
KINDS = {"trial": lambda k: k.startswith("trials"), "seed": lambda k: k in ("seeds", "with a value"),
         "run": lambda k: not k.startswith("trials")}


def _counts(tables: list[Values], chosen: list[tuple[int, str]] | None, noun: str) -> tuple[set[int], set[int]]:
    """(every count of ``noun`` ("trial", "seed", "run") the chosen variants, or all, and their folders give; the
    counts every chosen variant shares: what "each method's six trials" may say)."""
    fits = KINDS[noun]
    any_: set[int] = set()
    shared: set[int] = set()
    section: dict[str, int] = {}  # each kind's total over the section's folders
    for t in tables:
        for n in t.counts.values():
            for k, x in n.items():
                section[k] = section.get(k, 0) + x
    any_ |= {x for k, x in section.items() if fits(k)}
    for i, t in enumerate(tables):
        mine = [v for (j, v) in chosen if j == i] if chosen else list(t.counts)
        kinds = {k for v in t.counts for k in t.counts[v] if fits(k)}
        for k in kinds:
            per = [t.counts[v][k] for v in mine if k in t.counts.get(v, {})]
            any_ |= set(per) | {sum(per), sum(n.get(k, 0) for n in t.counts.values())}  # and the folder's total
            if len(set(per)) == 1:
                shared |= set(per)
        if noun == "run":
            any_ |= {len(t.counts), len({_method(v) for v in t.counts})}  # a run of each variant, of each method
    return any_, shared


def _number(word: str) -> int:
    return WORDS[word.lower()] if word.lower() in WORDS else int(word.replace(",", ""))


def _round_values(runs: list[Path], rounds: set[int], cache: dict) -> list[float]:
    """Every number of the runs' metrics.csv rows at ``rounds``, and each column's mean over the runs."""
    out: list[float] = []
    by_col: dict[tuple[int, str], list[float]] = {}
    for run in runs:
        if run not in cache:
            cache[run] = {}
            if (run / "metrics.csv").is_file():
                with open(run / "metrics.csv", newline="") as f:
                    cache[run] = {int(r["round"]): r for r in csv.DictReader(f)}
        for r in rounds:
            for k, x in cache[run].get(r, {}).items():
                if x not in ("", "nan", None) and k != "round":
                    out.append(float(x))
                    by_col.setdefault((r, k), []).append(float(x))
    return out + [float(np.mean(xs)) for xs in by_col.values()]


def _aliased(text: str) -> str:
    for pattern, name in ALIASES:
        text = re.sub(pattern, name, text)
    return text


def _method(variant: str) -> str:
    """A variant's name without its sweep cell: "FSL-p" of "FSL-p-classes_per_client=2-clients_per_round=4"."""
    return "-".join(p for p in variant.split("-") if "=" not in p) or variant


class _Names:
    """The names by which the prose picks variants of a section's folders: a method ("FSL", "FSL-500"), a part of
    one where no method has that name ("FedAvg" for "signflip-FedAvg"), and a sweep cell ("fraction=0.4", which
    ``ALIASES`` reads from "f = 0.4")."""

    def __init__(self, tables: list[Values]):
        self.tables = tables
        self.methods = {_method(v) for t in tables for v in t.variants}
        parts: set[str] = set(self.methods)
        for m in self.methods:
            bits = m.split("-")
            parts |= {"-".join(bits[a:b]) for a in range(len(bits)) for b in range(a + 1, len(bits) + 1)}
        parts -= WORDS_NOT_NAMES
        cells = {p for t in tables for v in t.variants for p in v.split("-") if "=" in p}
        self.names = sorted(parts | cells, key=len, reverse=True)

    def _picks(self, n: str, variant: str) -> bool:
        if "=" in n:
            return n in variant.split("-")
        m = _method(variant)
        return m == n or (n not in self.methods and f"-{n}-" in f"-{m}-")

    def pick(self, text: str) -> list[tuple[int, str]]:
        """The (folder, variant) pairs ``text`` names: the variants the most of its method names agree on ("sign
        flip" and "FedAvg": signflip-FedAvg-...), kept to the sweep cells it names, if any variant has them."""
        text = _aliased(text)
        found = [n for n in self.names if re.search(r"(?<![\w+=-])" + re.escape(n) + r"(?![\w+-])", text)]
        votes: dict[tuple[int, str], int] = {}
        seen: set[frozenset] = set()  # two names of the same variants ("D0" and "D0-only") are one vote
        for n in (n for n in found if "=" not in n):
            picked = frozenset((i, v) for i, t in enumerate(self.tables) for v in t.variants if self._picks(n, v))
            if picked not in seen:
                seen.add(picked)
                for k in picked:
                    votes[k] = votes.get(k, 0) + 1
        if not votes:
            return []
        most = max(votes.values())
        chosen = [k for k, c in votes.items() if c == most]
        named: dict[str, set[str]] = {}  # each swept setting's cells named ("ε = 1 ... ε = 4": two of one key)
        for n in (n for n in found if "=" in n):
            named.setdefault(n.split("=")[0], set()).add(n)
        for key, cells in named.items():  # a variant swept on that key must be in one of its cells named
            narrower = [k for k in chosen if not any(p.startswith(key + "=") for p in k[1].split("-"))
                        or cells & set(k[1].split("-"))]
            chosen = narrower if any(cells & set(k[1].split("-")) for k in narrower) else chosen
        return chosen


def _pool(tables: list[Values], chosen: list[tuple[int, str]], rounds: set[int], cache: dict) -> list[float]:
    out: list[float] = []
    for i, t in enumerate(tables):
        mine = {v for (j, v) in chosen if j == i} if chosen else set(t.variants)
        for v in mine:
            out += t.variants[v]
            if rounds:
                out += _round_values(t.runs.get(v, []), rounds, cache)
        if len(mine) > 1:
            out += [x for pair, xs in t.pairs.items() if pair <= mine for x in xs]
        out += t.folder
        for j, u in enumerate(tables[i + 1:], i + 1):  # two named variants in two folders of the section (the
            theirs = {v for (k, v) in chosen if k == j} if chosen else set(u.means)  # same at two budgets, say)
            for v in mine & set(t.means):
                for w in (theirs | (mine & {v})) & set(u.means):
                    out += [a - u.means[w][m] for m, a in t.means[v].items() if m in u.means[w]]
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def plain(text: str) -> list[str]:
    """'line N: ...' for each plain decimal of ``text``'s prose that is no value of the variants it names, and each
    count of runs, trials or seeds that is no count of its section's folders.

    Which variants a number may be a value of: in a table, those its row's first cell and its column's header
    name (where they meet); else those its line names, else those its paragraph names, else every variant of
    the section's folders. A variant's values are ``variant_values``'s, the differences and SEs of pairs of the
    variants named, and, where the line says "round N" / "N rounds", each number of their metrics.csv at round N."""
    problems = []
    cache: dict[Path, Values] = {}
    rows_cache: dict = {}
    for start, lines in sections(without_blocks(text)):
        for f in _folders(lines):
            if f not in cache:
                cache[f] = variant_values(f)
        tables = [cache[f] for f in _folders(lines)]
        ps = [p for f in _folders(lines) for p in computed_cached(f).ps]
        names = _Names(tables)
        paragraph = _paragraphs(lines)
        header: list[str] = []
        for n, line in enumerate(lines, start):
            if re.match(r" {4,}", line):  # code
                continue
            if line.startswith("|"):
                if re.match(r"\|[-| :]+\|?$", line.strip()):
                    continue
                if n - start + 1 < len(lines) and re.match(r"\|[-| :]+\|?$", lines[n - start + 1].strip()):
                    header = _cells(line)
                    continue
                cells = _cells(line)
                for k, cell in enumerate(cells):
                    col = header[k] if k < len(header) else ""
                    if any(w in col or w in cells[0] for w in QUOTED):  # a column or row of quoted numbers
                        continue
                    chosen = names.pick(f"{cells[0]} {col}") if k else []
                    chosen = chosen or names.pick(line) or names.pick(paragraph[n - start])
                    problems += _check_numbers(n, cell, f"{col} {line}", tables, chosen, names.pick(line), ps,
                                               rows_cache)  # the column's header may say which rounds
            else:
                header = []
                wider = names.pick(paragraph[n - start])
                chosen = names.pick(line) or wider
                before = lines[n - start - 1] if n > start and paragraph[n - start - 1] else ""
                held = re.search(r"\bHolm:?$", before.rstrip(" ("))  # "Holm" at a line's end: its p on this one
                text = f"Holm {line.lstrip()}" if held and re.match(r" *\(?\d\.\d", line) else line
                problems += _check_numbers(n, text, paragraph[n - start], tables, chosen, wider, ps, rows_cache)
    return problems


def _check_numbers(n: int, text: str, context: str, tables: list[Values], chosen: list[tuple[int, str]],
                   wider: list[tuple[int, str]], ps: list[float], cache: dict) -> list[str]:
    """The problems of the plain numbers and counts of ``text`` (line ``n``; ``context``, its paragraph, says which
    rounds): each decimal a value of the ``chosen`` variants, else of the ``wider`` ones (its paragraph's too)."""
    problems = []
    rest = PAPER.sub(" ", text)
    for m in P_LIST.finditer(rest):  # "p = 0.223, 0.078 and 0.458": the rest of the list are p-values too
        for x in re.findall(r"\d+\.\d+", m.group(2)):
            if not any(_near(y, x) for y in ps):
                problems.append(f"line {n}: '{x}' in a list of p-values is no p-value of the section's folders")
    rest = P_LIST.sub(" ", rest)
    for m in re.finditer(r"\bHolm:? \(?(\d\.\d+)", rest):  # Holm's adjusted p: one of the section's p-values
        if not any(_near(y, m.group(1)) for y in ps):
            problems.append(f"line {n}: 'Holm {m.group(1)}' is no p-value of the section's folders")
    rest = re.sub(r"\bHolm:? \(?\d\.\d+", " ", P_VALUE.sub(" ", PLUS_MINUS.sub(" ", rest)))
    for m in SCIENTIFIC.finditer(rest):  # "1.62·10^-5": a value's mantissa at its power of ten
        mantissa, power = m.group(1), int(m.group(2).replace("−", "-"))
        pool = _pool(tables, sorted(set(chosen) | set(wider)), set(), cache)
        if not any(_near(abs(x) / 10 ** power, mantissa) for x in pool):
            problems.append(f"line {n}: '{m.group(0)}' is no value of the named variants in the section's folders")
    rest = SCIENTIFIC.sub(" ", rest)
    for m in ARITHMETIC.finditer(rest):  # "0.999^300 = 0.74": the result of the sum it writes out
        a, op, b, result = m.groups()
        if not _near(_OPS[op](float(a), float(b)), result):
            problems.append(f"line {n}: '{m.group(0)}' does not compute")
    rest = ARITHMETIC.sub(" ", rest)
    what = ", ".join(sorted({v for _, v in chosen})[:4]) + (" ..." if len(chosen) > 4 else "") if chosen \
        else "any variant of the section"
    numbers = DECIMAL.findall(rest)
    if numbers:
        rounds = {int(r) for a, b in ROUND.findall(_aliased(context)) for r in re.findall(r"\d+", a or b)}
        pool = _pool(tables, chosen, rounds, cache)
        more: list[float] | None = None
        for sign, num in numbers:
            if any(_reads(x, sign, num) for x in pool):
                continue
            if more is None:
                more = _pool(tables, sorted(set(chosen) | set(wider)), rounds, cache) if chosen and wider else []
            if not any(_reads(x, sign, num) for x in more):
                problems.append(f"line {n}: '{sign}{num}' is no value of {what} in the section's folders "
                                f"({', '.join(t.name for t in tables) or 'none'})")
    for count, said, noun in _stated_counts(rest) if tables else []:  # a section naming no folder has no runs
        any_, shared = _counts(tables, chosen, noun)
        if count not in (shared if said == "each" else any_):
            problems.append(f"line {n}: '{count}' {'in each' if said == 'each' else 'is no count'} of runs, trials "
                            f"or seeds {'is not shared by' if said == 'each' else 'of'} {what}")
    return problems


def _stated_counts(text: str) -> list[tuple[int, str, str]]:
    """(count, "each" or "", noun) of each count of runs, trials or seeds ``text`` states: "24 trials" -> (24, "",
    "trial"), "two of each method's six trials" -> (2, "each", "trial"), (6, "each", "trial"). One ("one seed of
    the three") is no count worth checking, nor is a bound ("at least 2 seeds")."""
    found: list[tuple[int, int, str, str]] = []  # (where, count, "each" or "", noun)
    for m in COUNT_OF.finditer(text):
        each = "each" if re.search(r"\b(?:each|every)\b", m.group(2)) else ""
        noun = m.group(4).lower().rstrip("s")
        found.append((m.start(1), _number(m.group(1)), each, noun))
        if m.group(3):
            found.append((m.start(3), _number(m.group(3)), each, noun))
    covered = [m.span() for m in COUNT_OF.finditer(text)]
    for m in COUNT.finditer(text):
        if not any(a <= m.start() < b for a, b in covered):
            found.append((m.start(1), _number(m.group(1)), "", m.group(2).lower().rstrip("s")))
    bounds = {m.start(1) for m in re.finditer(rf"(?:at least|at most|[≤≥<>]) ?{_NUM}", text)}
    return [(n, each, noun) for where, n, each, noun in found if n != 1 and where not in bounds]


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


# Pages whose plain numbers are not yet all accounted for (each still quotes numbers of runs no longer kept, per-round
# values or cross-page numbers that the checker cannot derive): ``check_record`` skips ``plain`` on them only; their
# "A ± B" and p-values are checked like every page's. `python reproduction/prose.py --plain` lists what is left.
NOT_YET = {"appendix-diagnostics.md", "appendix-no-pretrain.md", "emnist-reduced.md",
           "fig3-cifar10.md"}


def problems(text: str) -> list[str]:
    """Everything the record's test enforces on a page: ``check`` (± and p, stale sentences) and ``plain``."""
    return check(text) + plain(text)


def check_record() -> list[str]:
    """``check`` of every document of the record, and ``plain`` of each but the pages of ``NOT_YET``, each problem
    prefixed with its file."""
    out = []
    for p in documents():
        text = p.read_text()
        found = problems(text) if p.name not in NOT_YET else check(text)
        out += [f"{p.relative_to(HERE.parent)}: {problem}" for problem in found]
    return out


if __name__ == "__main__":
    if "--plain" in sys.argv:  # every page's, those of NOT_YET too
        listed = [f"{p.relative_to(HERE.parent)}: {x}" for p in documents() for x in plain(p.read_text())]
        print("\n".join(listed) + f"\n{len(listed)} plain numbers or counts not accounted for")
        sys.exit(1 if listed else 0)
    found = check_record()
    print("\n".join(found) if found else "ok")
    sys.exit(1 if found else 0)
