"""The robustness table: final accuracy per defence against the malicious fraction f, for each attack.

    python reproduction/robustness_table.py reproduction/robustness-emnist

reads FOLDER/index.csv (robustness-emnist's runs: variant ATTACK-DEFENCE-fraction=F, seed, status, final accuracy)
and prints a Markdown table: one row per defence, for each attack one column per f, each cell the mean ± sample
std over the seeds (n − 1), with "(k div.)" when k seeds diverged (their accuracy is then the last one measured,
counted in the mean as it is; one that diverged before any accuracy was measured has none, and a cell of only
such runs is "diverged (k)"). Label flipping runs at f > 0 only: at f = 0 nobody attacks, so its f = 0 column is
sign flipping's runs (the same numbers bit for bit: tests/test_attacks.py). A cell whose runs have not finished
is "…". A defence gets a row, and an attack columns, only where the folder has runs of it (finished or not): the
bucketed rules (median-b2, Krum-b2: robust.bucket = 2) have a group of their own.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from fedsl.sweeps.compare import FINISHED

ATTACKS = {"signflip": "sign flip", "labelflip": "label flip"}
DEFENCES = ["FedAvg", "FSL", "median", "median-b2", "trimmed", "Krum", "Krum-b2", "FLTrust", "FLTrust+SL"]
FRACTIONS = [0.0, 0.1, 0.2, 0.4]


def read(folder: Path) -> tuple[dict[tuple[str, str, float], list[tuple[float, bool]]], set[tuple[str, str]]]:
    """(attack, defence, f) -> [(final accuracy, diverged)] over the finished seeds; and the (attack, defence)
    pairs the folder has runs of, finished or not."""
    cells: dict[tuple[str, str, float], list[tuple[float, bool]]] = {}
    seen: set[tuple[str, str]] = set()
    with open(folder / "index.csv", newline="") as f:
        for row in csv.DictReader(f):
            attack, _, defence = row["variant"].rsplit("-fraction=", 1)[0].partition("-")
            seen.add((attack, defence))
            if row["status"] not in FINISHED:
                continue
            key = (attack, defence, float(row["attack.fraction"]))
            cells.setdefault(key, []).append((float(row["final_accuracy"]), row["status"] == "diverged"))
    for defence in DEFENCES:  # label flipping at f = 0 is sign flipping at f = 0: nobody attacks
        if ("signflip", defence, 0.0) in cells:
            cells.setdefault(("labelflip", defence, 0.0), cells[("signflip", defence, 0.0)])
    return cells, seen


def cell(values: list[tuple[float, bool]] | None) -> str:
    if not values:
        return "…"
    diverged = sum(d for _, d in values)
    acc = np.array([a for a, _ in values if np.isfinite(a)])  # a run that diverged before any score has none
    if not len(acc):
        return f"diverged ({diverged})"
    text = f"{acc.mean():.3f} ± {acc.std(ddof=1):.3f}" if len(acc) > 1 else f"{acc[0]:.3f} (1 seed)"
    return text + (f" ({diverged} div.)" if diverged else "")


def table(folder: Path) -> str:
    cells, seen = read(folder)
    seen_attacks, seen_defences = {a for a, _ in seen}, {d for _, d in seen}
    attacks = [a for a in ATTACKS if a in seen_attacks]
    defences = [d for d in DEFENCES if d in seen_defences]
    head = ["defence"] + [f"{ATTACKS[a]}, f = {f:g}" for a in attacks for f in FRACTIONS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for defence in defences:
        row = [defence] + [cell(cells.get((a, defence, f))) for a in attacks for f in FRACTIONS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    print(table(Path(sys.argv[1])))
