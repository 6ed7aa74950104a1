"""REPRODUCTION.md's summary table and the record's other computed blocks, from the folders in reproduction/
(fedsl.report.summary).

    python reproduction/summary.py            # print the tables
    python reproduction/summary.py --write    # put each between its markers (REPRODUCTION.md or an experiment's page)
    python reproduction/summary.py --check    # exit 1 if the record holds anything else

The Fig. 5 block reads reproduction/fig5-cifar10-full as the paper's heat maps (fedsl.report.grid).
"""

from __future__ import annotations

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
BLOCKS = ((BEGIN, END), (COST_BEGIN, COST_END), (TABLE1_BEGIN, TABLE1_END), (FIG5_BEGIN, FIG5_END),
          (CLAIMS_BEGIN, CLAIMS_END))


def tables() -> list[str]:
    """The summary table, the cost table, Table 1 and Fig. 5 at full scale, and Table 1's claims judged, as
    REPRODUCTION.md holds them."""
    entries = tomllib.loads((HERE / "summary.toml").read_text())["row"]
    return [summary_markdown(HERE, entries), cost_markdown(HERE, entries),
            paper_markdown(HERE / "table1-cifar10-full"), grid.markdown(HERE / FIG5, easy=FIG5_EASY),
            claims_markdown(HERE / "table1-cifar10-full")]


def table() -> str:
    return tables()[0]


def documents() -> list[Path]:
    """The record: REPRODUCTION.md, then each experiment's page."""
    return [DOC, *sorted(PAGES.glob("*.md"))]


def record() -> str:
    """The record's documents as one text (each block's markers appear once in it)."""
    return "\n".join(p.read_text() for p in documents())


def in_doc(text: str, block: int = 0) -> str:
    """The block between a pair of markers in REPRODUCTION.md's text (0: summary, 1: cost, 2: Table 1, 3: Fig. 5,
    4: Table 1's claims)."""
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
