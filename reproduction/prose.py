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

Plain numbers and counting words (``plain``, reproduction/prose_plain.py, whose docstring gives their rules): every
other decimal written to two places or more must be a value of the variants its line names
(reproduction/prose_values.py), a sum written out, a value at a round the line names, or a number marked as quoted
from a paper or an independent implementation; a count of runs, trials or seeds a count of the section's folders.
What both checks share (documents, sections, what a folder computes for "±" and "p") is reproduction/prose_base.py.

Enforced on REPRODUCTION.md and every page except ``NOT_YET`` (none now), for pages whose prose would still quote
numbers that no committed file gives while their folders are re-run. `python reproduction/prose.py --plain` lists
what each page would still have.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # its sibling modules, however this file is loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from prose_base import (  # noqa: E402
    DOC,
    HERE,
    P_VALUE,
    PAGES,
    PLUS_MINUS,
    THRESHOLD,
    Computed,
    _folders,
    _near,
    _reads,
    computed,
    computed_cached,
    documents,
    sections,
    without_blocks,
)
from prose_plain import ALIASES, PAPER, QUOTED, plain  # noqa: E402
from prose_values import Values, variant_values  # noqa: E402

__all__ = ["ALIASES", "DOC", "HERE", "NOT_YET", "PAGES", "PAPER", "QUOTED", "Computed", "Values", "check",
           "check_record", "computed", "computed_cached", "documents", "plain", "problems", "sections", "stale",
           "variant_values", "without_blocks"]

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



# Pages whose plain numbers are not yet all accounted for (each still quotes numbers of runs no longer kept, per-round
# values or cross-page numbers that the checker cannot derive): ``check_record`` skips ``plain`` on them only; their
# "A ± B" and p-values are checked like every page's. `python reproduction/prose.py --plain` lists what is left.
NOT_YET: set[str] = set()


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
