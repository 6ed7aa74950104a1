"""Executor and evaluation timings: the measurements behind the engine's defaults.

Runs, interleaved in one process so machine noise hits all alike, one Scenario-2-shaped
round of client training (S=10 clients x 50 samples, B=10, K=5; random data, as speed
does not depend on the values) with each executor and memory layout, and evaluation of
10,000 test images at several batch sizes. Prints a Markdown table.

    python benchmarks/bench_executors.py [--repeats 5] [--model cifar_cnn|emnist_cnn] [--workers 2]

``--workers W`` (≥ 2) adds the process-pool executor (``fedsl.engine.pool``, W workers of one
thread, channels-last) and its transfers alone (the same call with 0-step clients): its per-call
overhead on a round of this shape. Use ``--threads 1`` to compare it with one sequential core.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel, evaluate
from fedsl.engine.plan import make_plan
from fedsl.models import build_model

SHAPES = {"cifar_cnn": ((3, 32, 32), 10), "emnist_cnn": ((1, 28, 28), 45)}


def layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="cifar_cnn", choices=sorted(SHAPES))
    ap.add_argument("--workers", type=int, default=0, help="also time the process pool with W workers (0: no)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of this process (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape, classes = SHAPES[args.model]
    torch.manual_seed(0)
    x = torch.rand(10_000, *shape)
    y = torch.randint(0, classes, (10_000,))
    fm = FunctionalModel(build_model(args.model, classes, shape, seed=0))
    clients = [np.arange(i * 50, (i + 1) * 50) for i in range(10)]
    plan = make_plan(clients, list(range(10)), 10, 1, None, 0, 0, rng.CLIENT_BATCHES)

    cases = {}
    for cl in (False, True):
        p = {n: layout(v, cl) for n, v in fm.params().items()}
        xx = layout(x, cl)
        tag = "channels-last" if cl else "contiguous"
        for ex in (SequentialExecutor(fm), VectorisedExecutor(fm)):
            cases[f"train round, {ex.name}, {tag}"] = (lambda ex=ex, p=p, xx=xx: ex.local_sgd(p, plan, xx, y, 0.01))
        for bs in (100, 1000):
            cases[f"evaluate 10k, batch {bs}, {tag}"] = (lambda p=p, xx=xx, bs=bs: evaluate(fm, p, xx, y, bs))
    pool = None
    if args.workers >= 2:
        from fedsl.engine.plan import BatchPlan
        from fedsl.engine.pool import ProcessPoolExecutor
        pool = ProcessPoolExecutor(fm, workers=args.workers)
        p, xx = {n: layout(v, True) for n, v in fm.params().items()}, layout(x, True)
        no_steps = BatchPlan(plan.idx[:, :0], plan.weight[:, :0], plan.keys[:, :0], (0,) * plan.num_clients)
        cases[f"train round, processes x{args.workers}, channels-last"] = lambda: pool.local_sgd(p, plan, xx, y, 0.01)
        cases[f"train round, processes x{args.workers}: transfers only (0-step clients)"] = (
            lambda: pool.local_sgd(p, no_steps, xx, y, 0.01))
    for fn in cases.values():  # warm-up (allocator, oneDNN primitive cache)
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():  # interleaved
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)

    print(f"model {args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}, repeats {args.repeats} (median)\n")
    print("| case | seconds | relative to the first of its kind |\n|---|---:|---:|")
    base: dict[str, float] = {}
    for name, ts in times.items():
        kind = name.split(",")[0]
        med = statistics.median(ts)
        base.setdefault(kind, med)
        print(f"| {name} | {med:.3f} | {base[kind] / med:.2f}x |")
    if pool is not None:
        pool.close()


if __name__ == "__main__":
    main()
