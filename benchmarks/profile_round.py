"""Where a round's time sits: the engine's round of one bench workload under torch.profiler, by operator.

    python benchmarks/profile_round.py --workload s2-cifar10-fsl --threads 2 --rounds 3

Prints a markdown table of the operators' self CPU time per round (the largest first), after one warm-up round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness.peers import EnginePeer  # noqa: E402
from harness.workloads import make_data, workloads  # noqa: E402


def profile_round(workload: str, threads: int, rounds: int, executor: str = "sequential", top: int = 12,
                  smoke: bool = False) -> list[tuple[str, float, float, int]]:
    """(operator, seconds per round, share, calls per round) of the ``top`` operators by self CPU time."""
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(threads)
    w = workloads(smoke)[workload]
    peer = EnginePeer(w, make_data(w), torch.device("cpu"), executor)
    peer.setup()  # builds and runs the warm-up round
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            peer.run(rounds)
    finally:
        peer.close()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return [(e.key, e.self_cpu_time_total / 1e6 / rounds, e.self_cpu_time_total / total, e.count // rounds)
            for e in ranked]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="s2-cifar10-fsl", help=f"one of {', '.join(workloads())}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--executor", default="sequential", help="the engine's executor (sequential or vectorised)")
    ap.add_argument("--smoke", action="store_true", help="the workload on a tiny model (checks the script)")
    a = ap.parse_args(argv)
    if a.workload not in workloads():
        print(f"--workload {a.workload!r}: expected one of {', '.join(workloads())}", file=sys.stderr)
        return 2
    rows = profile_round(a.workload, a.threads, a.rounds, a.executor, smoke=a.smoke)
    print(f"{a.workload}, {a.executor} executor, {a.threads} threads, {a.rounds} rounds after a warm-up\n")
    print("| operator | s per round | share | calls per round |\n|---|---:|---:|---:|")
    for key, s, share, calls in rows:
        print(f"| {key} | {s:.3f} | {100 * share:.0f}% | {calls:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
