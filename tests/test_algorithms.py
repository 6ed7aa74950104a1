import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_federation

from fedsl.algorithms import LocalTraining, Pretraining, ServerLearning, defaults, make_algorithm
from fedsl.algorithms.fedavg import client_weights, fedavg_step
from fedsl.config.resolve import resolve
from fedsl.config.schema import validate
from fedsl.data.federation import Federation
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel, full_gradient
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model

SIZES = [15, 22, 9, 30, 18, 12]


def _sim(alg, fed, model="small_cnn", executor=SequentialExecutor, S=3, seed=5):
    fm = FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=1).to(fed.x.dtype))
    return Simulator(fm, fed, alg, executor(fm), S, seed=seed)


def _rounds(sim, rounds, pretrain=None):
    st = sim.initial_state(pretrain)
    for t in range(rounds):
        st, _ = sim.round(st, t)
    return st.x


@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_gamma_zero_and_k0_zero_reproduce_fedavg_exactly(executor):
    fed = random_federation(SIZES, dtype=torch.float32)
    local = LocalTraining(0.1, 5)
    ref = _rounds(_sim(make_algorithm("fedavg", local, 1.5, None), fed, executor=executor), 4)
    for server in (ServerLearning(0.0, 0.3, 4, 2), ServerLearning(1.0, 0.3, 4, 2, steps=0)):
        for name in ("fsl", "fsl_p"):
            got = _rounds(_sim(make_algorithm(name, local, 1.5, server), fed, executor=executor), 4)
            assert all(torch.equal(ref[n], got[n]) for n in ref), (name, server)
    # and server learning with gamma > 0 does change the model
    got = _rounds(_sim(make_algorithm("fsl", local, 1.5, ServerLearning(1.0, 0.3, 4, 2)), fed, executor=executor), 4)
    assert not all(torch.equal(ref[n], got[n]) for n in ref)


def test_fsl_with_one_client_one_full_batch_step_is_incremental_gradient():
    """N = 1, K = 1, full batches: x̄ = x - η_g η_l ∇F(x), then x' = x̄ - γ η0 ∇f0(x̄) (computed by hand)."""
    fed = random_federation([20], n0=7, dtype=torch.float64)
    eta_l, eta_g, gamma, eta0 = 0.3, 1.4, 0.7, 0.2
    alg = make_algorithm("fsl", LocalTraining(eta_l, 20, steps=1), eta_g,
                         ServerLearning(gamma, eta0, batch_size=7, epochs=1, steps=1))
    sim = _sim(alg, fed, model="mlp", S=1)
    got = _rounds(sim, 3)

    model = build_model("mlp", fed.num_classes, fed.input_shape, seed=1).double()
    w = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]

    def loss(ws, idx):
        out = torch.func.functional_call(model, dict(zip(names, ws)), (fed.x[idx],))
        return F.cross_entropy(out, fed.y[idx])

    client, server = torch.from_numpy(fed.clients[0]), torch.from_numpy(fed.server)
    for _ in range(3):
        g = torch.autograd.grad(loss(w, client), w)
        w = [(p - eta_g * eta_l * gi).detach().requires_grad_(True) for p, gi in zip(w, g)]
        g0 = torch.autograd.grad(loss(w, server), w)
        w = [(p - gamma * eta0 * gi).detach().requires_grad_(True) for p, gi in zip(w, g0)]
    for n, p in zip(names, w):
        assert torch.allclose(got[n], p, atol=1e-12, rtol=0), n


def test_ds_objective_is_f_plus_weighted_f0():
    """F' = Σ p'_i f'_i over D'_i = D_i ∪ D0 equals n/(n+N n0)·(F + N n0/n·f0) (paper Eq. for DS)."""
    fed = random_federation(SIZES, n0=8, dtype=torch.float64)
    sim = _sim(make_algorithm("ds", LocalTraining(0.1, 5), 1.0, None), fed, model="linear")
    fm, params = sim.fm, sim.initial_params()
    N, n, n0 = fed.num_clients, fed.n, fed.n0

    def f(idx):  # mean loss and gradient over a set of samples
        idx = torch.from_numpy(np.asarray(idx))
        with torch.no_grad():
            val = F.cross_entropy(fm.forward(params, fed.x[idx]), fed.y[idx]).item()
        return val, full_gradient(fm, params, fed.x[idx], fed.y[idx])

    assert all(len(d) == len(c) + n0 for d, c in zip(sim.client_data, fed.clients))  # DS data
    lhs_v, lhs_g = 0.0, {k: torch.zeros_like(v) for k, v in params.items()}
    for d in sim.client_data:
        v, g = f(d)
        p_i = len(d) / (n + N * n0)
        lhs_v += p_i * v
        for k in g:
            lhs_g[k] += p_i * g[k]
    F_v, F_g = f(np.concatenate(fed.clients))
    f0_v, f0_g = f(fed.server)
    c = n / (n + N * n0)
    assert lhs_v == pytest.approx(c * (F_v + N * n0 / n * f0_v), abs=1e-12)
    for k in params:
        assert torch.allclose(lhs_g[k], c * (F_g[k] + N * n0 / n * f0_g[k]), atol=1e-12)


def test_fsl_p_default_weight_is_server_share_of_round_data():
    sl = ServerLearning(1.0, 0.1, 4, 1, mode="parallel")
    assert sl.parallel_weight(50, [100, 200, 150]) == pytest.approx(50 / 500)
    assert ServerLearning(1.0, 0.1, 4, 1, weight=0.3).parallel_weight(50, [100]) == 0.3


def test_fsl_p_aggregates_server_update_with_weight():
    """With η_l -> 0 the clients do not move, so x' = x + η_g·w0·Δ0 exactly."""
    fed = random_federation(SIZES, n0=8, dtype=torch.float64)
    server = ServerLearning(1.0, 0.2, 4, 1, weight=0.25)
    sim = _sim(make_algorithm("fsl_p", LocalTraining(1e-300, 5), 2.0, server), fed, model="linear")
    st = sim.initial_state()
    x = st.x
    got, _ = sim.round(st, 0)
    got = got.x
    x0, _ = sim.server_sgd(x, 0, 1.0 * 0.2)  # lr = γ·η0
    for k in x:
        assert torch.allclose(got[k], x[k] + 2.0 * 0.25 * (x0[k] - x[k]), atol=1e-12)


def test_fedavg_step_is_x_plus_eta_g_mean_delta():
    x = {"w": torch.tensor([1.0, 2.0])}
    clients = {"w": torch.tensor([[2.0, 2.0], [1.0, 4.0]])}
    out = fedavg_step(x, clients, client_weights([10, 30], weighted=False), global_lr=2.0)
    assert torch.allclose(out["w"], torch.tensor([1.0 + 2 * 0.5, 2.0 + 2 * 1.0]))
    out = fedavg_step(x, clients, client_weights([10, 30], weighted=True), global_lr=1.0)
    assert torch.allclose(out["w"], torch.tensor([1.0 + 0.25, 2.0 + 1.5]))


def test_pretraining_moves_towards_server_data_only():
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)
    sim = _sim(make_algorithm("fsl", LocalTraining(0.1, 5), 1.0, ServerLearning(1.0, 0.1, 5, 1)), fed, model="mlp")
    x0 = sim.initial_params()
    xp = sim.initial_params(Pretraining(epochs=30, lr=0.1, batch_size=5))
    loss = lambda p: F.cross_entropy(sim.fm.forward(p, fed.x[torch.from_numpy(fed.server)]),
                                     fed.y[torch.from_numpy(fed.server)]).item()
    sim.fm.train(False)
    assert loss(xp) < 0.5 * loss(x0)


class _CountingExecutor(SequentialExecutor):
    calls = 0

    def local_sgd(self, *args, **kwargs):
        type(self).calls += 1
        return super().local_sgd(*args, **kwargs)


def test_pretraining_is_shared_between_runs_with_the_same_inputs_only():
    """Runs of a sweep that share D0, the model and the seed pretrain once; any change of an
    input of pretraining (D0's samples, the seed, the schedule, the initial weights) recomputes."""
    from fedsl.engine import simulator
    simulator._PRETRAINED.clear()
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)
    pre = Pretraining(epochs=3, lr=0.1, batch_size=5)

    def x0(fed=fed, pre=pre, seed=5, alg="fsl", init_seed=1):
        fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=init_seed).double())
        algorithm = make_algorithm(alg, LocalTraining(0.1, 5), 1.0, ServerLearning(1.0, 0.1, 5, 1))
        return Simulator(fm, fed, algorithm, _CountingExecutor(fm), 3, seed=seed).initial_params(pre)

    _CountingExecutor.calls = 0
    first = x0()
    assert _CountingExecutor.calls == 1
    again = x0(alg="ds")  # another algorithm (γ, η_l, ...) of the same sweep: no recomputation
    assert _CountingExecutor.calls == 1 and all(torch.equal(first[n], again[n]) for n in first)
    again[next(iter(again))].add_(1.0)  # a caller's in-place change does not reach the cache
    assert all(torch.equal(first[n], x0()[n]) for n in first)

    other_x = fed.x.clone()
    other_x[torch.from_numpy(fed.server[:1])] += 1.0  # one of D0's images changed
    changes = [dict(fed=replace(fed, x=other_x)), dict(seed=6), dict(init_seed=2),
               dict(pre=Pretraining(epochs=4, lr=0.1, batch_size=5)), dict(pre=Pretraining(3, 0.2, 5))]
    for k, change in enumerate(changes, start=2):
        got = x0(**change)
        assert _CountingExecutor.calls == k, change
        assert not all(torch.equal(first[n], got[n]) for n in first), change
    # the uncached computation gives the cached value
    simulator._PRETRAINED.clear()
    fresh = x0()
    assert _CountingExecutor.calls == len(changes) + 2 and all(torch.equal(first[n], fresh[n]) for n in first)


# ---------------------------------------------------------------- the paper's default rules

def test_default_rules_scenario_1():
    # CIFAR-10: n = 50,000, N = 10, n0 = 500, S = 4, η_l = 0.01, B = 50 -> K = 100
    assert defaults.server_epochs(50_000, 10, 500) == 10
    assert defaults.server_lr(4, 0.01, 100, 100) == pytest.approx(0.02)
    assert defaults.global_lr(4) == 2.0
    # EMNIST: n = 108,000, N = 45, n0 = 225 -> E_s = ⌈10.67⌉ = 11
    assert defaults.server_epochs(108_000, 45, 225) == 11


def test_default_rules_scenario_2():
    # CIFAR-10: N = 1000, n_i = 50, n0 = 500 -> E_s = ⌈0.1⌉ = 1; EMNIST: N = 450, n_i = 240, n0 = 450 -> 1
    assert defaults.server_epochs(50_000, 1000, 500) == 1
    assert defaults.server_epochs(108_000, 450, 450) == 1
    assert defaults.server_epochs(5000, 10, 500) == 1  # exactly 1, not 2 from float round-off


def _fake_fed(N, n_i, n0, classes=10):
    n = N * n_i + n0
    y = torch.arange(n) % classes
    clients = [np.arange(i * n_i, (i + 1) * n_i) for i in range(N)]
    return Federation(torch.zeros(n, 1, 1, 1), y, clients, np.arange(N * n_i, n), torch.zeros(1, 1, 1, 1),
                      torch.zeros(1, dtype=torch.long), classes, [str(c) for c in range(classes)])


def _cfg(name, S, B, lr, n0):
    return validate({"rounds": 1, "data": {"dataset": "synthetic_chars", "num_clients": max(S, 10), "server_size": n0},
                     "algorithm": {"name": name, "clients_per_round": S, "batch_size": B, "local_lr": lr}})


def test_resolved_hyperparameters_scenario_1_cifar():
    alg, _, hp = resolve(_cfg("fsl", 4, 50, 0.01, 500), _fake_fed(10, 5000, 500))
    sl = alg.server_learning
    assert alg.global_lr == 2.0 and sl.epochs == 10 and sl.batch_size == 50 and sl.gamma == 1.0
    table = {h.symbol: h for h in hp}
    assert table["K"].value == 100 and table["K0"].value == 100
    assert sl.lr == pytest.approx(0.02)
    assert table["η0"].source.startswith("paper default")


def test_the_printed_table_labels_a_value_set_only_when_the_config_gives_it():
    """A rule's own hyper-parameter the config leaves unset is its rule's default, not "[set]" (every one was
    labelled set); so are S, η_l and B; a value the config gives is "[set]", even at the default's value."""
    cfg = validate({"rounds": 1, "data": {"dataset": "synthetic_chars"}, "algorithm": {"name": "fedavgm"}})
    table = {h.symbol: h for h in resolve(cfg, _fake_fed(20, 50, 0))[2]}
    assert (table["β"].value, table["β"].source) == (0.9, "default for fedavgm")
    assert {s: table[s].source for s in ("S", "η_l", "B", "N")} == dict.fromkeys(("S", "η_l", "B", "N"), "default")
    assert table["n_i"].source == "derived"  # n / N, never set
    cfg = validate({"rounds": 1, "data": {"dataset": "synthetic_chars", "num_clients": 20},
                    "algorithm": {"name": "fedavgm", "momentum": 0.9, "clients_per_round": 5}})
    table = {h.symbol: h for h in resolve(cfg, _fake_fed(20, 50, 0))[2]}
    assert {s: table[s].source for s in ("β", "S", "N", "η_l")} == {"β": "set", "S": "set", "N": "set",
                                                                    "η_l": "default"}


def test_resolved_hyperparameters_scenario_2_cifar():
    alg, _, hp = resolve(_cfg("fsl", 10, 10, 0.05, 500), _fake_fed(1000, 50, 500))
    table = {h.symbol: h.value for h in hp}
    assert table["K"] == 5 and table["E_s"] == 1 and table["K0"] == 50
    assert alg.server_learning.lr == pytest.approx(math.sqrt(10) * 0.05 * 5 / 50)
    assert alg.global_lr == pytest.approx(math.sqrt(10))
    # server.steps fixes K0: E_s is not read, so the table does not list it (it printed 'E_s 1 [paper default]')
    cfg = _cfg("fsl", 10, 10, 0.05, 500)
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"steps": 7})})
    table = {h.symbol: h for h in resolve(cfg, _fake_fed(1000, 50, 500))[2]}
    assert "E_s" not in table and (table["K0"].value, table["K0"].source) == (7, "set")
