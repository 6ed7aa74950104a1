"""Per-client accuracy (``eval_per_client``, ``fedsl.engine.per_client``): each client's accuracy is the global
model's test accuracy on its label mix, summarised as mean, population std and the worst 10%, by hand; a run that
measures it writes the columns and summary.json's final values, and trains exactly as one that does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_config

from fedsl.config.schema import ConfigError, validate
from fedsl.engine import per_client as P
from fedsl.runs.results import RunDir
from fedsl.runs.runner import run


def test_client_accuracies_by_hand():
    """3 classes, test accuracy per class [1, 0.5, NaN (no test sample)]; client 0 holds labels (0, 0, 1): 2/3·1 +
    1/3·0.5 = 5/6; client 1 holds (1, 2): class 2 drops out, so 0.5; client 2 holds (2) only: no value."""
    mix = np.array([[2, 1, 0], [0, 1, 1], [0, 0, 3]], dtype=np.float64)
    mix /= mix.sum(1, keepdims=True)
    acc = P.client_accuracies(mix, np.array([1.0, 0.5, math.nan]))
    assert acc[:2].tolist() == pytest.approx([5 / 6, 0.5], abs=1e-15) and math.isnan(acc[2])
    s = P.summarise(acc)
    assert s == pytest.approx({"client_acc_mean": (5 / 6 + 0.5) / 2, "client_acc_std": (5 / 6 - 0.5) / 2,
                               "client_acc_worst10": 0.5}, abs=1e-15)
    # the worst 10% of 25 clients is the mean of the worst ⌈2.5⌉ = 3
    assert P.summarise(np.arange(25) / 24)["client_acc_worst10"] == pytest.approx((0 + 1 + 2) / 3 / 24, abs=1e-15)


def test_class_accuracy_and_label_mix_on_a_federation(tmp_path):
    """acc_c from the model's own predictions per test class, p_i(c) from the clients' training labels."""
    from fedsl.runs.build import prepare
    sim = prepare(validate(tiny_config(rounds=1, alg="fedavg"))).sim
    fed, x = sim.fed, sim.initial_state().x
    acc_c = P.class_accuracy(sim.fm, x, fed.x_test, fed.y_test, fed.num_classes)
    with torch.no_grad():
        sim.fm.train(False)
        pred = sim.fm.forward(x, fed.x_test).argmax(1)
    for c in range(fed.num_classes):
        at = fed.y_test == c
        assert acc_c[c] == (pred[at] == c).double().mean().item() if at.any() else math.isnan(acc_c[c])
    mix = P.label_mix(fed)
    for i in range(len(fed.clients)):
        own = fed.y[torch.as_tensor(fed.clients.own(i))]
        assert mix[i].tolist() == (torch.bincount(own, minlength=fed.num_classes) / len(own)).tolist()


def test_a_run_measures_it_at_every_evaluation_and_trains_as_one_that_does_not(tmp_path):
    base = tiny_config(rounds=4, alg="fsl", dtype="float64", executor="sequential", eval_every=2,
                       eval_final_window=False)
    quiet = {"log": lambda s: None, "progress": False}
    plain = run(validate(base), tmp_path / "plain", **quiet)
    measured = run(validate({**base, "eval_per_client": True}), tmp_path / "measured", **quiet)
    rows, ref = RunDir(tmp_path / "measured").read_metrics(), RunDir(tmp_path / "plain").read_metrics()
    assert [r["round"] for r in rows] == [0, 2, 4]
    for r, q in zip(rows, ref):
        assert {k: r[k] for k in ("accuracy", "loss", "rolling_accuracy")} == \
               {k: q[k] for k in ("accuracy", "loss", "rolling_accuracy")}
        assert 0 <= r["client_acc_worst10"] <= r["client_acc_mean"] <= 1 and r["client_acc_std"] >= 0
    assert "client_acc_mean" not in ref[0]
    assert measured["final_accuracy"] == plain["final_accuracy"]
    assert {k: measured[f"final_{k}"] for k in P.COLUMNS} == {k: rows[-1][k] for k in P.COLUMNS}
    assert "final_client_acc_mean" not in plain


def test_a_dataset_made_on_demand_refuses_it_in_one_line():
    with pytest.raises(ConfigError, match=r"eval_per_client = true reads every client's labels, and data.dataset = "
                                          r"'synthetic_fedprox' makes each client's samples when it is sampled"):
        validate({"rounds": 2, "eval_per_client": True, "model": {"name": "logreg"},
                  "data": {"dataset": "synthetic_fedprox", "num_clients": 12, "server_size": 20},
                  "algorithm": {"name": "fedavg", "clients_per_round": 3, "batch_size": 5}})


def test_on_flower_a_replayed_run_measures_it_as_the_simulator_and_an_open_one_refuses_it(one_thread,
                                                                                          flower_task_identity):
    """The ServerApp's evaluations.json rows carry the clients' accuracies (the server rebuilds every partition in a
    replayed federation), equal to the simulator's of the same model; an open federation, whose clients keep their
    labels to themselves, refuses the key in one line."""
    pytest.importorskip("flwr")
    from conftest import FLOWER_RUN
    from test_flower import LoopGrid, run_simulator

    from fedsl.flower import FedslStrategy, load_setup, parse_run_config
    from fedsl.flower.records import to_record
    rc = {**FLOWER_RUN, "rounds": 2, "eval_per_client": True}
    setup = load_setup(rc)
    strategy = FedslStrategy(setup)
    strategy.start(LoopGrid(rc, {100 + i: i for i in range(setup.num_clients)}), to_record(strategy.state.x),
                   num_rounds=2, timeout=5.0, evaluate_fn=strategy.evaluate)
    last = strategy.evaluations[-1]
    assert last["round"] == 2
    expected, _ = run_simulator(rc)
    sim = strategy.sim
    assert {k: last[k] for k in P.COLUMNS} == sim.evaluate_clients(expected.x)
    with pytest.raises(ConfigError, match=r"^eval_per_client = true weighs the test accuracy by each client's label "
                                          r"mix, which open clients do not report: set the run config key federation"):
        parse_run_config({**rc, "federation": "open"})
