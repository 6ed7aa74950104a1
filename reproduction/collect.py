"""Copy a run group's text results into reproduction/: what `fedsl report` and the verdicts need, nothing else.

    python reproduction/collect.py RUNS/GROUP reproduction/NAME

Keeps group.json, each finished run's metrics.csv and summary.json (small text; no checkpoint,
no data) and writes index.csv, so that every curve can be re-drawn and every number of
REPRODUCTION.md re-computed (`fedsl report reproduction/NAME`, tests/test_reproduction.py).
Runs still going are left out; run it again as more finish.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from fedsl.report.tables import write_index
from fedsl.sweeps.compare import FINISHED, group_runs


def collect(src: Path, dest: Path) -> list[str]:
    """Copy the finished runs of group ``src`` into ``dest``; returns their names."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "group.json", dest / "group.json")
    done = []
    for name, rd in group_runs(src).items():
        if rd.read_summary().get("status") not in FINISHED:
            continue
        out = dest / rd.path.name
        out.mkdir(exist_ok=True)
        for f in ("metrics.csv", "summary.json"):
            shutil.copy2(rd.path / f, out / f)
        done.append(name)
    write_index(dest)  # runs not copied show as 'pending'
    return done


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    names = collect(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{len(names)} finished runs copied: {', '.join(names)}")
