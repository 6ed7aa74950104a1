"""``python benchmarks/bench.py``: argparse only (runs where just torch and numpy are
installed, e.g. a GPU machine with ``PYTHONPATH=src``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import OPTIONAL_PEERS, PEERS, run_benchmarks
from harness.workloads import DEFAULT_WORKLOADS, workloads


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="fedsl engine vs a plain PyTorch loop vs Flower's and pfl-research's "
                                             "simulations (random data, interleaved, medians)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help=f"comma-separated, from: {', '.join(workloads())}")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per repetition (Scenario 1: 1)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    ap.add_argument("--heavy-reps", type=int, default=None,
                    help="repetitions of heavy workloads (Scenario 1, seed sweeps); default --reps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated, from: {', '.join(PEERS + OPTIONAL_PEERS)} (loop: the plain PyTorch loop; "
                         "loop-cl: it in channels-last format on this process's threads; loop-percore: loop-cl with "
                         "the round's clients over one worker process per core, 1 thread each; processes: fedsl's "
                         "process-pool executor; vectorised: fedsl's vectorised executor beside --executor's, not "
                         "in the default list)")
    ap.add_argument("--executor", default="auto", help="the engine's executor: auto, sequential, vectorised")
    ap.add_argument("--threads", default="auto",
                    help="torch intra-op threads: a number, 'auto' (chosen by measurement) or 'torch' "
                         "(torch's default)")
    ap.add_argument("--flower-actors", type=int, default=2)
    ap.add_argument("--flower-cpus", type=int, default=1, help="CPUs (and torch threads) per Ray actor")
    ap.add_argument("--footprint-clients", type=int, default=1000,
                    help="N of the SCAFFOLD/FedDyn state measurement (0: skip)")
    ap.add_argument("--smoke", action="store_true", help="tiny model and data: checks the harness, not speed")
    ap.add_argument("--out", type=Path, default=None, help="also write the Markdown report here")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    threads = None if args.threads == "torch" else args.threads if args.threads == "auto" else int(args.threads)
    command = "python benchmarks/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        report = run_benchmarks(names, rounds=args.rounds, reps=args.reps, heavy_reps=args.heavy_reps,
                                device=args.device, smoke=args.smoke,
                                peers=[p.strip() for p in args.peers.split(",") if p.strip()],
                                executor=args.executor, threads=threads, flower_actors=args.flower_actors,
                                flower_cpus=args.flower_cpus, footprint_clients=args.footprint_clients or None,
                                log=lambda s: print(s, file=sys.stderr, flush=True), command=command.strip())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = report.markdown()
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
