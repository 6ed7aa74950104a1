"""How long the paper's Fig. 5 CIFAR-10 heat map takes with stacked runs (random data).

The heat map is 4 methods (FSL, FSLsyn, SCAFFOLD, FedDyn) × 5 η_l × 4 C × 3 seeds ×
1,000 rounds of Scenario 2 (N = 1,000 clients of 50 images, S = 10, B = 10, one local
epoch: K = 5 steps; FSL: n0 = 500, B0 = 10, K0 = 50 server steps, as in the preset),
evaluated on 10,000 test images every round. Per method, R runs advance together
(``StackedSimulator``); this script times rounds at the R given per method and projects
the whole figure:
    total = Σ_methods ⌈60 / R⌉ × 1,000 × (seconds per stacked round at R).
FSLsyn is FSL's computation on another D0 (same shapes), so it takes FSL's time.
SCAFFOLD and FedDyn keep an N × d table per run (2.2 GB for the CIFAR CNN), which caps
their R by memory.

Besides the table: each phase of a round (the clients' K steps, the servers' K0 steps, the
host's per-run work, evaluation) against the device's best rate for this model (its plain
forward + backward at a large batch), and a plain PyTorch loop (one run, one client after
another: what a research script does) for the baseline.

    PYTHONPATH=src python3 benchmarks/heatmap_time.py --device cuda --runs FSL:60,SCAFFOLD:30 \\
        --compile off,cuda-graphs --rounds 20
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.data.federation import Federation
from fedsl.engine.executors import make_executor
from fedsl.engine.functional import FunctionalModel, evaluate, evaluate_many
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

RUNS_PER_METHOD = 5 * 4 * 3  # η_l × C × seeds
ROUNDS = 1000
METHODS = {"FSL": "fsl", "FSLsyn": "fsl", "SCAFFOLD": "scaffold", "FedDyn": "feddyn"}
N, N_I, S, B, K, N0, B0, K0, N_TEST = 1000, 50, 10, 10, 5, 500, 10, 50, 10_000


def federation(device: torch.device) -> Federation:
    g = torch.Generator().manual_seed(0)
    n = N * N_I + N0
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    clients = [np.arange(i * N_I, (i + 1) * N_I) for i in range(N)]
    server = np.arange(N * N_I, n)
    xt, yt = torch.rand(N_TEST, 3, 32, 32, generator=g), torch.randint(0, 10, (N_TEST,), generator=g)
    return Federation(x, y, clients, server, xt, yt, 10, [str(c) for c in range(10)]).to(device, torch.float32)


def simulators(method: str, fed: Federation, r: int, device: torch.device, compile: str = "off",
               precision: str = "float32") -> list[Simulator]:
    sims = []
    for j in range(r):
        fm = FunctionalModel(build_model("cifar_cnn", 10, (3, 32, 32), seed=j).to(device))
        lr = [0.005, 0.01, 0.02, 0.05, 0.1][j % 5]
        sl = ServerLearning(gamma=1.0, lr=lr, batch_size=B0, epochs=1) if method == "fsl" else None
        name = "fedavg" if method == "fsl" else method
        alg = make_algorithm(name, LocalTraining(lr, B, epochs=1), math.sqrt(S), sl,
                             **({"alpha": 0.01} if method == "feddyn" else {}))
        executor = make_executor("vectorised" if compile != "off" else "auto", fm, device, compile)
        sims.append(Simulator(fm, fed, alg, executor, S, seed=j, eval_batch_size=500, eval_precision=precision))
    return sims


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def phases(stacked: StackedSimulator, states, t: int, device: torch.device) -> tuple[dict[str, float], list]:
    """One round with the GPU drained between phases: seconds in the clients' call, the servers'
    (line 10) call, and the rest (sampling, plans, the per-run rules, γ: host work)."""
    calls: list[float] = []
    train = stacked.executor.train

    def timed(*a, **k):
        sync(device)
        t0 = time.perf_counter()
        out = train(*a, **k)
        sync(device)
        calls.append(time.perf_counter() - t0)
        return out
    stacked.executor.train = timed
    try:
        sync(device)
        t0 = time.perf_counter()
        states, _ = stacked.round(states, t)
        sync(device)
        total = time.perf_counter() - t0
    finally:
        del stacked.executor.train
    out = {"clients": calls[0], "servers": sum(calls[1:]), "host": total - sum(calls)}
    return out, states


def time_stack(method: str, fed: Federation, r: int, device: torch.device, rounds: int, compile: str,
               precisions: list[str], budget_s: float) -> dict:
    """Seconds per round (train; evaluation per precision), the phases of one round, peak GB, for R
    stacked runs; the warm-up round (cuDNN's choices, the CUDA graphs' capture) is not timed.
    Stops timing after ``budget_s`` seconds of rounds (fewer rounds, stated)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    stacked = StackedSimulator(simulators(method, fed, r, device, compile))
    states = stacked.initial_states()
    states, _ = stacked.round(states, 0)  # warm-up
    for p in precisions:
        for sim in stacked.sims:
            sim.eval_precision = p
        stacked.evaluate([s.x for s in states])
    sync(device)
    setup = time.perf_counter() - t0
    ph, states = phases(stacked, states, 1, device)
    t0, done = time.perf_counter(), 0
    for t in range(2, rounds + 2):
        states, _ = stacked.round(states, t)
        done += 1
        if time.perf_counter() - t0 > budget_s:
            break
    sync(device)
    train = (time.perf_counter() - t0) / done
    evals = {}
    for p in precisions:
        for sim in stacked.sims:
            sim.eval_precision = p
        sync(device)
        t0 = time.perf_counter()
        reps = 3
        for _ in range(reps):
            stacked.evaluate([s.x for s in states])
        sync(device)
        evals[p] = (time.perf_counter() - t0) / reps
    peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")
    return {"train": train, "rounds": done, "evals": evals, "phases": ph, "peak": peak, "setup": setup,
            "states": states, "stacked": stacked}


def round_and_eval(stacked: StackedSimulator, states, t: int, rounds: int, device: torch.device,
                   reps: int = 3) -> tuple[dict[str, float], list]:
    """Seconds per round of the runner's loop with evaluation every round (the round, the evaluation whose
    results the host reads), without and with the next round's host work made while the device evaluates
    (``StackedSimulator.prepare``, what the runner does); blocks of ``rounds`` rounds, interleaved ``reps`` times."""
    secs = {"host work in the round": 0.0, "host work made ahead": 0.0}
    for _ in range(reps):
        for label, ahead in (("host work in the round", False), ("host work made ahead", True)):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(rounds):
                states, _ = stacked.round(states, t)
                if ahead:
                    stacked.prepare(t + 1)
                stacked.evaluate([s.x for s in states])
                t += 1
            sync(device)
            secs[label] += (time.perf_counter() - t0) / (rounds * reps)
    return secs, states


def eval_loop(stacked: StackedSimulator, states, precision: str, batch: int, device: torch.device) -> float:
    """Seconds to evaluate the R models one after another, ``batch`` images per forward (no vmap)."""
    sim = stacked.sims[0]
    sync(device)
    t0 = time.perf_counter()
    for st in states:
        evaluate_many(sim.fm, {n: v.unsqueeze(0) for n, v in st.x.items()}, sim.fed.x_test, sim.fed.y_test,
                      batch, precision)
    sync(device)
    return time.perf_counter() - t0


def seconds_per_call(fn, device: torch.device, reps: int) -> float:
    """Seconds per call of ``fn`` over ``reps`` calls, after one untimed call (cuDNN's choices)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def eval_layouts(stacked: StackedSimulator, states, device: torch.device, reps: int = 3) -> list[tuple[str, float]]:
    """Seconds to evaluate the R models on the test set: vmapped (as ``StackedSimulator.evaluate``) or one
    model at a time (batch 10,000), with the images in NCHW or channels-last (NHWC) layout, float32 or bf16."""
    sim = stacked.sims[0]
    r = len(states)
    xt, yt = sim.fed.x_test, sim.fed.y_test
    both = {n: torch.stack([s.x[n] for s in states]) for n in states[0].x}
    out = []
    for layout in ("NCHW", "NHWC"):
        x = xt if layout == "NCHW" else xt.contiguous(memory_format=torch.channels_last)
        models = [s.x if layout == "NCHW" else {n: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4
                                                 else v for n, v in s.x.items()} for s in states]
        for p in ("float32", "bfloat16"):  # each lambda is timed before the loop moves on
            out.append((f"vmapped, {layout}, {p}",
                        seconds_per_call(lambda: evaluate_many(sim.fm, both, x, yt, max(500, 2000 // r), p),  # noqa: B023
                                         device, reps)))
            out.append((f"one model at a time, batch 10,000, {layout}, {p}",
                        seconds_per_call(lambda: [evaluate(sim.fm, m, x, yt, 10_000, p) for m in models],  # noqa: B023
                                         device, reps)))
    return out


def forward_flops(fm: FunctionalModel, device: torch.device) -> float:
    """FLOPs of one image's forward pass (convolutions and matrix products)."""
    x = torch.zeros(1, 3, 32, 32, device=device)
    fm.train(False)  # dropout off (no key): its FLOPs are not counted anyway
    with FlopCounterMode(display=False) as counter:
        fm.forward(fm.params(), x)
    return float(counter.get_total_flops())


def best_rates(device: torch.device, batch: int = 4096, reps: int = 10) -> dict[str, float]:
    """The device's best rate for this model, FLOP/s: a plain (not vmapped) forward + backward at a
    large batch (training, float32 with the default TF32 convolutions), and forward passes in float32
    and under bf16 autocast (evaluation)."""
    model = build_model("cifar_cnn", 10, (3, 32, 32), seed=0).to(device)
    fm = FunctionalModel(copy.deepcopy(model))
    f = forward_flops(fm, device)
    x = torch.rand(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    out = {}

    def rate(fn, flops) -> float:
        return flops / seconds_per_call(fn, device, reps)

    def train():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
    model.train()
    out["train"] = rate(train, 3 * f * batch)
    model.eval()
    with torch.inference_mode():
        out["eval float32"] = rate(lambda: model(x), f * batch)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out["eval bfloat16"] = rate(lambda: model(x), f * batch)
    return out


def plain_loop_round(device: torch.device, fed: Federation, server_steps: int, rounds: int = 3) -> float:
    """Seconds per round of one run as plain research code: an nn.Module per client, one client after
    another, torch.optim.SGD, then (FSL) K0 server steps, then evaluation at batch 500."""
    model = build_model("cifar_cnn", 10, (3, 32, 32), seed=0).to(device)
    rng = np.random.default_rng(0)

    def sgd_steps(m, idx_batches, lr):
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        m.train()
        for idx in idx_batches:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(m(fed.x[idx]), fed.y[idx]).backward()
            opt.step()

    def batches(indices, bs):
        perm = torch.as_tensor(rng.permutation(indices), device=device)
        return [perm[j:j + bs] for j in range(0, len(perm), bs)]

    times = []
    for _ in range(rounds + 1):
        sync(device)
        t0 = time.perf_counter()
        base = {n: p.detach().clone() for n, p in model.state_dict().items()}
        delta = {n: torch.zeros_like(p) for n, p in base.items()}
        for c in rng.choice(N, S, replace=False):
            local = copy.deepcopy(model)
            sgd_steps(local, batches(fed.clients[c], B), 0.02)
            for n, p in local.state_dict().items():
                delta[n] += (p - base[n]) / S
        model.load_state_dict({n: base[n] + math.sqrt(S) * delta[n] for n in base})
        if server_steps:
            sgd_steps(model, batches(fed.server, B0)[:server_steps], 0.02)
        model.eval()
        correct = 0
        with torch.inference_mode():
            for i in range(0, N_TEST, 500):
                correct += (model(fed.x_test[i:i + 500]).argmax(1) == fed.y_test[i:i + 500]).sum().item()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / rounds  # the first round warms cuDNN up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", default="FSL:60,SCAFFOLD:30,FedDyn:30",
                    help="method:R pairs, R runs stacked (FSLsyn takes FSL's time)")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per stack (after one warm-up round)")
    ap.add_argument("--budget-s", type=float, default=60.0, help="stop timing a stack's rounds after this long")
    ap.add_argument("--compile", default="off", help="comma list of executor modes to time: off, cuda-graphs, "
                                                     "reduce-overhead, ...")
    ap.add_argument("--eval-precision", default="float32,bfloat16", help="evaluation precisions to time")
    ap.add_argument("--rate-batch", type=int, default=4096, help="batch of the best-rate measurement")
    ap.add_argument("--loop-rounds", type=int, default=3, help="timed rounds of the plain loop")
    ap.add_argument("--extras", default="rates,loop", help="rates (device's best rate, % per phase), "
                                                           "loop (plain-loop baseline), evalloop (eval without vmap), "
                                                           "ahead (round + evaluation, host work made ahead or not)")
    ap.add_argument("--ahead-rounds", type=int, default=5,
                    help="rounds per block of the 'ahead' timing (3 blocks each)")
    ap.add_argument("--tf32", action="store_true", help="TF32 matrix products too (cuDNN convolutions use TF32 "
                                                         "by default; matmuls do not)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    fed = federation(device)
    extras = set(args.extras.split(",")) if args.extras else set()
    precisions = args.eval_precision.split(",")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# Fig. 5 heat map time on {name}, torch {torch.__version__}\n", flush=True)
    fm = FunctionalModel(build_model("cifar_cnn", 10, (3, 32, 32), seed=0).to(device))
    f = forward_flops(fm, device)
    rates = best_rates(device, args.rate_batch) if "rates" in extras else {}
    if rates:
        print(f"CIFAR CNN: {f / 1e6:.1f} MFLOP per image forward; device's best rate for it: "
              + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in rates.items()) + "\n", flush=True)
    head = " | ".join(f"eval {p} s" for p in precisions)
    print(f"| method | compile | R | rounds timed | s/round train | {head} | peak GB | set-up s | "
          f"grid min (train + eval {precisions[-1]}) |")
    print("|---|---|---|---|---|" + "---|" * len(precisions) + "---|---|---|", flush=True)
    best: dict[str, float] = {}
    phase_rows = []
    for item in args.runs.split(","):
        label, r = item.split(":")
        r, method = int(r), METHODS[label]
        for mode in args.compile.split(","):
            try:
                res = time_stack(method, fed, r, device, args.rounds, mode, precisions, args.budget_s)
            except Exception as e:  # one configuration failing (memory, capture) must not lose the others
                print(f"| {label} | {mode} | {r} | failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} |",
                      flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            stacks = math.ceil(RUNS_PER_METHOD / r)
            per_round = res["train"] + res["evals"][precisions[-1]]
            minutes = stacks * ROUNDS * per_round / 60
            best[label] = min(best.get(label, math.inf), minutes)
            evals = " | ".join(f"{res['evals'][p]:.3f}" for p in precisions)
            print(f"| {label} | {mode} | {r} | {res['rounds']} | {res['train']:.3f} | {evals} | {res['peak']:.1f} | "
                  f"{res['setup']:.1f} | {minutes:.1f} |", flush=True)
            phase_rows.append((label, mode, r, res, method))
            if "layouts" in extras:
                for what, secs in eval_layouts(res["stacked"], res["states"], device):
                    print(f"|   evaluation: {what} | | | | | {secs:.3f} s | | | |", flush=True)
            if "ahead" in extras:
                secs, res["states"] = round_and_eval(res["stacked"], res["states"], 10_000, args.ahead_rounds, device)
                for what, v in secs.items():
                    print(f"|   round + evaluation ({precisions[-1]}), {what} | | | | {v:.3f} s | | | | |", flush=True)
            if "evalloop" in extras:
                for p in precisions:
                    s_loop = eval_loop(res["stacked"], res["states"], p, 10_000, device)
                    print(f"|   eval one model at a time, batch 10,000, {p} | | | | | {s_loop:.3f} s | | | |",
                          flush=True)
            del res["stacked"], res["states"]  # the stack's memory (SCAFFOLD's tables) before the next one
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "FSL" in best:
        best.setdefault("FSLsyn", best["FSL"])  # same computation as FSL (another D0)
    if {"SCAFFOLD", "FedDyn"} & best.keys():
        other = best.get("SCAFFOLD", best.get("FedDyn"))
        best.setdefault("SCAFFOLD", other)
        best.setdefault("FedDyn", other)  # same shapes, one more table op per step: measured equal before
    print(f"\nwhole heat map (4 methods × 60 runs × {ROUNDS:,} rounds, evaluation every round), best per method: "
          f"**{sum(best.values()):.1f} minutes** ({', '.join(f'{k} {v:.1f}' for k, v in best.items())})\n", flush=True)
    if rates:
        print("| method | compile | R | phase | s/round | images | % of the device's best rate |")
        print("|---|---|---|---|---|---|---|")
        for label, mode, r, res, method in phase_rows:
            ph = res["phases"]
            client_imgs, server_imgs = r * S * K * B, (r * K0 * B0 if method == "fsl" else 0)
            rows = [("clients' K steps", ph["clients"], client_imgs, 3 * f * client_imgs / rates["train"]),
                    ("servers' K0 steps", ph["servers"], server_imgs, 3 * f * server_imgs / rates["train"]),
                    ("host (sampling, plans, rules)", ph["host"], 0, 0.0)]
            for p in precisions:
                imgs = r * N_TEST
                rows.append((f"evaluation {p}", res["evals"][p], imgs, f * imgs / rates[f"eval {p}"]))
            for phase, secs, imgs, floor in rows:
                pct = f"{100 * floor / secs:.0f}%" if imgs and secs > 0 else "-"
                print(f"| {label} | {mode} | {r} | {phase} | {secs:.4f} | {imgs:,} | {pct} |", flush=True)
    if "loop" in extras:
        fsl, fedavg = (plain_loop_round(device, fed, k0, args.loop_rounds) for k0 in (K0, 0))
        hours = (2 * fsl + 2 * fedavg) * RUNS_PER_METHOD * ROUNDS / 3600
        print(f"\nplain PyTorch loop (one run, clients one after another, evaluation every round): FSL {fsl:.3f} s "
              f"per round, FedAvg-shaped (SCAFFOLD/FedDyn) {fedavg:.3f} s; the whole heat map one run after another: "
              f"**{hours:.1f} hours**", flush=True)


if __name__ == "__main__":
    main()
