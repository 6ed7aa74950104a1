"""The per-client state of SCAFFOLD and FedDyn for N clients: memory before, after init and over a round."""

from __future__ import annotations

import gc

import torch

from harness import machine
from harness.workloads import make_data, workloads


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
