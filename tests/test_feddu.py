"""FedDU (FedDUAP's dynamic server update), the "D0 only" control and "FedAvg, then fine-tune on D0".

FedDU's rule is checked against hand-computed small cases (pure functions), then as an engine round:
a FedDU round is an FSL round whose γ is the γ_t the rule gives. Stacked runs and Flower are covered
in test_stacked.py and test_flower.py.
"""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import random_federation, run_rounds, tiny_config

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms.base import ClientResults
from fedsl.algorithms.feddu import (
    FedDU,
    effective_steps,
    js_divergence,
    line10_gamma,
    noniid_degree,
    server_share,
)
from fedsl.algorithms.label_counts import LabelCounts, label_counts
from fedsl.algorithms.server_learning import server_steps
from fedsl.algorithms.server_round import server_update
from fedsl.config.schema import ConfigError, validate
from fedsl.engine.executors import SequentialExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model
from fedsl.runs.build import finetune, prepare
from fedsl.runs.runner import run, run_stacked

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30]
LOG2_3 = math.log2(3)


# ----------------------------------------------------------------------------- the rule, by hand

def test_js_divergence_by_hand():
    assert js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)  # disjoint supports: 1 bit
    assert js_divergence([0.3, 0.7], [0.3, 0.7]) == 0.0
    # p = (½, ½), q = (1, 0): m = (¾, ¼); KL(p‖m) = 1 - ½log2 3, KL(q‖m) = 2 - log2 3
    assert js_divergence([0.5, 0.5], [1, 0]) == pytest.approx(1.5 - 0.75 * LOG2_3)
    assert js_divergence([1, 0], [0.5, 0.5]) == pytest.approx(1.5 - 0.75 * LOG2_3)  # symmetric
    # counts are normalised first; D is against the overall distribution
    assert noniid_degree([6, 2], [6, 6]) == pytest.approx(js_divergence([0.75, 0.25], [0.5, 0.5]))
    assert noniid_degree([5, 5], [3, 3]) == 0.0


def test_server_share_by_hand():
    # α_t = (1 - acc)·n0·D'/(n0·D' + n'·D0)·decay^t = 0.4 · 50/(50 + 30) · 0.9² = 0.2025
    assert server_share(0.6, 100, 0.5, 300, 0.1, 0.9, 2) == pytest.approx(0.2025)
    assert server_share(0.6, 100, 0.5, 300, 0.0, 1.0, 0) == pytest.approx(0.4)  # an IID D0 takes all of 1 - acc
    assert server_share(0.6, 100, 0.0, 300, 0.1, 1.0, 0) == 0.0  # IID clients: nothing for D0 to correct
    assert server_share(1.0, 100, 0.5, 300, 0.1, 1.0, 0) == 0.0  # x̄ already fits D0
    assert effective_steps(0.2025, 8) == pytest.approx(1.62)
    assert line10_gamma(1.0, 1.62, 4) == pytest.approx(0.405)  # τ_eff/K0
    assert line10_gamma(0.5, 9.0, 4) == 0.5  # capped at γ: at most K0 steps' worth
    assert line10_gamma(1.0, 1.0, 0) == 0.0


def test_feddu_gamma_by_hand():
    """Clients 0 and 2 of three; their pooled labels (6, 2) against the overall (6, 6), D0's (1, 3): the same
    JS degree, so the data ratio is n0/(n0 + n') = 4/12; acc_t = ¼ on x̄; decay 0.5 at t = 1; τ̄ = 4, K0 = 2:
    γ_t = γ · (¾ · ⅓ · 0.5) · 4 / 2 = γ/4."""
    counts = LabelCounts(np.array([[4.0, 0], [0, 4], [2, 2]]), np.array([1.0, 3]))
    seen = []

    def acc(x):
        seen.append(x)
        return 0.25
    sl = ServerLearning(gamma=0.8, lr=0.1, batch_size=2, epochs=1, steps=2)
    x_bar = {"w": torch.zeros(2)}
    results = ClientResults({"w": torch.zeros(2, 2)}, [4, 4], (3, 5), (0, 2))
    rule = FedDU(global_lr=1.0, feddu_decay=0.5)
    assert rule.server_gamma(0.8, x_bar, results, 1, sl, 4, counts, acc) == pytest.approx(0.2)
    assert seen == [x_bar]  # acc_t is x̄_t's
    assert rule.server_gamma(0.8, x_bar, None, 1, sl, 4, counts, acc) == 0.0  # no client update: no server step
    iid = replace(results, sizes=[4], steps=(4,), ids=(2,))  # IID clients: α_t = 0, no accuracy measured
    assert rule.server_gamma(0.8, x_bar, iid, 1, sl, 4, counts, acc) == 0.0 and len(seen) == 1
    with pytest.raises(ValueError, match="ClientResults.ids must name them"):
        rule.server_gamma(0.8, x_bar, replace(results, ids=()), 1, sl, 4, counts, acc)


def test_label_counts_and_k0():
    y = torch.tensor([0, 1, 1, 2, 2, 2, 0])
    c = label_counts(y, [np.array([0, 1]), np.array([3, 4, 5])], np.array([2, 6]), 3)
    assert c.clients.tolist() == [[1, 1, 0], [0, 0, 3]] and c.server.tolist() == [1, 1, 0]
    assert c.overall.tolist() == [1, 1, 3] and c.pooled([1]).tolist() == [0, 0, 3]
    assert server_steps(ServerLearning(1.0, 0.1, batch_size=5, epochs=2), 12) == 6  # E_s·⌈n0/B0⌉
    assert server_steps(ServerLearning(1.0, 0.1, batch_size=5, epochs=2, steps=7), 12) == 7


@pytest.mark.parametrize("decay", [0.0, -0.5, 1.5, math.nan])
def test_bad_decay_is_one_line(decay):
    with pytest.raises(ValueError, match=r"algorithm.feddu_decay = .*expected a number in \(0, 1\]"):
        FedDU(global_lr=1.0, feddu_decay=decay)


# ----------------------------------------------------------------------------- in the engine

def _sim(name, fed, *, gamma=0.8, lr=0.1, seed=11, **hp):
    fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    sl = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1)
    alg = make_algorithm(name, LocalTraining(lr, 8), 1.7, sl, **hp)
    return Simulator(fm, fed, alg, SequentialExecutor(fm), 3, seed=seed)


def test_a_feddu_round_is_an_fsl_round_at_the_rules_gamma():
    """Round t of FedDU = round t of FSL with γ = the γ_t FedDU's rule gives from the round's clients and x̄_t
    (computed here from the pure functions and the engine's accuracy of x̄_t on D0)."""
    fed = random_federation(SIZES, seed=0)
    du = _sim("feddu", fed, feddu_decay=0.9)
    st, _ = run_rounds(du, 2)  # x_2
    t = 2
    work = du.sample(t)
    finals, _ = du.train_clients(st, work, t)
    x_bar = {n: p + 1.7 * (finals[n] - p).mean(0) for n, p in st.x.items()}
    counts = du.label_counts()
    d_round = noniid_degree(counts.pooled(work.ids), counts.overall)
    d_server = noniid_degree(counts.server, counts.overall)
    alpha = server_share(du.d0_accuracy(x_bar), fed.n0, d_round, sum(work.sizes), d_server, 0.9, t)
    k0 = math.ceil(fed.n0 / 6)
    gamma_t = line10_gamma(0.8, effective_steps(alpha, sum(work.steps) / len(work.steps)), k0)
    assert 0 < gamma_t < 0.8

    new, info = du.round(st, t)
    assert info.gamma == pytest.approx(gamma_t, rel=1e-12) and info.server_steps == k0
    fsl = _sim("fsl", fed, gamma=info.gamma)
    same, fsl_info = fsl.round(st, t)
    assert all(torch.equal(new.x[n], same.x[n]) for n in new.x)
    assert fsl_info.gamma == info.gamma


def test_feddu_without_client_updates_keeps_x():
    """A deployment's round whose replies were all lost: x̄ = x_t and FedDU's γ_t = 0, so x_{t+1} = x_t."""
    fed = random_federation(SIZES, seed=0)
    du = _sim("feddu", fed)
    st = du.initial_state()
    new, metrics = server_update(du.alg, st, None, 0, du.server)
    assert metrics.gamma == 0.0
    assert all(torch.equal(new.x[n], st.x[n]) for n in st.x)


def test_d0_only_is_server_sgd_from_x_t_whatever_the_clients():
    """D0 only: x_{t+1} = LocalSGD(x_t, γ·η0, K0, D0); the clients' settings change nothing."""
    fed = random_federation(SIZES, seed=0)
    a, b = _sim("d0_only", fed), _sim("d0_only", fed, lr=0.5)
    sa, ia = run_rounds(a, 3)
    sb, _ = run_rounds(b, 3)
    assert all(torch.equal(sa.x[n], sb.x[n]) for n in sa.x)
    x = a.initial_state().x
    for t in range(3):
        x, k0 = a.server_sgd(x, t, 0.8 * 0.05)
        assert k0 == ia[t].server_steps > 0
    assert all(torch.equal(sa.x[n], x[n]) for n in x)
    assert {i.comm_params for i in ia} == {0}
    fsl, _ = run_rounds(_sim("fsl", fed), 3)  # the clients do matter to FSL
    assert not all(torch.equal(sa.x[n], fsl.x[n]) for n in x)


# ----------------------------------------------------------------------------- configs and runs

def _cfg(alg="fsl", rounds=2, **server):
    data = tiny_config(rounds=rounds, alg=alg)
    data["server"] = server
    return validate(data)


def test_feddu_defaults_eta0_to_eta_l():
    hp = {h.symbol: h for h in prepare(_cfg("feddu")).hparams}
    assert hp["η0"].value == 0.05 and hp["η0"].source == "FedDU default η_l"
    assert {h.symbol: h for h in prepare(_cfg("feddu", lr=0.2)).hparams}["η0"].value == 0.2
    assert {h.symbol: h for h in prepare(_cfg("fsl")).hparams}["η0"].source == "paper default √S·η_l·K/K0"


@pytest.mark.parametrize("section, key, value, fragment", [
    ("server", "finetune_epochs", -1, "server.finetune_epochs = -1: Input should be greater than or equal to 0"),
    ("server", "finetune_epochs", 10**5, "server.finetune_epochs = 100000: Input should be less than or equal to"),
    ("server", "finetune_epochs", 1.5, "server.finetune_epochs = 1.5"),
    ("server", "finetune_lr", 0, "server.finetune_lr = 0: Input should be greater than 0"),
    ("algorithm", "feddu_decay", 0, "algorithm.feddu_decay = 0: Input should be greater than 0"),
])
def test_bad_values_are_one_line(section, key, value, fragment):
    data = tiny_config(alg="feddu")
    data.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as e:
        validate(data)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_decay_above_one_and_missing_d0_are_one_line():
    data = tiny_config(alg="feddu")
    data["algorithm"]["feddu_decay"] = 1.5
    with pytest.raises(ConfigError, match=r"^algorithm.feddu_decay = 1.5: Input should be less than or equal to 1 "):
        validate(data)
    data = tiny_config(alg="feddu")
    data["server"] = {"gamma_schedule": "adaptive"}
    with pytest.raises(ConfigError, match="^server.gamma_schedule = 'adaptive' adapts γ .* FedDU sets γ_t itself"):
        validate(data)
    data["server"] = {"gamma_schedule": "cosine", "gamma_final": 0.1}  # other schedules multiply in
    assert validate(data).server.gamma_schedule == "cosine"
    for alg, server in (("feddu", {}), ("d0_only", {}), ("fedavg", {"finetune_epochs": 2})):
        data = tiny_config(alg=alg)
        data["data"]["server_size"] = 0
        data["server"] = server
        with pytest.raises(ConfigError, match="needs server data|fine-tunes on D0: expected data.server_size > 0"):
            validate(data)


def test_finetune_after_the_last_round(tmp_path):
    """server.finetune_epochs: E epochs of SGD on D0 from x_T, its test accuracy in summary.json; runs stacked
    give the same numbers as runs one by one; without the key no field."""
    plain = run(_cfg("fedavg"), tmp_path / "plain", log=lambda m: None, progress=False)
    assert "final_accuracy_finetuned" not in plain
    cfg = _cfg("fedavg", finetune_epochs=3, finetune_lr=0.1)
    s = run(cfg, tmp_path / "one", log=lambda m: None, progress=False)
    x_t = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)["params"]
    sim = prepare(cfg).sim
    expected = sim.evaluate(sim.finetune(x_t, 3, 0.1, 8))
    assert (s["final_accuracy_finetuned"], s["final_loss_finetuned"]) == expected
    assert s["finetune"] == {"epochs": 3, "lr": 0.1, "batch_size": 8}
    assert s["final_accuracy"] == plain["final_accuracy"]  # the rounds themselves are FedAvg's
    assert expected != sim.evaluate(x_t)  # fine-tuning moved the model
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["final_accuracy_finetuned"] == expected[0]
    other = _cfg("fedavg", finetune_epochs=3, finetune_lr=0.1)
    stacked = run_stacked([cfg, other.model_copy(update={"seed": 4})], [tmp_path / "s0", tmp_path / "s1"],
                          log=lambda m: None, progress=False)
    assert stacked[0]["final_accuracy_finetuned"] == s["final_accuracy_finetuned"]
    assert "final_accuracy_finetuned" in stacked[1]
    assert finetune(sim, _cfg("fedavg"), x_t) is None


def test_feddu_resumes_bit_identically(tmp_path):
    """FedDU keeps no state beyond the model (its label counts are remade, its γ_t recomputed): a run stopped
    after 2 rounds and resumed ends where an uninterrupted one does, γ_t included."""
    cfg = _cfg("feddu", rounds=4)
    whole = run(cfg, tmp_path / "whole", log=lambda m: None, progress=False)
    run(cfg, tmp_path / "cut", log=lambda m: None, progress=False, stop_after=2)
    cut = run(cfg, tmp_path / "cut", resume=True, log=lambda m: None, progress=False)
    assert cut["status"] == whole["status"] == "completed" and cut["final_accuracy"] == whole["final_accuracy"]
    rows = [(tmp_path / d / "metrics.csv").read_text().splitlines() for d in ("whole", "cut")]
    gammas = [[r.split(",")[5] for r in rs[1:]] for rs in rows]
    assert gammas[0] == gammas[1] and any(g not in ("", "0.0") for g in gammas[0])
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["params"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(a[n], b[n]) for n in a)
