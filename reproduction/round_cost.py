"""What a round of each variant of a preset costs: CPU seconds of the clients' half and of the server's half.

    python reproduction/round_cost.py PRESET [ROUNDS] [--variants A,B] [--set KEY=VALUE ...]

runs each variant of PRESET (seed 0, one thread) for ROUNDS rounds (default 10) after one round of warm-up and
prints, per variant, the mean process CPU time per round of the clients' half (sampling, what the rule's clients
measure at x_t and the server sends them, their local training) and of the server's half (the rule's update,
then server learning or distillation: where the methods that use server data differ), and of one evaluation on the
test set. CPU time, not wall time: another process on the same
core slows the wall clock but hardly the CPU time a round takes. ``--variants`` measures only those; ``--set``
overrides as `fedsl run` does (e.g. ``--set data.data_dir=../shared/data``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import torch

from fedsl.algorithms.server_round import server_update
from fedsl.config import loading, presets
from fedsl.config.expand import expand_runs
from fedsl.runs.build import prepare


def main(argv: list[str]) -> None:
    flags = ("--set", "--variants")
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    only = {v for i, a in enumerate(argv) if a == "--variants" for v in argv[i + 1].split(",")}
    rest = [a for i, a in enumerate(argv) if a not in flags and (i == 0 or argv[i - 1] not in flags)]
    if not rest:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    name, rounds = rest[0], int(rest[1]) if len(rest) > 1 else 10
    torch.set_num_threads(1)
    cfg = loading.load(base=presets.load(name), overrides=["threads=1", "seeds=[0]", *sets])
    print("| variant | clients' half (CPU s/round) | server's half (CPU s/round) | round | one evaluation |")
    print("|---|---|---|---|---|")
    for variant, rcfg in expand_runs(cfg).values():
        if only and variant not in only:
            continue
        sim = prepare(rcfg).sim
        state, _ = sim.round(sim.initial_state(), 0)  # warm-up: first-call costs out of the measure
        clients = server = 0.0
        for t in range(1, rounds + 1):
            start = time.process_time()
            state = replace(state, x=sim.layout(state.x))  # Simulator.round, in its two halves
            work = sim.measure_clients(sim.sample(t), state.x)  # what the rule's clients measure at x_t (FedCLG)
            finals, rows = sim.train_clients(state, work, t)
            mid = time.process_time()
            results = sim.results(work, finals, state.x, t)
            new, metrics = server_update(sim.alg, state, results, t, sim.server)
            state, _ = sim.end_round(new, work, rows, metrics)
            clients, server = clients + mid - start, server + time.process_time() - mid
        start = time.process_time()
        sim.evaluate(state.x)
        evaluation = time.process_time() - start
        c, s = clients / rounds, server / rounds
        print(f"| {variant} | {c:.2f} | {s:.2f} | {c + s:.2f} | {evaluation:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
