"""How long the paper's Fig. 5 CIFAR-10 heat map takes with stacked runs (random data).

The heat map is 4 methods (FSL, FSLsyn, SCAFFOLD, FedDyn) × 5 η_l × 4 C × 3 seeds ×
1,000 rounds of Scenario 2 (N = 1,000 clients of 50 images, S = 10, B = 10, one local
epoch: K = 5 steps, as in the preset), evaluated on 10,000 test images every round. Per method, R runs advance together (``StackedSimulator``); this
script times a few rounds at several R and extrapolates the whole figure:
    total = Σ_methods ⌈runs / R⌉ × 1,000 × (seconds per stacked round at R).
SCAFFOLD and FedDyn keep an N × d table per run (2.2 GB for the CIFAR CNN), which caps
their R by memory.

    PYTHONPATH=src python3 benchmarks/heatmap_time.py --device cuda --stack 1,20,60
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.data.federation import Federation
from fedsl.engine.executors import make_executor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

RUNS_PER_METHOD = 5 * 4 * 3  # η_l × C × seeds
METHODS = {"FSL": "fsl", "FSLsyn": "fsl", "SCAFFOLD": "scaffold", "FedDyn": "feddyn"}


def federation(device: torch.device, n_clients: int = 1000, per_client: int = 50, n0: int = 500,
               n_test: int = 10_000) -> Federation:
    g = torch.Generator().manual_seed(0)
    n = n_clients * per_client + n0
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    clients = [np.arange(i * per_client, (i + 1) * per_client) for i in range(n_clients)]
    server = np.arange(n_clients * per_client, n)
    xt, yt = torch.rand(n_test, 3, 32, 32, generator=g), torch.randint(0, 10, (n_test,), generator=g)
    return Federation(x, y, clients, server, xt, yt, 10, [str(c) for c in range(10)]).to(device, torch.float32)


def simulators(method: str, fed: Federation, r: int, device: torch.device, compile: str = "off") -> list[Simulator]:
    sims = []
    for j in range(r):
        fm = FunctionalModel(build_model("cifar_cnn", 10, (3, 32, 32), seed=j).to(device))
        lr = [0.005, 0.01, 0.02, 0.05, 0.1][j % 5]
        sl = ServerLearning(gamma=1.0, lr=lr, batch_size=10, epochs=1) if method == "fsl" else None
        name = "fedavg" if method == "fsl" else method
        alg = make_algorithm(name, LocalTraining(lr, 10, epochs=1), math.sqrt(10), sl,
                             **({"alpha": 0.01} if method == "feddyn" else {}))
        executor = make_executor("vectorised" if compile != "off" else "auto", fm, device, compile)
        sims.append(Simulator(fm, fed, alg, executor, 10, seed=j, eval_batch_size=500))
    return sims


def time_stack(method: str, fed: Federation, r: int, device: torch.device, rounds: int,
               compile: str = "off") -> tuple[float, float, float]:
    """(seconds per round train only, per round with evaluation, peak GB) for R stacked runs; the
    warm-up round (where ``compile`` captures the step) is not timed."""
    stacked = StackedSimulator(simulators(method, fed, r, device, compile))
    states = stacked.initial_states()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    states, _ = stacked.round(states, 0)  # warm-up
    stacked.evaluate([s.x for s in states])
    sync()
    t0 = time.perf_counter()
    for t in range(1, rounds + 1):
        states, _ = stacked.round(states, t)
    sync()
    train = (time.perf_counter() - t0) / rounds
    t0 = time.perf_counter()
    for _ in range(rounds):
        stacked.evaluate([s.x for s in states])
    sync()
    evaluate = (time.perf_counter() - t0) / rounds
    peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")
    return train, train + evaluate, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--stack", default="1,20,60", help="R values to time (comma-separated)")
    ap.add_argument("--table-stack", type=int, default=20, help="largest R for SCAFFOLD/FedDyn (N×d tables)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", default="FSL,SCAFFOLD,FedDyn")
    ap.add_argument("--compile", default="off", help="off, default, reduce-overhead (CUDA graphs), max-autotune: "
                                                     "torch.compile of the stacked client step (a comma list times each)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    fed = federation(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# Fig. 5 heat map time on {name}, torch {torch.__version__}\n")
    print("| method | compile | R stacked | s/round (train) | s/round (train + eval) | peak GB | heat map hours at this R |")
    print("|---|---|---|---|---|---|---|")
    best: dict[str, float] = {}
    for label in args.methods.split(","):
        method = METHODS[label]
        for mode in args.compile.split(","):
            for r in (int(v) for v in args.stack.split(",")):
                if method in ("scaffold", "feddyn") and r > args.table_stack:
                    continue
                train, total, peak = time_stack(method, fed, r, device, args.rounds, mode)
                hours = math.ceil(RUNS_PER_METHOD / r) * 1000 * total / 3600
                best[label] = min(best.get(label, math.inf), hours)
                print(f"| {label} | {mode} | {r} | {train:.3f} | {total:.3f} | {peak:.1f} | {hours:.2f} |", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if "FSL" in best:
        best.setdefault("FSLsyn", best["FSL"])  # same computation as FSL (another D0)
    print(f"\nwhole heat map (4 methods × 60 runs × 1,000 rounds), best R per method: "
          f"{sum(best.values()):.2f} hours ({', '.join(f'{k} {v:.2f}' for k, v in best.items())})")


if __name__ == "__main__":
    main()
