"""Every core busy, and no collapse on a shared machine (issue 15): prints a Markdown table.

1. sweep throughput: the quickstart's FSL over 4 seeds, `fedsl run` one run after another
   (threads automatic) vs `--parallel 2` (two worker processes, one torch thread each).
   Target on a 2-core CPU: >= 1.8x.
2. fair share: one quickstart copy alone vs 4 copies started together (separate processes),
   with the automatic thread count and with threads = torch's default (2 here: fedsl's
   behaviour before issue 15). Target: 4 copies cost <= ~4x one copy's wall time.

Wall times include each command's start-up (Python, torch, data), as a user sees them.

    python benchmarks/bench_parallel.py --rounds 40          # ~5 minutes on 2 cores
    python benchmarks/bench_parallel.py --rounds 3 --seeds 2 # seconds: checks the script
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def fedsl_cmd(out: Path, rounds: int, seeds: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedsl.cli", "run", "--preset", "quickstart", "--variants", "FSL",
            "--set", f"rounds={rounds}", "--set", f"seeds={list(range(seeds))}", "--out", str(out), "--quiet",
            *extra]


def timed(cmds: list[list[str]]) -> float:
    """Start every command at once; seconds until the last one ends."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in cmds]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"{' '.join(p.args)} failed:\n{err}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40, help="rounds of each quickstart run")
    ap.add_argument("--seeds", type=int, default=4, help="runs of the sweep")
    ap.add_argument("--copies", type=int, default=4, help="concurrent quickstart copies")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the sweep part, interleaved (medians)")
    ap.add_argument("--sweep-only", action="store_true", help="skip the fair-share part (4 copies)")
    ap.add_argument("--out", type=Path, help="also append the table to this Markdown file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    rows = []

    def out(name: str) -> Path:
        return tmp / f"{name}-{len(rows)}-{time.monotonic_ns()}"

    timed([fedsl_cmd(out("warm-up"), 1, 1)])  # generates and caches the data: not timed below
    load0 = os.getloadavg()
    times: dict[str, list[float]] = {"serial": [], "par": [], "serial1": []}
    for _ in range(args.reps):  # interleaved, so that the machine's noise hits all three alike
        times["serial"].append(timed([fedsl_cmd(out("serial"), args.rounds, args.seeds)]))
        times["par"].append(timed([fedsl_cmd(out("par"), args.rounds, args.seeds, "--parallel", "2")]))
        times["serial1"].append(timed([fedsl_cmd(out("serial1"), args.rounds, args.seeds, "--set", "threads=1")]))
    serial, par, serial1 = (sorted(v)[len(v) // 2] for v in times.values())
    rows.append(("sweep of %d runs, one after another (threads auto)" % args.seeds, serial, "1.00x"))
    rows.append(("same sweep, --parallel 2 (1 thread each)", par, f"{serial / par:.2f}x throughput"))
    rows.append(("same sweep, one after another, threads = 1", serial1, f"{serial1 / par:.2f}x (parallel's gain)"))
    import torch
    if args.sweep_only:
        _report(args, rows, load0, torch)
        return

    one = timed([fedsl_cmd(out("one"), args.rounds, 1)])
    rows.append(("1 quickstart run alone (threads auto)", one, "1.00x"))
    many = timed([fedsl_cmd(out("many"), args.rounds, 1) for _ in range(args.copies)])
    rows.append((f"{args.copies} copies at once (threads auto)", many, f"{many / one:.2f}x one copy"))
    default = torch.get_num_threads()
    many_old = timed([fedsl_cmd(out("old"), args.rounds, 1, "--set", f"threads={default}")
                      for _ in range(args.copies)])
    rows.append((f"{args.copies} copies at once (threads = {default}, torch's default)", many_old,
                 f"{many_old / one:.2f}x one copy"))
    _report(args, rows, load0, torch)


def _report(args, rows, load0, torch) -> None:
    load1 = os.getloadavg()
    lines = [f"### bench_parallel.py --rounds {args.rounds} --seeds {args.seeds} --copies {args.copies} "
             f"--reps {args.reps}{' --sweep-only' if args.sweep_only else ''}",
             "",
             f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.node() or 'host'}: {os.cpu_count()} cores "
             f"({platform.processor() or platform.machine()}), torch {torch.__version__}, load average "
             f"before {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}, after {load1[0]:.2f} / {load1[1]:.2f} / "
             f"{load1[2]:.2f}",
             "",
             "| what | wall s | ratio |", "|---|---:|---|"]
    lines += [f"| {w} | {s:.1f} | {r} |" for w, s, r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
