"""Running the benchmarks: each workload's peers set up, warmed up and timed in turn (``run_benchmarks``)."""

from __future__ import annotations

import datetime
import gc
import os
import time
from collections.abc import Callable, Sequence

import torch

from harness import machine
from harness.footprint import state_footprint
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
from harness.report import Report
from harness.table import Row, add_ratios
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
