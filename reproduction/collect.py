"""Copy a run group's text results into reproduction/: what `fedsl report` and the verdicts need, nothing else.

    python reproduction/collect.py RUNS/GROUP reproduction/NAME

Keeps group.json, each finished run's metrics.csv and summary.json (small text; no checkpoint,
no data) and writes index.csv, so that every curve can be re-drawn and every number of
REPRODUCTION.md re-computed (`fedsl report reproduction/NAME`, tests/test_reproduction.py).
Runs still going are left out; run it again as more finish.

A `fedsl run --tuned` group's studies (GROUP/tune) come along: their text files (tune.json, best.json, trials.png,
each trial's config.json, metrics.csv and summary.json; no checkpoint) and a consistent copy of study.db taken
through SQLite's backup, so a study still running can be copied without pausing it. A group still in its
studies (no group.json yet) gives only its tune/: the snapshot of work in progress.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

from fedsl.report.tables import write_index
from fedsl.sweeps.compare import FINISHED, group_runs

# what a study folder keeps of each trial and of itself: text and figures, never a checkpoint
STUDY_FILES = {".json", ".csv", ".png", ".journal"}


def collect_studies(src: Path, dest: Path) -> int:
    """Copy the studies folder ``src`` (a `fedsl tune` output) into ``dest``; returns the number of files."""
    count = 0
    for f in sorted(src.rglob("*")):
        if not f.is_file():
            continue
        out = dest / f.relative_to(src)
        if f.suffix in STUDY_FILES:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, out)
        elif f.suffix == ".db":  # a writer may be mid-transaction: the backup API copies a consistent state
            out.parent.mkdir(parents=True, exist_ok=True)
            out.unlink(missing_ok=True)
            live, copy = sqlite3.connect(f"file:{f}?mode=ro", uri=True), sqlite3.connect(out)
            try:
                live.backup(copy)
            finally:
                live.close()
                copy.close()
        else:
            continue
        count += 1
    return count


def collect(src: Path, dest: Path) -> list[str]:
    """Copy the finished runs of group ``src`` into ``dest`` (and its studies, ``src/tune``); returns their
    names."""
    dest.mkdir(parents=True, exist_ok=True)
    if (src / "tune").is_dir():
        collect_studies(src / "tune", dest / "tune")
    if not (src / "group.json").is_file():  # still in its studies: only they are copied
        return []
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
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    if not (src / "group.json").is_file() and not (src / "tune").is_dir():
        sys.exit(f"{src}: expected a run group's folder (group.json) or a `fedsl run --tuned` folder (tune/)")
    names = collect(src, dest)
    studies = " and its studies (tune/)" if (src / "tune").is_dir() else ""
    print(f"{len(names)} finished runs copied{studies}: {', '.join(names) or 'none yet'}")
