"""The plain numbers and counting words of the record's prose (``plain``), checked against what the folders of their
section give (reproduction/prose_values.py).

Every decimal written to two places or more that is not part of an "A ± B" or a "p = X" (reproduction/prose.py checks
those) must be, to the decimals written:
- a value of the variants it names (``prose_values.variant_values``: results, their means, sample stds and
  differences, settings, choices; its docstring lists them), or a difference of two named variants' means in two
  of the section's folders;
- a list of p-values continuing a "p = " ("p = 0.223, 0.078 and 0.458") or a Holm p: p-values of the section's
  folders; a "Holm" at a line's end takes the p that starts the next;
- the result of a sum the prose writes out ("0.999^300 = 0.74", "10 × 50 = 500"), computed; a value written in
  powers of ten ("1.62·10^-5") is its mantissa at that power;
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
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
from prose_base import (
    NUMBER,
    P_VALUE,
    PLUS_MINUS,
    _cells,
    _folders,
    _near,
    _reads,
    computed_cached,
    sections,
    without_blocks,
)
from prose_values import Values, _method, variant_values

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
