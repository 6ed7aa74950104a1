"""A run built in Python (your own ``Simulator``: model, federation, algorithm) kept in the standard run folder, so
that ``fedsl show`` and ``fedsl report`` read it as a run of ``fedsl run``.

    from fedsl.runs.record import run_simulator
    summary = run_simulator(sim, "runs/mine", rounds=30, name="my-fsl")

writes ``runs/mine/`` as `fedsl run` writes a config without variants: group.json (a group of one run) and the
run's folder ``runs/mine/my-fsl/`` with config.json (what the run was: its name, rounds, evaluation settings, the
simulator's algorithm and model in words), metrics.csv (the columns of ``fedsl run``'s: accuracy, loss, rolling
accuracy, wall time, γ_t, cos θ_t, parameters sent; a row at round 0 and at every evaluated round) and summary.json
(final accuracy over the rolling window, rise time, T_0.5, status, rounds, wall time). It has no checkpoint: such a
run is not resumed (a run made from a config is: ``fedsl.runs.runner.run``). Ctrl-C keeps what was done,
status "interrupted", and stops.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

from fedsl.config.base import ConfigError, name_problem
from fedsl.engine import metrics
from fedsl.engine.simulator import Simulator
from fedsl.runs.checkpoint import atomic_write
from fedsl.runs.results import RunDir


def run_simulator(sim: Simulator, out: str | Path, rounds: int, *, name: str = "run", eval_every: int = 1,
                  rolling_window: int = metrics.WINDOW, log=print) -> dict:
    """Run ``sim`` from its initial state for ``rounds`` rounds (T) into the new folder ``out``; returns
    summary.json's content. ``eval_every``: evaluate x_t every this many rounds, and the last round;
    ``rolling_window``: the window of the final accuracy (the paper's 20)."""
    out = Path(out)
    if problem := name_problem(name):
        raise ConfigError(f"name = {name!r}: {problem}")
    for key, value in (("rounds", rounds), ("eval_every", eval_every), ("rolling_window", rolling_window)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} = {value!r}: expected an integer >= 1")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out = {str(out)!r} is not empty: expected a new folder for the run")
    out.mkdir(parents=True, exist_ok=True)
    # a group of one, as `fedsl run` writes it ("config" absent: there is none to resume from)
    atomic_write(out / "group.json", lambda p: p.write_text(json.dumps(
        {"name": name, "description": "a run built in Python", "window": rolling_window,
         "runs": {name: {"dir": name, "variant": name, "base": name, "seed": sim.seed, "params": {}}},
         "sweep": [], "plot": None, "paper": {}, "paper_claims": [], "claims": []}, indent=2)))
    rd = RunDir(out / name)
    rd.create({"name": name, "rounds": rounds, "eval_every": eval_every, "rolling_window": rolling_window,
               "seed": sim.seed, "source": "Python (fedsl.runs.record.run_simulator)",
               "algorithm": {"name": sim.alg.name}, "model": {"name": type(sim.fm.module).__name__},
               "data": {"num_clients": len(sim.fed.clients), "server_size": int(len(sim.fed.server)),
                        "test_size": int(len(sim.fed.y_test))}})
    t0 = time.perf_counter()
    state = sim.initial_state()
    acc0, loss0 = sim.evaluate(state.x, state.clients)
    rd.append_metrics({"round": 0, "accuracy": acc0, "loss": loss0, "rolling_accuracy": acc0, "wall_time": 0.0})
    evaluated: list[tuple[int, float]] = []
    window: deque[tuple[int, float]] = deque()
    status, done = "interrupted", 0
    try:
        for t in range(rounds):
            state, info = sim.round(state, t)
            done = t + 1
            row = {"round": done, "wall_time": round(time.perf_counter() - t0, 4), "gamma": info.gamma,
                   "cos_theta": info.cos_theta, "comm_params": info.comm_params}
            if done % eval_every == 0 or done == rounds:
                acc, loss = sim.evaluate(state.x, state.clients)
                evaluated.append((done, acc))
                window.append((done, acc))  # only the window's evaluations enter the rolling mean, as the runner's
                while window[0][0] <= done - rolling_window:
                    window.popleft()
                roll = metrics.rolling([r for r, _ in window], [a for _, a in window], rolling_window)[-1]
                row.update({"accuracy": acc, "loss": loss, "rolling_accuracy": float(roll)})
                rd.append_metrics(row)  # the evaluated rounds' rows, as `fedsl run` writes them
        status = "completed"
    finally:
        summary = {"name": name, "algorithm": sim.alg.name, "seed": sim.seed, "rounds": rounds,
                   "initial_accuracy": acc0,
                   **metrics.summarize([r for r, _ in evaluated], [a for _, a in evaluated], rolling_window),
                   "status": status, "rounds_done": done, "wall_time": round(time.perf_counter() - t0, 3)}
        rd.write_summary(summary)
    log(f"{name}: {status} after {done} rounds, final accuracy {summary['final_accuracy']:.4f} ({out})")
    return summary
