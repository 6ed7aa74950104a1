"""Benchmark harness: fedsl's engine vs a plain PyTorch loop vs Flower's and pfl-research's simulations.

    from harness import run_benchmarks
    report = run_benchmarks(["s2-cifar10+eval"], rounds=3, reps=3)
    print(report.markdown())

For each workload (``harness.workloads``, random data) every available peer (``harness.peers``,
``harness.percore``, ``harness.flower_peer``, ``harness.pfl_peer``) is set up and warmed up (one
untimed round), then run ``reps`` times in turn — fedsl, plain loop, Flower, fedsl, ... — each time
for a few timed rounds, so that noise from other work on the machine hits all alike. A
row reports the median seconds per round, samples/s, its speed ratio to each other peer,
achieved GFLOP/s (FLOPs counted by ``FlopCounterMode``) and their fraction of the
machine's best rate measured in the same process (``harness.machine.best_rates``), and
peak memory; under the table, each workload's floor: its FLOPs per round at those best rates.
Also measured: the per-client state of SCAFFOLD and FedDyn for N = 1,000 CIFAR
clients (``state_footprint``).

Not part of the library: it lives beside ``benchmarks/bench.py``, which puts ``benchmarks/``
on ``sys.path`` and runs it (with only torch and numpy installed:
``PYTHONPATH=src python3 benchmarks/bench.py --device cuda``).
"""

from __future__ import annotations

import datetime
import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from harness import machine
from harness.peers import (
    ChannelsLastLoopPeer,
    EnginePeer,
    LoopPeer,
    Peer,
    ProcessesPeer,
    StackedPeer,
    VectorisedPeer,
    median,
)
from harness.table import Row, add_ratios, floors, markdown
from harness.workloads import (
    DEFAULT_WORKLOADS,
    TEXT_MODELS,
    Workload,
    is_heavy,
    make_data,
    random_inputs,
    timed_rounds,
    workloads,
)

# processes: fedsl with the process-pool executor; loop-cl: the plain loop in channels-last format;
# loop-percore: that loop with the round's clients in one process per core
PEERS = ("fedsl", "loop", "flower", "pfl", "processes", "loop-cl", "loop-percore")
# peers run only when asked for (not in the default ``PEERS``): vectorised: fedsl with the vectorised executor
# beside the ``fedsl`` row's (``--executor``, on a CPU by default the sequential one)
OPTIONAL_PEERS = ("vectorised",)
# a char-LSTM's best rates: its fused LSTM ran fastest per sample at batch 32 (cache-resident; 2 x 64: 1,995
# training samples/s at 32, 1,142 at 128, 969 at 512, one thread), and an evaluation batch of 2,000 windows of
# the 2 x 256 LSTM takes seconds for no better rate
TEXT_RATE_BATCHES = dict(train_batches=(32, 128, 512), eval_batches=(32, 100, 500))


@dataclass
class Report:
    """Everything one benchmark invocation measured."""

    rows: list[Row]
    machine: dict[str, str]
    rates: dict[str, machine.Rates]
    footprint: list[dict[str, float]]
    settings: dict[str, str]
    command: str = ""
    started: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        out = [f"Measured {self.started} in {self.seconds / 60:.1f} min" + (f" with `{self.command}`" if self.command
                                                                             else "") + ".", ""]
        out += [f"- {k}: {v}" for k, v in self.machine.items()]
        out += ["", markdown(self.rows), ""]
        out += floors(self.rows) + [""]
        out += [
                "Ratios `x PEER` = PEER's seconds per round / this row's (above 1: this row is faster). "
                "`% of best` = the time the row's samples would take at the model's best measured training "
                "(fwd+bwd) and inference (fwd) rates / the row's time. samples/s counts training and "
                "evaluation samples. peak MB: the process's peak RSS during the row (Flower: its driver "
                "+ actors x the largest actor peak; loop 1 proc/core: the process + workers x the largest "
                "worker peak, shared pages counted in each), or CUDA memory allocated on a GPU.", ""]
        out += ["Best rates measured in this run (FLOPs per sample from `torch.utils.flop_counter`):", "",
                "| model | train MFLOP/sample | eval MFLOP/sample | best train samples/s (GFLOP/s) | setting "
                "| best eval samples/s (GFLOP/s) | setting | matmul GFLOP/s |",
                "|---|---:|---:|---:|---|---:|---|---:|"]
        for name, r in self.rates.items():
            out.append(f"| {name} | {r.train_flops / 1e6:.1f} | {r.eval_flops / 1e6:.1f} | {r.train_samples_s:,.0f} "
                       f"({r.train_gflops:.1f}) | {r.train_setting} | {r.eval_samples_s:,.0f} ({r.eval_gflops:.1f}) "
                       f"| {r.eval_setting} | {r.matmul_gflops:.0f} |")
        out += ["", "Settings:", ""] + [f"- {k}: {v}" for k, v in self.settings.items()]
        if self.footprint:
            out += ["", "Per-client state for N clients (part 5):", "",
                    "| rule | N | model params | state MB | memory before init MB | after init MB "
                    "| peak over a round MB |", "|---|---:|---:|---:|---:|---:|---:|"]
            for f in self.footprint:
                out.append(f"| {f['rule']} | {f['N']} | {f['params']:,} | {f['state_mb']:,.0f} | "
                           f"{f['before_mb']:,.0f} | {f['rss_mb']:,.0f} | {f['round_peak_mb']:,.0f} |")
            out += ["", "Memory: the process's RSS on a CPU, CUDA memory allocated on a GPU; it includes "
                    "the N clients' data (N x 50 CIFAR images, 586 MiB) and the model."]
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out)


def state_footprint(num_clients: int = 1000, model: str = "cifar_cnn", device: str = "cpu",
                    rounds: int = 1) -> list[dict[str, float]]:
    """Bytes of SCAFFOLD's (c, c_i) and FedDyn's (h, ∇L_i) state for ``num_clients`` clients
    of ``model``, the process RSS before and once it is built, and the peak RSS over ``rounds`` engine
    rounds of that rule on N clients x 50 random samples (S = 10, B = 10)."""
    from dataclasses import replace

    from fedsl.algorithms import LocalTraining, make_algorithm
    from fedsl.engine.executors import make_executor
    from fedsl.engine.functional import FunctionalModel
    from fedsl.engine.simulator import Simulator
    from fedsl.models import build_model
    from harness.peers import _federation

    dev = torch.device(device)
    w = replace(workloads()["s2-cifar10"] if model == "cifar_cnn" else workloads()["s2-emnist"],
                num_clients=num_clients, test_size=100)
    data = make_data(w)
    fed = _federation(w, data, dev)
    mem = machine.PeakMemory(dev)
    out = []
    for rule in ("scaffold", "feddyn"):
        gc.collect()
        fm = FunctionalModel(build_model(w.model, w.num_classes, w.input_shape, seed=0))
        fm.module.to(dev)
        alg = make_algorithm(rule, LocalTraining(w.lr, w.batch_size, w.epochs), 1.0, None)
        sim = Simulator(fm, fed, alg, make_executor("auto", fm, dev), w.clients_per_round, 0, 100)
        before = machine.current_rss_mb() if dev.type == "cpu" else torch.cuda.memory_allocated(dev) / 2 ** 20
        mem.reset()
        st = sim.initial_state()
        state_bytes = sum(v.numel() * v.element_size() for part in (st.algo, st.clients)
                          for group in part.values() for v in group.values())
        rss = machine.current_rss_mb() if dev.type == "cpu" else torch.cuda.memory_allocated(dev) / 2 ** 20
        for t in range(rounds):
            st, _ = sim.round(st, t)
        peak = mem.read()
        out.append({"rule": rule, "N": num_clients, "params": sim.num_params, "state_mb": state_bytes / 2 ** 20,
                    "before_mb": before, "rss_mb": rss, "round_peak_mb": peak.get("cuda_mb", peak["rss_mb"])})
        del st, sim
    return out


def _cpu_only(peer: Peer, device: torch.device, why: str) -> Peer:
    """``peer``, marked not available (``why``) on a device other than the CPU."""
    if device.type != "cpu":
        peer.available, peer.why_not = False, why
    return peer


def _close_quietly(peer) -> None:
    """Close a peer that failed (its own failure is already reported; one in closing adds nothing)."""
    try:
        peer.close()
    except Exception:  # noqa: BLE001, S110 - best effort on a peer already reported as failed
        pass


def _make_peers(w: Workload, data, device: torch.device, names: Sequence[str], executor: str,
                flower_actors: int, flower_cpus: int) -> list[Peer]:
    peers: list[Peer] = []
    for name in names:
        if name == "fedsl":
            peers.append(EnginePeer(w, data, device, executor))
            if w.seeds > 1:
                peers.append(StackedPeer(w, data, device, executor))
        elif name == "processes":
            peers.append(_cpu_only(ProcessesPeer(w, data, device), device, "CPU only"))
        elif name == "vectorised":
            peers.append(VectorisedPeer(w, data, device))
        elif name == "loop":
            peers.append(LoopPeer(w, data, device))
        elif name == "loop-cl":
            peers.append(_cpu_only(ChannelsLastLoopPeer(w, data, device), device, "CPU only"))
        elif name == "loop-percore":
            from harness.percore import PerCoreLoopPeer
            peers.append(PerCoreLoopPeer(w, data, device))
        elif name == "flower":
            from harness.flower_peer import FlowerPeer
            peer = FlowerPeer(w, data, device, flower_actors, flower_cpus)
            if device.type != "cpu":
                peer.available, peer.why_not = False, "not run on GPU machines"
            peers.append(peer)
        elif name == "pfl":
            from harness.pfl_peer import PflPeer
            peers.append(PflPeer(w, data, device))
        else:
            raise ValueError(f"peer {name!r}: expected one of {PEERS + OPTIONAL_PEERS}")
    return peers


def run_benchmarks(names: Sequence[str] | None = None, rounds: int = 3, reps: int = 3, device: str = "cpu",
                   smoke: bool = False, peers: Sequence[str] = PEERS, executor: str = "auto",
                   threads: int | str | None = "auto", flower_actors: int = 2, flower_cpus: int = 1,
                   footprint_clients: int | None = 1000, log: Callable[[str], None] = print,
                   command: str = "", heavy_reps: int | None = None) -> Report:
    """Run ``names`` (default ``DEFAULT_WORKLOADS``) through ``peers``, interleaved; see the module doc.

    Args:
        rounds: timed rounds per repetition (heavy Scenario-1 rounds: 1, see ``timed_rounds``).
        reps: repetitions; a row's seconds is the median over all its timed rounds.
        heavy_reps: repetitions of heavy workloads (Scenario 1, seed sweeps; default ``reps``).
        device: "cpu" or "cuda" (CUDA is synchronised before every clock reading).
        smoke: tiny model and data, small rate measurements (CI checks the harness only).
        executor: the engine's executor ("auto" picks by device as ``fedsl run`` does).
        threads: torch intra-op threads of this process: a number, None (torch's default), or
            "auto" (CPU: chosen by measurement, ``machine.choose_threads``, for the first model).
        flower_actors, flower_cpus: Ray actors and CPUs (= torch threads) per actor.
        footprint_clients: N of the SCAFFOLD/FedDyn state measurement (None: skip it).
    """
    t_start = time.perf_counter()
    dev = torch.device(device)
    load_start = machine.load_average()
    table = workloads(smoke)
    names = list(names or DEFAULT_WORKLOADS)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}: expected some of {sorted(table)}")
    chosen = [table[n] for n in names]
    mem = machine.PeakMemory(dev)
    notes: list[str] = []
    from harness.peers import plain_model
    if threads == "auto":
        threads = None
        cores = os.cpu_count() or 1
        if dev.type == "cpu" and cores > 1:
            w0 = chosen[0]
            cands = tuple(sorted({1, max(1, cores // 2), cores}))
            threads = machine.choose_threads(lambda: plain_model(w0, 0, dev), w0.input_shape, w0.num_classes,
                                             cands, log=log, make_input=lambda n: random_inputs(w0.model, n))
            notes.append(f"threads chosen by measurement: {threads} (of {list(cands)}, on {w0.model}'s "
                         "small-batch steps)")
    threads_before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        return _run(chosen, rounds, reps, heavy_reps or reps, dev, smoke, peers, executor, flower_actors,
                    flower_cpus, footprint_clients, log, command, mem, notes, load_start, t_start)
    finally:
        torch.set_num_threads(threads_before)


def _run(chosen, rounds, reps, heavy_reps, dev, smoke, peers, executor, flower_actors, flower_cpus,
         footprint_clients, log, command, mem, notes, load_start, t_start) -> Report:
    from harness.peers import plain_model

    rates: dict[str, machine.Rates] = {}
    for model in dict.fromkeys(w.model for w in chosen):
        w0 = next(w for w in chosen if w.model == model)
        log(f"best rates of {model} ...")
        kw = dict(train_batches=(16,), eval_batches=(32,), repeats=1) if smoke else TEXT_RATE_BATCHES if (
            model in TEXT_MODELS) else {}
        # the factory is called inside best_rates, before w0 moves on
        rates[model] = machine.best_rates(lambda: plain_model(w0, 0, torch.device("cpu")), w0.input_shape,  # noqa: B023
                                          w0.num_classes, dev, make_input=lambda n: random_inputs(model, n),  # noqa: B023
                                          **kw)

    rows: list[Row] = []
    settings: dict[str, str] = {}
    for w in chosen:
        log(f"{w.name}: {w.describe()}")
        data = make_data(w)
        r = rates[w.model]
        n_rounds = timed_rounds(w, rounds)
        w_reps = heavy_reps if is_heavy(w) else reps
        flops = w.train_samples_per_round * r.train_flops + w.eval_samples_per_round * r.eval_flops
        best = w.train_samples_per_round / r.train_samples_s + w.eval_samples_per_round / r.eval_samples_s
        samples = w.train_samples_per_round + w.eval_samples_per_round
        ps = _make_peers(w, data, dev, peers, executor, flower_actors, flower_cpus)
        wrows = {p.name: Row(w.name, p.name, samples=samples, flops=flops, best_seconds=best) for p in ps}
        live = []
        for p in ps:
            if not p.available:
                wrows[p.name].note = p.why_not
                continue
            try:
                p.setup()
                live.append(p)
            except Exception as e:  # a peer that fails is reported, the others go on
                wrows[p.name].note = f"failed: {type(e).__name__}: {e}"[:200]
                _close_quietly(p)  # what its setup started (worker processes, actors) stops now, not at exit
        for rep in range(w_reps):
            for p in list(live):  # a peer that fails leaves ``live``; the next one still runs this rep
                gc.collect()
                mem.reset()
                try:
                    ts = p.run(n_rounds)
                except Exception as e:
                    wrows[p.name].note = f"failed: {type(e).__name__}: {e}"[:200]
                    live.remove(p)
                    _close_quietly(p)
                    continue
                peak = mem.read()
                row = wrows[p.name]
                row.times += ts
                mb = peak.get("cuda_mb", peak["rss_mb"])
                if "actor_peak_mb" in p.extra and dev.type == "cpu":
                    mb += p.extra["actors"] * p.extra["actor_peak_mb"]
                row.peak_mb = max(row.peak_mb or 0.0, mb)
                log(f"  rep {rep + 1}/{w_reps} {p.name}: " + ", ".join(f"{t:.3f}" for t in ts) + " s/round")
        for p in live:
            row = wrows[p.name]
            row.seconds = median(row.times)
            row.settings = p.settings
            if "startup_s" in p.extra:
                row.note = f"start-up {p.extra['startup_s']:.1f} s/run not counted"
            elif "startup_once_s" in p.extra:
                row.note = f"set-up + first round {p.extra['startup_once_s']:.1f} s (once) not counted"
            settings.setdefault(p.name, p.settings)
            p.close()
        rows += wrows.values()
        del ps, live, data
        gc.collect()
    add_ratios(rows)

    footprint: list[dict[str, float]] = []
    if footprint_clients:
        log(f"per-client state for N={footprint_clients} ...")
        footprint = state_footprint(footprint_clients if not smoke else 20, "cifar_cnn", dev.type)
    info = machine.describe(dev)
    info["load average (1, 5, 15 min)"] = f"{load_start} at the start, {machine.load_average()} at the end"
    fl = machine.optional_version("flwr")
    info["flwr"] = fl or "not installed"
    info["pfl"] = machine.optional_version("pfl") or "not installed"
    return Report(rows, info, rates, footprint, settings, command,
                  datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  time.perf_counter() - t_start, notes)


__all__ = ["OPTIONAL_PEERS", "PEERS", "Report", "Row", "Workload", "run_benchmarks", "state_footprint", "workloads"]
