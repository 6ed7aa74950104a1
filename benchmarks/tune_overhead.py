"""What a tuning study costs beyond its trials' training: `fedsl tune`'s bookkeeping (Optuna's SQLite storage,
TPE's draws, pruning reports, each trial's run folder and data build) against the trials' own run time.

    python benchmarks/tune_overhead.py [--trials 8] [--rounds 20] [--reps 3]

Each repetition runs one study of the quickstart's FSL variant, in-process and one trial after another, at
threads = 1, and reads each trial's own wall time (the run's summary.json: its rounds and evaluations). The
difference is what tuning adds. Repetitions alternate with a plain loop over the same trial configs run by
`runner.run` (no Optuna), so that a change of the machine's load reaches both alike. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def study(trials: int, rounds: int, folder: Path) -> tuple[float, float, list[dict]]:
    """(the study's wall time, its trials' run time, the trials' configs)."""
    from fedsl import tune as T
    from fedsl.config import loading, presets

    cfg = loading.load(base=presets.load("quickstart"), variants=["FSL"],
                       overrides=[f"tune.trials={trials}", f"rounds={rounds}", "threads=1", "tune.prune=false"])
    cfg = cfg.model_copy(update={"variants": {"FSL": cfg.variants["FSL"]}})
    t0 = time.perf_counter()
    T.start(cfg, folder, log=lambda s: None).run()
    wall = time.perf_counter() - t0
    runs = sorted((folder / "FSL").iterdir())
    trained = sum(json.loads((r / "summary.json").read_text())["wall_time"] for r in runs)
    return wall, trained, [json.loads((r / "config.json").read_text()) for r in runs]


def plain(configs: list[dict], folder: Path) -> float:
    """The same trial configs, each run by ``runner.run`` alone: the wall time of the loop."""
    from fedsl.config.schema import validate
    from fedsl.runs.runner import run

    t0 = time.perf_counter()
    for i, c in enumerate(configs):
        run(validate(c), folder / f"run-{i}", log=lambda s: None, progress=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    rows = []
    for rep in range(a.reps):
        with tempfile.TemporaryDirectory() as tmp:
            wall, trained, configs = study(a.trials, a.rounds, Path(tmp) / "study")
            loop = plain(configs, Path(tmp) / "plain")
        rows.append((wall, trained, loop))
        print(f"rep {rep + 1}: study {wall:.2f} s (trials' runs {trained:.2f} s), plain loop {loop:.2f} s",
              file=sys.stderr)
    med = [statistics.median(r[i] for r in rows) for i in range(3)]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load:.1f} at the end; "
          f"quickstart's FSL, {a.trials} trials x {a.rounds} rounds, threads = 1, medians of {a.reps} "
          "alternating repetitions\n")
    print("| | wall (s) | per trial (s) | vs the plain loop |")
    print("|---|---:|---:|---:|")
    print(f"| `fedsl tune` study | {med[0]:.2f} | {med[0] / a.trials:.3f} | {med[0] / med[2]:.2f}x |")
    print(f"| its trials' runs (summary.json wall_time) | {med[1]:.2f} | {med[1] / a.trials:.3f} | |")
    print(f"| the same configs, `runner.run` one by one | {med[2]:.2f} | {med[2] / a.trials:.3f} | 1.00x |")
    print(f"| tuning's own cost (study − its runs) | {med[0] - med[1]:.2f} | {(med[0] - med[1]) / a.trials:.3f} | |")


if __name__ == "__main__":
    main()
