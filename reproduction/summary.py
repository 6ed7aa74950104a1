"""REPRODUCTION.md's summary table and the record's other computed blocks, from the folders in reproduction/
(fedsl.report.summary).

    python reproduction/summary.py            # print the tables
    python reproduction/summary.py --write    # put each between its markers (REPRODUCTION.md or an experiment's page)
    python reproduction/summary.py --check    # exit 1 if the record holds anything else

The Fig. 5 block reads reproduction/fig5-cifar10-full as the paper's heat maps (fedsl.report.grid).
"""

from __future__ import annotations

import csv
import sys
import tomllib
from pathlib import Path

from fedsl.report import grid
from fedsl.report.summary import claims_markdown, cost_markdown, paper_markdown, summary_markdown

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "REPRODUCTION.md"
PAGES = HERE / "pages"  # one page per experiment (Table 1's and Fig. 5's hold their computed blocks)
BEGIN = "<!-- summary: computed by `python reproduction/summary.py --write` from reproduction/; do not edit -->"
END = "<!-- end of summary -->"
COST_BEGIN = "<!-- cost: computed by `python reproduction/summary.py --write` from reproduction/; do not edit -->"
COST_END = "<!-- end of cost -->"
TABLE1_BEGIN = ("<!-- table1: computed by `python reproduction/summary.py --write` from "
                "reproduction/table1-cifar10-full; do not edit -->")
TABLE1_END = "<!-- end of table1 -->"
FIG5 = "fig5-cifar10-full"
FIG5_EASY = ("FSL", "FSLsyn")  # the paper: "it is fairly easy to select learning rates for FSL and FSLsyn"
FIG5_BEGIN = (f"<!-- fig5: computed by `python reproduction/summary.py --write` from reproduction/{FIG5}; "
              "do not edit -->")
FIG5_END = "<!-- end of fig5 -->"
CLAIMS_BEGIN = ("<!-- table1-claims: computed by `python reproduction/summary.py --write` from "
                "reproduction/table1-cifar10-full; do not edit -->")
CLAIMS_END = "<!-- end of table1-claims -->"
DIAG = "appendix-diagnostics-new-cpu"
DIAG_BEGIN = (f"<!-- diagnostics: computed by `python reproduction/summary.py --write` from reproduction/{DIAG}; "
              "do not edit -->")
DIAG_END = "<!-- end of diagnostics -->"
BLOCKS = ((BEGIN, END), (COST_BEGIN, COST_END), (TABLE1_BEGIN, TABLE1_END), (FIG5_BEGIN, FIG5_END),
          (CLAIMS_BEGIN, CLAIMS_END), (DIAG_BEGIN, DIAG_END))


def _number(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def diagnostics_markdown(folder: Path, first: int = 5) -> str:
    """The appendix's diagnostics per run (C, n0) from its metrics.csv: the means of ξ_t² and G_t² over the measured
    rounds from ``first`` on (round 0 is the pretrained model), their ratio, and the smallest cos(∇F, ∇f0)."""
    with open(folder / "index.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    runs.sort(key=lambda r: (int(r["data.classes_per_client"]), int(r["data.server_size"])))
    lines = [f"| C | n0 | mean ξ² (rounds {first}+) | mean G² | ξ²/G² | smallest cos(∇F, ∇f0) |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        with open(folder / r["run"] / "metrics.csv", newline="") as f:
            rows = [m for m in csv.DictReader(f) if m["xi2"] and int(m["round"]) >= first]
        xi2 = sum(float(m["xi2"]) for m in rows) / len(rows)
        g2 = sum(float(m["G2"]) for m in rows) / len(rows)
        cos = min(float(m["cos_F_f0"]) for m in rows)
        lines.append(f"| {r['data.classes_per_client']} | {r['data.server_size']} | {_number(xi2)} | {_number(g2)} | "
                     f"{xi2 / g2:.3f} | {cos:.2f} |")
    return "\n".join(lines) + "\n"


def tables() -> list[str]:
    """The summary table, the cost table, Table 1 and Fig. 5 at full scale, Table 1's claims judged and the
    appendix's diagnostics, as the record holds them."""
    entries = tomllib.loads((HERE / "summary.toml").read_text())["row"]
    return [summary_markdown(HERE, entries), cost_markdown(HERE, entries),
            paper_markdown(HERE / "table1-cifar10-full"), grid.markdown(HERE / FIG5, easy=FIG5_EASY),
            claims_markdown(HERE / "table1-cifar10-full"), diagnostics_markdown(HERE / DIAG)]


def table() -> str:
    return tables()[0]


def documents() -> list[Path]:
    """The record: REPRODUCTION.md, then each experiment's page."""
    return [DOC, *sorted(PAGES.glob("*.md"))]


def record() -> str:
    """The record's documents as one text (each block's markers appear once in it)."""
    return "\n".join(p.read_text() for p in documents())


def in_doc(text: str, block: int = 0) -> str:
    """The block between a pair of markers in the record's text (0: summary, 1: cost, 2: Table 1, 3: Fig. 5,
    4: Table 1's claims, 5: the appendix's diagnostics)."""
    begin, end = BLOCKS[block]
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[start:stop].strip("\n") + "\n"


def main(argv: list[str]) -> int:
    ts = tables()
    if "--write" in argv:
        for (begin, end), t in zip(BLOCKS, ts):
            doc = next(p for p in documents() if begin in p.read_text())
            text = doc.read_text()
            start, stop = text.index(begin) + len(begin), text.index(end)
            doc.write_text(text[:start] + "\n" + t + text[stop:])
    elif "--check" in argv:
        if [in_doc(record(), i) for i in range(len(BLOCKS))] != ts:
            print("the record's computed tables differ from what reproduction/ computes: "
                  "run python reproduction/summary.py --write", file=sys.stderr)
            return 1
    else:
        print("\n".join(ts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
