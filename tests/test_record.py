"""A run built in Python (the Python API tutorial's own Simulator) kept in the standard run folder
(``fedsl.runs.record.run_simulator``): its metrics are the loop's, and `fedsl show` / `fedsl report` read it."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import random_federation
from torch import nn

from fedsl import FunctionalModel, LocalTraining, Simulator, make_algorithm, make_executor
from fedsl.cli import main
from fedsl.config.base import ConfigError
from fedsl.runs.record import run_simulator
from fedsl.runs.results import RunDir


def _sim() -> Simulator:
    fed = random_federation([10, 12, 8, 10])
    fm = FunctionalModel(nn.Sequential(nn.Flatten(), nn.Linear(fed.x[0].numel(), 8, dtype=torch.float64), nn.ReLU(),
                                       nn.Linear(8, fed.num_classes, dtype=torch.float64)), seed=0)
    alg = make_algorithm("fedavg", LocalTraining(lr=0.1, batch_size=4), global_lr=1.0, server=None)
    return Simulator(fm, fed, alg, make_executor("sequential", fm, torch.device("cpu")), clients_per_round=2, seed=0)


def test_a_python_run_writes_the_standard_folder_that_show_and_report_read(tmp_path, capsys, one_thread):
    summary = run_simulator(_sim(), tmp_path / "mine", rounds=6, name="mine", eval_every=2, log=lambda s: None)
    sim, rows = _sim(), RunDir(tmp_path / "mine" / "mine").read_metrics()
    state = sim.initial_state()
    expected = [(0, *sim.evaluate(state.x))]
    for t in range(6):
        state, _ = sim.round(state, t)
        if (t + 1) % 2 == 0:
            expected.append((t + 1, *sim.evaluate(state.x)))
    assert [(r["round"], r["accuracy"], r["loss"]) for r in rows] == expected  # the evaluated rounds' rows
    assert summary["status"] == "completed" and summary["rounds_done"] == 6
    assert json.loads((tmp_path / "mine" / "mine" / "summary.json").read_text()) == summary
    capsys.readouterr()
    assert main(["show", str(tmp_path / "mine")]) == 0
    shown = capsys.readouterr().out
    assert "mine" in shown and "completed" in shown and f"{summary['final_accuracy']:.4f}" in shown
    assert main(["report", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "report" / "report.md").is_file()


def test_bad_arguments_and_a_used_folder_are_refused_in_one_line(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    for kwargs, needle in (({"rounds": 0}, "rounds = 0: expected an integer >= 1"),
                           ({"rounds": 2, "eval_every": 1.5}, "eval_every = 1.5: expected an integer >= 1"),
                           ({"rounds": 2, "name": "a/b"}, "name = 'a/b'")):
        with pytest.raises(ConfigError, match=needle):
            run_simulator(_sim(), tmp_path / "new", **kwargs)
    with pytest.raises(ConfigError, match="is not empty: expected a new folder"):
        run_simulator(_sim(), tmp_path / "used", rounds=2)
