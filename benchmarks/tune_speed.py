"""Trials per hour of one tuning study: one trial at a time, stacked, or in two processes, as a user runs them.

    FEDSL_DATA_DIR=../shared/data python benchmarks/tune_speed.py [--reps 2] [--only logreg,lstm,cnn]

Each mode is a whole `fedsl tune` command (a new process: imports, data, Optuna, every trial's run folder), of one
variant (FSL) of a preset: the same 4 trials in every mode (a grid over η_l, `tune.sampler = 'grid'`), of a few
rounds, pruning off and no widening, so that every mode runs the same work:

    sequential       tune.stack = 1, one process (the CPU default)
    stacked          tune.stack = TRIALS (all asked at once, run as one stacked computation), executor as the
                     model's CPU default (sequential), and again with the vectorised executor
    --parallel 2     two processes of one torch thread each, sharing the study
    hyperband        (logreg only) TPE over the default space with a budget of 4 trials' rounds run and
                     tune.pruner = 'hyperband', two processes: trials per hour of a multi-fidelity study (many
                     trials stopped at rounds/9 or rounds/3; its trials are TPE's, not the grid's)

The modes alternate within each repetition (sequential, stacked, ..., then again), so that a change of the
machine's load reaches all alike. Peak memory is the largest resident set of the command's process tree, polled
every 0.2 s. Prints a Markdown table: median wall time, trials per hour and the ratio to the sequential mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# model -> (preset, rounds per trial, the 4 step sizes η_l its trials run: a grid, the same in every mode)
WORKLOADS = {
    "logreg": ("cross-device-tuned", 40, [0.005, 0.01, 0.02, 0.04]),
    "lstm": ("shakespeare-tuned", 4, [0.5, 1.0, 1.5, 2.0]),
    "cnn": ("serverdata-cifar10-tuned", 4, [0.01, 0.02, 0.03, 0.05]),
}
COMMON = ["tune.pruner='none'", "tune.edge_widenings=0", "threads=1", "eval_every=2", "eval_final_window=false",
          "tune.sampler='grid'"]


def modes(model: str, trials: int, rounds: int) -> dict[str, list[str]]:
    """Mode -> the extra arguments of its `fedsl tune` command."""
    out = {"sequential": ["--set", "tune.stack=1"],
           "stacked": ["--set", f"tune.stack={trials}"],
           "stacked, vectorised": ["--set", f"tune.stack={trials}", "--set", "executor='vectorised'"],
           "--parallel 2": ["--set", "tune.stack=1", "--parallel", "2"]}
    if model == "logreg":  # TPE over the default space: Hyperband's budget holds more trials than the grid
        out["hyperband, --parallel 2"] = ["--set", "tune.stack=1", "--set", "tune.pruner='hyperband'",
                                          "--set", "tune.sampler='tpe'", "--set", "tune.space={}",
                                          "--set", f"tune.budget_rounds={trials * rounds}", "--parallel", "2"]
    return out


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def one(preset: str, lrs: list[float], rounds: int, extra: list[str], folder: Path) -> tuple[float, int, int]:
    """(wall seconds, peak bytes, trials finished) of one `fedsl tune` command."""
    grid = f"tune.space={{\"algorithm.local_lr\"={lrs}}}"
    sets = [a for s in [f"tune.trials={len(lrs)}", f"tune.rounds={rounds}", *COMMON, grid] for a in ("--set", s)]
    cmd = [sys.executable, "-m", "fedsl.cli", "tune", "--preset", preset, "--variants", "FSL", *sets, *extra,
           "--quiet", "--out", str(folder)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read()[-2000:]}")
    best = json.loads((folder / "best.json").read_text())[0]
    return wall, peak, best["complete"] + best["pruned"] + best["failed"]


def _warn_if_not_compiled() -> None:
    """Each mode is a new process: without byte-compiled modules (PYTHONDONTWRITEBYTECODE set and an install made
    without compiling) every process compiles its imports again, seconds that a user's pip install does not pay."""
    import importlib.util

    import torch

    import fedsl
    missing = [m.__name__ for m in (fedsl, torch) if not Path(importlib.util.cache_from_source(m.__file__)).exists()]
    if missing and os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print(f"warning: {', '.join(missing)} not byte-compiled and PYTHONDONTWRITEBYTECODE is set: every process "
              "compiles its imports again (python -m compileall -q src .venv/lib first)", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every trial's rounds (a dry run: 0.2)")
    a = ap.parse_args()
    _warn_if_not_compiled()
    rows = []
    for model in a.only.split(","):
        preset, rounds, lrs = WORKLOADS[model]
        trials = len(lrs)
        rounds = max(2, int(rounds * a.scale))
        ms = modes(model, trials, rounds)
        times: dict[str, list[tuple[float, int, int]]] = {m: [] for m in ms}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(a.reps):
                for i, (m, extra) in enumerate(ms.items()):
                    r = one(preset, lrs, rounds, extra, Path(tmp) / f"{model}-{rep}-{i}")
                    times[m].append(r)
                    print(f"{model} rep {rep} {m}: {r[0]:.1f} s, {r[1] / 2**30:.2f} GiB, {r[2]} trials",
                          file=sys.stderr, flush=True)
        base = statistics.median(t for t, _, n in times["sequential"]) / trials
        for m, rs in times.items():
            per = statistics.median(t / n for t, _, n in rs)
            rows.append((model, preset, rounds, m, statistics.median(t for t, _, _ in rs), rs[0][2],
                         3600 / per, base / per, max(p for _, p, _ in rs) / 2**30))
    print(f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} ({os.cpu_count()} cores), load average "
          f"{os.getloadavg()[0]:.1f} at the end; {a.reps} interleaved repetitions, medians.\n")
    print("| model | preset (FSL) | rounds a trial | mode | wall (s) | trials | trials per hour | vs sequential "
          "| peak memory (GiB) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for model, preset, rounds, m, wall, n, tph, ratio, peak in rows:
        print(f"| {model} | {preset} | {rounds} | {m} | {wall:.1f} | {n} | {tph:,.0f} | {ratio:.2f}x | {peak:.2f} |")


if __name__ == "__main__":
    main()
