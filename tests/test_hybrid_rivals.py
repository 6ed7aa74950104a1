"""The hybrid-FL rivals that live in ``fedsl.algorithms`` alone (FedCLG-C, FedCLG-S, FedDUM): each round of the
simulator against the round computed here by hand from the rule's equations (plain autograd, no engine code), the
executors and stacked runs agreeing, and what the specs declare refused where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import clone_state, random_federation, run_rounds, tiny_config
from test_baselines import SMALL, _grad, _local, _plan
from test_baselines import _sim as _baseline_sim

from fedsl.algorithms import SPECS, LocalTraining, ServerLearning, make_rule
from fedsl.algorithms.spec import Spec
from fedsl.config import schema as C
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor

pytestmark = pytest.mark.usefixtures("one_thread")

# γ = 0: line 10 is off (no server step), so x_{t+1} = x̄_t, the rule's own update; line 10 is
# FSL's, tested there (that it runs after each rule: ``test_line10_runs_after_each_rule``)
FROZEN = ServerLearning(gamma=0.0, lr=0.05, batch_size=6, epochs=1)
SL = ServerLearning(gamma=0.8, lr=0.05, batch_size=6, epochs=1)
LOCAL = LocalTraining(0.1, 5)  # with SMALL's clients K_i = 3, 5, 2, 6, 4, 3: uneven


def _sim(name, fed, global_lr=1.3, **kw):
    return _baseline_sim(name, fed, global_lr=global_lr, **kw)


def _close(a: dict, b: dict, atol=1e-12) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=0, atol=atol), (n, (a[n] - b[n]).abs().max().item())


def _grads(sim, x, ids):
    """g_s = ∇f0(x) on D0 and each client's g_i = ∇F_i(x) on D_i, all of the data, by hand."""
    fed, module = sim.fed, sim.fm.module
    g_s = _grad(module, x, fed.x[fed.server], fed.y[fed.server])
    return g_s, [_grad(module, x, fed.x[sim.client_data[i]], fed.y[sim.client_data[i]]) for i in ids]


def _fedclg_by_hand(sim, x, t, where):
    """x̄_t of FedCLG-C (``where`` = "c": each step corrected by g_s − g_i) or FedCLG-S ("s": plain steps, each Δ_i
    corrected by K_i η_l (g_s − g_i) before the mean), η_g·mean."""
    ids, plan = _plan(sim, t)
    g_s, g_i = _grads(sim, x, ids)
    eta_l, eta_g = sim.alg.local.lr, sim.alg.rule.global_lr
    if where == "c":
        ys = [_local(sim, x, plan, j, linear={n: g_s[n] - g_i[j][n] for n in x}) for j in range(len(ids))]
        upd = [{n: y[n] - x[n] for n in x} for y in ys]
    else:
        ys = [_local(sim, x, plan, j) for j in range(len(ids))]
        upd = [{n: y[n] - x[n] - plan.steps[j] * eta_l * (g_s[n] - g_i[j][n]) for n in x} for j, y in enumerate(ys)]
    return ids, plan.steps, {n: x[n] + eta_g * sum(u[n] for u in upd) / len(upd) for n in x}


@pytest.mark.parametrize("where", ["c", "s"])
def test_fedclg_rounds_by_hand(where):
    """Four rounds of FedCLG-C / FedCLG-S from x_0 equal the equations computed here (float64, to 1e-12), and the
    correction acts: the same round without it (FSL's x̄_t) is another model."""
    fed = random_federation(SMALL, n0=14)
    sim = _sim(f"fedclg_{where}", fed, model="linear", local=LOCAL, global_lr=1.3, server=FROZEN, S=3)
    st = sim.initial_state()
    for t in range(4):
        before = clone_state(st)
        ids, steps, x_bar = _fedclg_by_hand(sim, before.x, t, where)
        st, info = sim.round(st, t)
        assert np.array_equal(info.clients, ids) and info.client_steps == steps
        _close(st.x, x_bar)
        assert st.algo == {} and st.clients == {}  # nothing kept between rounds: g_s, g_i measured afresh
    assert len(set(steps)) > 1  # uneven K_i
    plain_ids, plan = _plan(sim, 3)
    plain = [_local(sim, before.x, plan, j) for j in range(len(plain_ids))]
    fedavg = {n: before.x[n] + 1.3 * sum(y[n] - before.x[n] for y in plain) / len(plain) for n in before.x}
    assert max((st.x[n] - fedavg[n]).abs().max().item() for n in st.x) > 1e-4


def test_fedclgs_first_order_equals_fedclgc():
    """With one local step the two variants are one update: y = x − η_l (g_i + g_s − g_i) on the full batch = the
    corrected Δ_i of FedCLG-S (K_i = 1, a batch of all of D_i): both equal x − η_g η_l g_s."""
    fed = random_federation([10, 10, 10, 10], n0=14)
    one = LocalTraining(0.1, 10, steps=1)
    runs = [run_rounds(_sim(f"fedclg_{w}", fed, model="linear", local=one, global_lr=2.0, server=FROZEN, S=4), 1)[0]
            for w in "cs"]
    x0 = _sim("fedclg_c", fed, model="linear", local=one, server=FROZEN).initial_state().x
    g_s = _grad(_sim("fedclg_c", fed, model="linear", local=one, server=FROZEN).fm.module, x0,
                fed.x[fed.server], fed.y[fed.server])
    for st in runs:
        _close(st.x, {n: x0[n] - 2.0 * 0.1 * g_s[n] for n in x0})


def test_feddum_momentum_by_hand_and_beta_zero_is_feddu():
    """M_t = β M_{t−1} + (1 − β) η_g mean Δ_i, x̄_t = x_t + M_t, over three rounds (γ = 0: x_{t+1} = x̄_t); at β = 0
    FedDUM is FedDU bit for bit, line 10 with FedDU's γ_t included."""
    fed = random_federation(SMALL, n0=14)
    sim = _sim("feddum", fed, model="linear", local=LOCAL, global_lr=1.3, server=FROZEN, S=3, feddum_beta=0.75)
    st = sim.initial_state()
    m = {n: torch.zeros_like(v) for n, v in st.x.items()}
    for t in range(3):
        x = clone_state(st).x
        ids, plan = _plan(sim, t)
        ys = [_local(sim, x, plan, j) for j in range(len(ids))]
        m = {n: 0.75 * m[n] + 0.25 * 1.3 * sum(y[n] - x[n] for y in ys) / len(ys) for n in x}
        st, _ = sim.round(st, t)
        _close(st.algo["m"], m)
        _close(st.x, {n: x[n] + m[n] for n in x})
    dum, dum_info = run_rounds(_sim("feddum", fed, local=LOCAL, server=SL, S=3, feddum_beta=0.0), 3)
    du, du_info = run_rounds(_sim("feddu", fed, local=LOCAL, server=SL, S=3), 3)
    assert all(torch.equal(dum.x[n], du.x[n]) for n in du.x)
    assert [i.gamma for i in dum_info] == [i.gamma for i in du_info] and all(i.gamma > 0 for i in du_info)
    with pytest.raises(ValueError, match=r"feddum_beta = 1\.0: expected a number in \[0, 1\)"):
        make_rule("feddum", 1.0, feddum_beta=1.0)


@pytest.mark.parametrize("name", ["fedclg_c", "fedclg_s", "feddum"])
def test_line10_runs_after_each_rule(name):
    """Each rival is FSL's round around its rule: K0 server steps on D0 every round, and with γ > 0 they move x̄_t."""
    fed = random_federation(SMALL, n0=14)
    moved, infos = run_rounds(_sim(name, fed, model="linear", local=LOCAL, server=SL, S=3), 2)
    frozen, _ = run_rounds(_sim(name, fed, model="linear", local=LOCAL, server=FROZEN, S=3), 2)
    assert all(i.server_steps == 3 for i in infos)  # K0 = ⌈14 / 6⌉
    assert max((moved.x[n] - frozen.x[n]).abs().max().item() for n in moved.x) > 1e-6


@pytest.mark.parametrize("name", ["fedclg_c", "fedclg_s", "feddum"])
def test_vectorised_equals_sequential(name):
    """The vmapped client half (padded steps masked, the measured g_i stacked in ``sent``) equals the loop."""
    fed = random_federation(SMALL, n0=14)
    a, ia = run_rounds(_sim(name, fed, model="small_cnn", local=LOCAL, server=SL, S=3,
                            executor=SequentialExecutor), 3)
    b, ib = run_rounds(_sim(name, fed, model="small_cnn", local=LOCAL, server=SL, S=3,
                            executor=VectorisedExecutor), 3)
    assert [i.client_steps for i in ia] == [i.client_steps for i in ib]
    _close(a.x, b.x, atol=1e-10)


def test_fedclg_communication_counts_the_extra_gradient():
    """FedCLG sends one d more per client and round than FedAvg (g_s down, or g_i up): 3d, where FedAvg sends 2d."""
    fed = random_federation(SMALL, n0=14)
    comm = {n: run_rounds(_sim(n, fed, model="linear", local=LOCAL, server=FROZEN if n != "fedavg" else None,
                               global_lr=1.0, S=3), 1)[1][0].comm_params for n in ("fedavg", "fedclg_c", "fedclg_s")}
    assert comm["fedclg_c"] == comm["fedclg_s"] == comm["fedavg"] * 3 // 2


def test_declarations_are_checked_and_refusals_derived():
    """A measure the engines do not make is refused when the spec is made; DP and SecAgg refuse what they cannot
    carry, from the specs alone."""
    with pytest.raises(ValueError, match=r"declares reply = \('start_hessian',\): 'start_hessian' is not a measure"):
        Spec("mine", object, reply=("start_hessian",))
    from fedsl.flower.config import open_refusal, secagg_rules
    assert "fedclg_c" not in secagg_rules() and "fedclg_s" not in secagg_rules() and "fedavg" in secagg_rules()
    assert "start-grad" in open_refusal(SPECS["fedclg_s"]) and open_refusal(SPECS["fedclg_c"]) == ""
    assert "sends server_grad" in SPECS["fedclg_c"].secagg_reason
    base = tiny_config()
    with pytest.raises(C.ConfigError) as e:
        C.validate({**base, "algorithm": {**base["algorithm"], "name": "fedclg_s"},
                    "privacy": {"clip": 1.0, "noise_multiplier": 1.0}})
    assert "\n" not in str(e.value) and "FedCLG-S's server step reads each sampled client's ∇F_i(x_t)" in str(e.value)


@pytest.mark.parametrize("name", ["fedclg_c", "fedclg_s", "feddum"])
def test_stacked_runs_equal_each_run_alone(name):
    """Runs of a rival at two seeds and step sizes stacked in one engine (one executor call for all their clients,
    each run's measured g_i and sent g_s) equal each run alone."""
    from conftest import stacked_and_alone
    fed = random_federation(SMALL, n0=14)

    def sims():
        return [_sim(name, fed, model="linear", local=local, server=SL, S=3, seed=seed)
                for local, seed in ((LOCAL, 1), (LocalTraining(0.05, 5), 2))]
    for stacked, _, alone, _ in stacked_and_alone(sims, 3):
        _close(stacked.x, alone.x, atol=1e-12)
        assert stacked.algo.keys() == alone.algo.keys()


def test_a_round_in_phases_must_measure_first():
    """A caller that runs the round's phases itself (``reproduction/round_cost.py``) and forgets
    ``measure_clients`` gets one line naming what is missing, not a KeyError."""
    fed = random_federation(SMALL, n0=14)
    for name in ("fedclg_c", "fedclg_s"):
        sim = _sim(name, fed, model="linear", local=LOCAL, server=SL, S=3)
        st = sim.initial_state()
        work = sim.sample(0)
        with pytest.raises(ValueError, match=r"the round's work was not measured at x_t \(Simulator.measure_clients\)"):
            finals, _ = sim.train_clients(st, work, 0)
            sim.results(work, finals, st.x, 0)
