"""The baselines (FedProx, FedAvgM, FedAdam, SCAFFOLD, FedDyn) and their composition with server learning.

- both executors agree on every rule, alone and with incremental server learning (model and rule state);
- the rules' defining identities, recomputed by hand in the tests (autograd on plain tensors);
- server learning composes (γ = 0 is the rule alone; the next round starts from the post-SL model);
- resume is bit-identical for stateful rules; bad compositions are one-line config errors.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import clone_state, flat_state, random_federation, run_rounds

from fedsl.algorithms import LocalTraining, ServerLearning, check_server_learning, make_algorithm
from fedsl.config import schema as C
from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import make_plan
from fedsl.engine.simulator import RunState, Simulator
from fedsl.models import build_model
from fedsl.runs.results import RunDir
from fedsl.runs.runner import run

# uneven clients: with B = 8 they take 2, 3 or 4 steps and the last batch of an epoch is
# partial, so the vectorised executor pads with no-op steps (where a correction must not act)
SIZES = [9, 31, 17, 24, 12, 30, 16, 20]
SMALL = [15, 22, 9, 30, 18, 12]  # with B = 5: K_i = 3, 5, 2, 6, 4, 3
HP = {"fedprox": {"mu": 0.3}, "fedavgm": {"momentum": 0.9}, "fedadam": {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
      "scaffold": {}, "feddyn": {"alpha": 0.1}}
GLOBAL_LR = {"fedavg": 1.7, "fedprox": 1.7, "fedavgm": 1.0, "fedadam": 0.1, "scaffold": 1.7, "feddyn": 1.0}
SL = ServerLearning(gamma=0.8, lr=0.05, batch_size=6, epochs=1)


pytestmark = pytest.mark.usefixtures("one_thread")


def _sim(name, fed, *, executor=SequentialExecutor, model="mlp", local=LocalTraining(0.1, 8), global_lr=None,
         server=None, S=5, seed=11, **hp):
    fm = FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    alg = make_algorithm(name, local, GLOBAL_LR[name] if global_lr is None else global_lr, server,
                         **{**HP.get(name, {}), **hp})
    return Simulator(fm, fed, alg, executor(fm), S, seed=seed)


_clone = clone_state


_run = run_rounds


_flat = flat_state


def _equal(a: RunState, b: RunState) -> bool:
    fa, fb = _flat(a), _flat(b)
    return fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


def _close(a: dict, b: dict, atol=1e-12) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=0, atol=atol), (n, (a[n] - b[n]).abs().max().item())


# ---------------------------------------------------------------- by hand: plain autograd, no engine code

def _grad(module, params, x, y):
    """∇ of the mean cross-entropy on (x, y) at ``params``."""
    p = {n: v.detach().clone().requires_grad_(True) for n, v in params.items()}
    loss = F.cross_entropy(torch.func.functional_call(module, p, (x,)), y)
    return dict(zip(p, torch.autograd.grad(loss, list(p.values()))))


def _plan(sim, t):
    """The round's sampled clients and batch plan, as the simulator draws them."""
    ids = rng.sample_clients(sim.seed, t, sim.fed.num_clients, sim.S)
    loc = sim.alg.local
    plan = make_plan([sim.client_data[i] for i in ids], ids.tolist(), loc.batch_size, loc.epochs, loc.steps,
                     sim.seed, t, rng.CLIENT_BATCHES)
    return ids, plan


def _local(sim, x, plan, j, prox=0.0, linear=None):
    """Client j's LocalSGD from x with the corrected gradient g + prox·(y - x) + linear, by hand."""
    lr, p = sim.alg.local.lr, dict(x)
    for k in range(plan.steps[j]):
        idx = plan.idx[j, k][plan.weight[j, k] > 0]
        g = _grad(sim.fm.module, p, sim.fed.x[idx], sim.fed.y[idx])
        p = {n: p[n] - lr * (g[n] + prox * (p[n] - x[n]) + (0 if linear is None else linear[n])) for n in p}
    return p


def _scaffold_by_hand(sim, before: RunState, t):
    """Round t of SCAFFOLD (option II) from ``before``: (ids, K_i, x̄, c, sampled c_i⁺)."""
    ids, plan = _plan(sim, t)
    x, c, c_i = before.x, before.algo["c"], before.clients["c_i"]
    eta_l, N = sim.alg.local.lr, sim.fed.num_clients
    ys = [_local(sim, x, plan, j, linear={n: c[n] - c_i[n][i] for n in x}) for j, i in enumerate(ids)]
    new_ci = [{n: c_i[n][i] - c[n] + (x[n] - y[n]) / (plan.steps[j] * eta_l) for n in x}
              for j, (i, y) in enumerate(zip(ids, ys))]
    new_c = {n: c[n] + sum(ci[n] - c_i[n][i] for i, ci in zip(ids, new_ci)) / N for n in x}
    x_bar = {n: x[n] + sim.alg.global_lr * sum(y[n] - x[n] for y in ys) / len(ys) for n in x}
    return ids, plan.steps, x_bar, new_c, new_ci


def _feddyn_by_hand(sim, before: RunState, t):
    """Round t of FedDyn from ``before``: (ids, θ_i, θ^t, h, sampled ∇L_i⁺)."""
    ids, plan = _plan(sim, t)
    x, h, gi = before.x, before.algo["h"], before.clients["grad_i"]
    alpha, N = sim.alg.rule.alpha, sim.fed.num_clients
    thetas = [_local(sim, x, plan, j, prox=alpha, linear={n: -gi[n][i] for n in x}) for j, i in enumerate(ids)]
    new_gi = [{n: gi[n][i] - alpha * (th[n] - x[n]) for n in x} for i, th in zip(ids, thetas)]
    new_h = {n: h[n] - alpha / N * sum(th[n] - x[n] for th in thetas) for n in x}
    theta = {n: sum(th[n] for th in thetas) / len(thetas) - new_h[n] / alpha for n in x}
    return ids, thetas, theta, new_h, new_gi


# ---------------------------------------------------------------- 1. executors agree

@pytest.mark.parametrize("with_sl", [False, True], ids=["alone", "sl"])
@pytest.mark.parametrize("name", list(HP))
def test_vectorised_equals_sequential(name, with_sl):
    server = SL if with_sl else None
    for dtype in (torch.float64, torch.float32):
        fed = random_federation(SIZES, n0=14, dtype=dtype)
        (a, ia), (b, ib) = (_run(_sim(name, fed, executor=ex, model="small_cnn", server=server), 3)
                            for ex in (SequentialExecutor, VectorisedExecutor))
        assert len(set(ia[-1].client_steps)) > 1  # padded no-op steps were exercised
        assert [i.server_steps > 0 for i in ia] == [with_sl] * 3
        assert all(np.array_equal(p.clients, q.clients) for p, q in zip(ia, ib))
        fa, fb = _flat(a), _flat(b)
        assert fa.keys() == fb.keys()
        assert name == "fedprox" or len(fa) > len(a.x)  # the rule's state is compared too
        for k in fa:
            if dtype == torch.float64:
                assert torch.allclose(fa[k], fb[k], rtol=0, atol=1e-10), (k, (fa[k] - fb[k]).abs().max().item())
            else:
                scale = fa[k].abs().max().clamp_min(1e-12)
                assert ((fa[k] - fb[k]).abs().max() / scale).item() < 1e-4, k


# ---------------------------------------------------------------- 2. FedProx

@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_fedprox_mu_zero_is_fedavg_exactly(executor):
    fed = random_federation(SIZES, dtype=torch.float32)
    ref, _ = _run(_sim("fedavg", fed, executor=executor, model="small_cnn"), 3)
    got, _ = _run(_sim("fedprox", fed, executor=executor, model="small_cnn", mu=0.0), 3)
    assert all(torch.equal(ref.x[n], got.x[n]) for n in ref.x)
    prox, _ = _run(_sim("fedprox", fed, executor=executor, model="small_cnn", mu=0.5), 3)
    assert not all(torch.equal(ref.x[n], prox.x[n]) for n in ref.x)


@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_fedprox_local_steps_by_hand(executor):
    """Full-batch steps y ← y - η_l(∇f_i(y) + μ(y - x)); x ← x + η_g·mean(y_i - x), 2 rounds."""
    fed = random_federation([6, 9, 7, 5, 8], dtype=torch.float64)
    mu, eta_l, eta_g = 0.8, 0.3, 1.4
    sim = _sim("fedprox", fed, executor=executor, model="linear", local=LocalTraining(eta_l, 9, steps=2),
               global_lr=eta_g, S=3, mu=mu)
    st = sim.initial_state()
    for t in range(2):
        ids, plan = _plan(sim, t)
        x = st.x
        ys = []
        for i in ids:  # by hand, on the client's whole data (each step is one full batch)
            c = torch.from_numpy(fed.clients[i])
            y = dict(x)
            for _ in range(2):
                g = _grad(sim.fm.module, y, fed.x[c], fed.y[c])
                y = {n: y[n] - eta_l * (g[n] + mu * (y[n] - x[n])) for n in x}
            ys.append(y)
        expected = {n: x[n] + eta_g * sum(y[n] - x[n] for y in ys) / len(ys) for n in x}
        st, info = sim.round(st, t)
        assert info.client_steps == (2, 2, 2)
        _close(st.x, expected)
    # the proximal term matters from the second local step on: μ = 0 lands elsewhere
    other, _ = _run(_sim("fedprox", fed, executor=executor, model="linear", local=LocalTraining(eta_l, 9, steps=2),
                         global_lr=eta_g, S=3, mu=0.0), 2)
    assert all((other.x[n] - st.x[n]).abs().max() > 1e-6 for n in st.x)


# ---------------------------------------------------------------- 2. FedAvgM

@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_fedavgm_momentum_zero_is_fedavg_exactly(executor):
    fed = random_federation(SIZES, dtype=torch.float32)
    ref, _ = _run(_sim("fedavg", fed, executor=executor, global_lr=1.3), 3)
    got, _ = _run(_sim("fedavgm", fed, executor=executor, global_lr=1.3, momentum=0.0), 3)
    assert all(torch.equal(ref.x[n], got.x[n]) for n in ref.x)


def test_fedavgm_momentum_buffer_by_hand():
    """v_t = β v_{t-1} + Δ_t, x_{t+1} = x_t + η_g v_t, with Δ_t from a FedAvg (η_g = 1) round from x_t."""
    fed = random_federation(SIZES, dtype=torch.float64)
    beta, eta_g = 0.7, 1.3
    sim = _sim("fedavgm", fed, global_lr=eta_g, momentum=beta)
    avg = _sim("fedavg", fed, global_lr=1.0)
    st = sim.initial_state()
    v = {n: torch.zeros_like(p) for n, p in st.x.items()}
    for t in range(3):
        x = {n: p.clone() for n, p in st.x.items()}
        one, _ = avg.round(RunState(dict(x)), t)
        v = {n: beta * v[n] + (one.x[n] - x[n]) for n in x}
        st, _ = sim.round(st, t)
        _close(st.algo["v"], v)
        _close(st.x, {n: x[n] + eta_g * v[n] for n in x})
    assert all(v[n].abs().max() > 0 for n in v)


def test_fedadam_moments_by_hand():
    fed = random_federation(SIZES, dtype=torch.float64)
    b1, b2, tau, eta_g = 0.8, 0.95, 1e-2, 0.3
    sim = _sim("fedadam", fed, global_lr=eta_g, beta1=b1, beta2=b2, tau=tau)
    avg = _sim("fedavg", fed, global_lr=1.0)
    st = sim.initial_state()
    m = {n: torch.zeros_like(p) for n, p in st.x.items()}
    v = {n: torch.zeros_like(p) for n, p in st.x.items()}
    for t in range(3):
        x = {n: p.clone() for n, p in st.x.items()}
        one, _ = avg.round(RunState(dict(x)), t)
        d = {n: one.x[n] - x[n] for n in x}
        m = {n: b1 * m[n] + (1 - b1) * d[n] for n in x}
        v = {n: b2 * v[n] + (1 - b2) * d[n] ** 2 for n in x}
        st, _ = sim.round(st, t)
        _close(st.algo["m"], m)
        _close(st.algo["v"], v)
        _close(st.x, {n: x[n] + eta_g * m[n] / (v[n].sqrt() + tau) for n in x}, atol=1e-10)


# ---------------------------------------------------------------- 2. SCAFFOLD

@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_scaffold_full_participation_one_full_batch_step_is_gradient_descent(executor):
    """S = N, equal n_i, K = 1 full batch: x ← x - η_g η_l ∇F(x) every round.

    Round 0: c = c_i = 0, plain GD. Then c_i = ∇f_i(x_{t-1}), c = mean c_i, so the corrections
    c - c_i sum to zero over the clients and the mean update is -η_l ∇F(x_t).
    """
    fed = random_federation([10, 10, 10, 10], dtype=torch.float64)
    eta_l, eta_g = 0.2, 1.5
    sim = _sim("scaffold", fed, executor=executor, local=LocalTraining(eta_l, 10, steps=1), global_lr=eta_g, S=4)
    everything = torch.from_numpy(np.concatenate(fed.clients))
    st = sim.initial_state()
    w = {n: p.clone() for n, p in st.x.items()}
    for t in range(3):
        g = _grad(sim.fm.module, w, fed.x[everything], fed.y[everything])
        g_i = [_grad(sim.fm.module, w, fed.x[torch.from_numpy(c)], fed.y[torch.from_numpy(c)]) for c in fed.clients]
        st, info = sim.round(st, t)
        assert info.clients.tolist() == [0, 1, 2, 3] and info.client_steps == (1, 1, 1, 1)
        w = {n: w[n] - eta_g * eta_l * g[n] for n in w}
        _close(st.x, w)
        _close(st.algo["c"], g)  # c = ∇F(x_t) ...
        for i in range(4):  # ... and c_i = ∇f_i(x_t)
            _close({n: st.clients["c_i"][n][i] for n in w}, g_i[i])


def test_scaffold_option_ii_control_variates_by_hand():
    """c_i⁺ = c_i - c + (x - y_i)/(K_i η_l) for the sampled, other rows unchanged, c += (1/N) Σ (c_i⁺ - c_i)."""
    fed = random_federation(SMALL, dtype=torch.float64)
    sim = _sim("scaffold", fed, model="linear", local=LocalTraining(0.1, 5), global_lr=1.3, S=3)
    st = sim.initial_state()
    for t in range(4):
        before = _clone(st)
        ids, steps, x_bar, c, c_i = _scaffold_by_hand(sim, before, t)
        st, info = sim.round(st, t)
        assert np.array_equal(info.clients, ids) and info.client_steps == steps
        _close(st.x, x_bar)
        _close(st.algo["c"], c)
        for i, row in zip(ids, c_i):
            _close({n: st.clients["c_i"][n][i] for n in row}, row)
        for i in sorted(set(range(fed.num_clients)) - set(ids.tolist())):
            assert all(torch.equal(st.clients["c_i"][n][i], before.clients["c_i"][n][i]) for n in st.x)
    assert len(set(steps)) > 1  # uneven K_i
    assert all(st.algo["c"][n].abs().max() > 0 for n in st.x)


# ---------------------------------------------------------------- 2. FedDyn

def test_feddyn_server_state_identity_and_update_by_hand():
    """h = (1/N) Σ_{i∈[N]} ∇L_i always;
    θ^t = mean_{i∈S} θ_i - h/α; ∇L_i⁺ = ∇L_i - α(θ_i - θ^{t-1})."""
    fed = random_federation(SMALL, dtype=torch.float64)
    sim = _sim("feddyn", fed, model="linear", local=LocalTraining(0.1, 5), S=3, alpha=0.1)
    st = sim.initial_state()
    N = fed.num_clients
    for t in range(5):
        before = _clone(st)
        ids, _, theta, h, grad_i = _feddyn_by_hand(sim, before, t)
        st, info = sim.round(st, t)
        assert np.array_equal(info.clients, ids)
        _close(st.x, theta)
        _close(st.algo["h"], h)
        for i, row in zip(ids, grad_i):
            _close({n: st.clients["grad_i"][n][i] for n in row}, row)
        for i in sorted(set(range(N)) - set(ids.tolist())):
            assert all(torch.equal(st.clients["grad_i"][n][i], before.clients["grad_i"][n][i]) for n in st.x)
        _close(st.algo["h"], {n: st.clients["grad_i"][n].sum(0) / N for n in st.x})
    assert all(st.algo["h"][n].abs().max() > 1e-4 for n in st.x)


# ---------------------------------------------------------------- 2. communication

def test_scaffold_communicates_twice_what_fedavg_does():
    fed = random_federation(SIZES, dtype=torch.float32)
    info = {name: _run(_sim(name, fed, model="linear"), 1)[1][0]
            for name in ("fedavg", "scaffold", "feddyn", "fedprox")}
    num = sum(p.numel() for p in build_model("linear", 4, (1, 8, 8), seed=0).parameters())
    assert info["fedavg"].comm_params == 2 * 5 * num  # S models down, S updates up
    assert info["scaffold"].comm_params == 2 * info["fedavg"].comm_params
    assert info["feddyn"].comm_params == info["fedprox"].comm_params == info["fedavg"].comm_params


# ---------------------------------------------------------------- 3. server learning composes

@pytest.mark.parametrize("name", ["scaffold", "feddyn", "fedadam"])
def test_server_learning_with_gamma_zero_is_the_rule_alone(name):
    fed = random_federation(SIZES, n0=14, dtype=torch.float32)
    ref, _ = _run(_sim(name, fed), 3)
    for server in (ServerLearning(0.0, 0.3, 6, 1), ServerLearning(1.0, 0.3, 6, 1, steps=0)):
        got, infos = _run(_sim(name, fed, server=server), 3)
        assert _equal(ref, got), server
        assert all(i.server_steps == 0 and i.gamma is None for i in infos)
    got, infos = _run(_sim(name, fed, server=ServerLearning(1.0, 0.3, 6, 1)), 3)
    assert all(i.server_steps == 3 and i.gamma == 1.0 for i in infos)
    assert not any(torch.equal(ref.x[n], got.x[n]) for n in ref.x)
    if name != "fedadam":  # control variates / ∇L_i are measured from the post-SL models received
        assert not _equal(RunState({}, ref.algo), RunState({}, got.algo))


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_next_round_clients_receive_the_post_sl_model(name):
    """RunState.x is SL's output on the rule's x̄; round t+1's correction and update are measured from it."""
    fed = random_federation(SMALL, n0=10, dtype=torch.float64)
    local = LocalTraining(0.1, 5)
    server = ServerLearning(0.9, 0.2, 5, 1)
    with_sl = _sim(name, fed, model="linear", local=local, global_lr=1.3, server=server, S=3)
    alone = _sim(name, fed, model="linear", local=local, global_lr=1.3, S=3)
    by_hand = _scaffold_by_hand if name == "scaffold" else _feddyn_by_hand
    st = with_sl.initial_state()
    for t in range(3):
        before = _clone(st)
        bar, _ = alone.round(_clone(before), t)  # the rule alone, from the same (post-SL) model
        hand = by_hand(with_sl, before, t)  # clients start from, and are corrected against, before.x
        st, info = with_sl.round(st, t)
        assert info.server_steps == 2
        x_sl, _ = with_sl.server_sgd(bar.x, t, 0.9 * 0.2)  # γ·η0
        assert all(torch.equal(st.x[n], x_sl[n]) for n in st.x)  # x_{t+1} = SL(x̄_t)
        assert _equal(RunState({}, st.algo), RunState({}, bar.algo))  # SL leaves the rule's state alone
        _close(bar.x, hand[2])
        if name == "scaffold":
            _close(st.algo["c"], hand[3])
            for i, row in zip(hand[0], hand[4]):
                _close({n: st.clients["c_i"][n][i] for n in row}, row)
        else:
            _close(st.algo["h"], hand[3])
            for i, row in zip(hand[0], hand[4]):
                _close({n: st.clients["grad_i"][n][i] for n in row}, row)
        assert not all(torch.equal(st.x[n], bar.x[n]) for n in st.x)  # SL did move the model


# ---------------------------------------------------------------- 4. resume through the runner

def _cfg(alg, rounds=7, server=None, model="small_cnn"):
    d = {"name": "tiny", "rounds": rounds, "seed": 3, "checkpoint_every": 3, "dtype": "float32",
         "executor": "sequential",
         "data": {"dataset": "synthetic_chars", "chars": "0123", "train_per_class": 30, "test_per_class": 15,
                  "num_clients": 6, "classes_per_client": 2, "server_size": 12},
         "model": {"name": model},
         "algorithm": {"name": alg, "clients_per_round": 3, "local_lr": 0.05, "batch_size": 8}}
    if server:
        d["server"] = server
    return C.validate(d)


def _nested_equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_nested_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


@pytest.mark.parametrize("alg,server", [
    ("scaffold", {"learning": "incremental", "gamma_schedule": "adaptive", "gamma_threshold": 0.3}),
    ("feddyn", None),
], ids=["scaffold+sl", "feddyn"])
def test_stateful_rules_resume_bit_identically(tmp_path, alg, server):
    cfg = _cfg(alg, server=server, model="small_cnn" if alg == "scaffold" else "mlp")
    quiet = {"log": lambda s: None, "progress": False}
    run(cfg, tmp_path / "full", stop_after=6, **quiet)  # 6 rounds straight (its checkpoint keeps the tables)
    part = run(cfg, tmp_path / "part", stop_after=4, **quiet)
    assert part["status"] == "interrupted" and part["rounds_done"] == 4
    assert run(cfg, tmp_path / "part", resume=True, stop_after=2, **quiet)["rounds_done"] == 6  # 4, resumed, 2

    def checkpoints():
        return [torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in ("full", "part")]
    a, b = checkpoints()
    assert a["round"] == b["round"] == 6 and a["gamma"] == b["gamma"]
    assert set(a["algo"]) == ({"c"} if alg == "scaffold" else {"h"})
    assert set(a["clients"]) == ({"c_i"} if alg == "scaffold" else {"grad_i"})
    for key in ("params", "algo", "clients"):
        assert _nested_equal(a[key], b[key]), key
    for d in ("full", "part"):
        assert run(cfg, tmp_path / d, resume=True, **quiet)["status"] == "completed"

    def metrics(d):
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in RunDir(d).read_metrics()]

    full, part = metrics(tmp_path / "full"), metrics(tmp_path / "part")
    assert [r["round"] for r in full] == list(range(0, 8)) and part == full
    a, b = checkpoints()
    assert a["round"] == b["round"] == 7 and _nested_equal(a["params"], b["params"])
    assert _nested_equal(a["algo"], b["algo"]) and a["clients"] == b["clients"] == {}  # finished: no tables
    if alg == "scaffold":
        assert all(r["gamma"] is not None and r["cos_theta"] is not None for r in full[1:])  # row 0 is x_0
        assert len({r["gamma"] for r in full}) > 1  # the adaptive γ moved: its state was resumed too


def test_checkpoints_with_the_tables_in_algo_still_resume_bit_identically(tmp_path):
    """Checkpoints written before the clients' states had their own entry kept SCAFFOLD's c_i in
    ``algo``: resuming one moves it to ``RunState.clients`` and continues as if never stopped."""
    cfg = _cfg("feddyn", model="mlp")
    quiet = {"log": lambda s: None, "progress": False}
    run(cfg, tmp_path / "full", **quiet)
    run(cfg, tmp_path / "part", stop_after=3, **quiet)
    path = tmp_path / "part" / "checkpoint.pt"
    blob = torch.load(path, weights_only=True)
    assert max(v.abs().max() for v in blob["clients"]["grad_i"].values()) > 0  # the tables hold real rows
    blob["algo"].update(blob.pop("clients"))  # the old format: no clients, no format, wall_time at the top
    del blob["format"]
    blob["wall_time"] = json.loads(blob.pop("extra"))["wall_time"]
    torch.save(blob, path)
    run(cfg, tmp_path / "part", resume=True, **quiet)
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(path, weights_only=True)
    assert _nested_equal(a["params"], b["params"]) and _nested_equal(a["algo"], b["algo"])


# ---------------------------------------------------------------- 5. config errors

def _data(**over):
    return {"rounds": 1, "data": {"dataset": "synthetic_chars", "server_size": 10},
            "algorithm": over.pop("algorithm"), **over}


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_parallel_server_learning_with_scaffold_or_feddyn_is_refused(name):
    with pytest.raises(C.ConfigError) as e:
        C.validate(_data(algorithm={"name": name}, server={"learning": "parallel"}))
    msg = str(e.value)
    assert "\n" not in msg and "server.learning = 'parallel'" in msg and repr(name) in msg
    with pytest.raises(ValueError) as direct:  # config validation asks the one check, with its message
        check_server_learning(name, "parallel", has_server_data=True)
    assert str(direct.value) == msg
    # incremental composes
    ok = C.validate(_data(algorithm={"name": name}, server={"learning": "incremental"}))
    assert ok.server.learning == "incremental"


def test_fsl_without_server_learning_is_refused():
    with pytest.raises(C.ConfigError) as e:
        C.validate(_data(algorithm={"name": "fsl"}, server={"learning": "off"}))
    msg = str(e.value)
    assert "\n" not in msg and "server.learning = 'off'" in msg and "'fsl'" in msg


def test_qfedavg_clients_report_their_loss_at_the_model_they_received():
    """q-FedAvg's F_i(x_t): each arriving client's mean cross-entropy on D_i at x_t, dropout off, recomputed here by
    hand; a rule that does not read it gets none."""
    fed = random_federation(SMALL)
    sim = _sim("qfedavg", fed, global_lr=1.0)  # q-FedAvg has no η_g: not read
    x = sim.initial_params()
    work = sim.measure_clients(sim.sample(0), x)  # what each sampled client measures at x_t for its rule
    res = sim.results(work, {n: v.unsqueeze(0).expand(len(work.ids), *v.shape) for n, v in x.items()}, x, 0)
    sim.fm.train(False)
    by_hand = [F.cross_entropy(sim.fm.forward(x, fed.x[fed.clients[i]]), fed.y[fed.clients[i]]).item()
               for i in work.ids.tolist()]
    losses = res.extra["start_loss"].tolist()
    assert res.extra["start_loss"].dtype == torch.float64 and list(res.extra) == ["start_loss"]
    assert losses == pytest.approx(by_hand, rel=1e-12) and len(set(losses)) == len(work.ids)
    fedavg = _sim("fedavg", fed)
    assert fedavg.results(fedavg.measure_clients(work, x), res.params, x, 0).extra == {}
