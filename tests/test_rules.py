"""Server rules as pure functions (hand-computed updates, invariants), and the spec registry.

No Simulator here: each algorithm's client half (``client_update``, ``client_final``) and server half
(``server_update``) are called on small tensors whose result is known.
"""

import math

import pytest
import torch

from fedsl.algorithms import ALGORITHMS, SPECS, RoundContext, client_update, make_algorithm, make_rule, spec
from fedsl.algorithms.base import LocalTraining
from fedsl.algorithms.fednova import normalised_update


def P(*v):  # a one-parameter "model" with a vector weight
    return {"w": torch.tensor(v, dtype=torch.float64)}


def stacked(*rows):
    return {"w": torch.tensor(rows, dtype=torch.float64)}


def ctx(steps, lr=0.1, n=4):
    return RoundContext(lr, torch.tensor(steps), n)


HALF = torch.tensor([0.5, 0.5], dtype=torch.float64)


def rows(*v):  # one client's state row {"w": ...}
    return {"w": torch.tensor(v, dtype=torch.float64)}


def quadratic_grad(centre: float):
    """The gradient of f(y) = ½‖y - centre‖² (what the engine would hand a client step)."""
    return lambda y, batch, aux: {"w": y["w"] - centre}


def test_fedavg_is_x_plus_eta_g_times_the_mean_update():
    rule = make_rule("fedavg", 2.0)
    new, state = rule.server_update(P(1.0, 0.0), {}, stacked([2.0, 1.0], [0.0, 3.0]), HALF, ctx([5, 5]))
    # Δ = (1, 1) and (-1, 3): mean (0, 2); x + 2·mean = (1, 4)
    assert new["w"].tolist() == [1.0, 4.0] and state == {}


def test_local_sgd_client_is_k_gradient_steps():
    """FedAvg's client (Algorithm 1, lines 4-6): y ← y - η_l (y - c) three times from x; no state."""
    rule = make_rule("fedavg", 1.0)
    y, state, m = client_update(rule, P(4.0), {}, {}, range(3), quadratic_grad(1.0), 0.5)
    assert y["w"].item() == 1.0 + 3.0 * 0.5 ** 3 and state == {} and m == {"steps": 3}


def test_fedprox_client_steps_on_g_plus_mu_times_y_minus_x():
    rule = make_rule("fedprox", 1.0, mu=0.5)
    y, _, _ = client_update(rule, P(2.0), {}, {}, range(2), quadratic_grad(0.0), 0.1)
    # g + μ(y - x) = y + 0.5(y - 2): step 1 from 2: 2 - 0.1·2 = 1.8; step 2: 1.8 - 0.1·(1.8 - 0.1) = 1.63
    assert y["w"].item() == pytest.approx(1.63, abs=1e-15)


def test_scaffold_option_ii_by_hand():
    """Clients compute their own c_i⁺ (``client_final``); the server derives c_i⁺ - c_i from x_i and K_i alone."""
    rule = make_rule("scaffold", 1.0)
    x, sent = P(1.0), {"c": P(0.5)}
    c_rows = [{"c_i": rows(0.0)}, {"c_i": rows(0.25)}]  # clients 0 and 2
    finals, new_rows = [P(0.0), P(0.5)], []  # Δ = -1, -0.5
    for y, row, k in zip(finals, c_rows, (2, 4)):
        _, r = rule.client_final(x, row, sent, {"y": y}, k, 0.5)
        new_rows.append(r["c_i"]["w"].item())
    # c_i⁺ = c_i - c - Δ/(K_i η_l): client 0: 0 - 0.5 + 1/1 = 0.5; client 2: 0.25 - 0.5 + 0.5/2 = 0
    assert new_rows == [0.5, 0.0]
    new, out = rule.server_update(x, sent, stacked([0.0], [0.5]), HALF, ctx([2, 4], lr=0.5))
    # c ← c + (1/N) Σ (c_i⁺ - c_i) = 0.5 + (0.5 + (-0.25)) / 4
    assert out["c"]["w"].item() == pytest.approx(0.5625, abs=1e-15)
    assert new["w"].item() == pytest.approx(1.0 - 0.75, abs=1e-15)


def test_scaffold_client_steps_are_corrected_by_c_minus_c_i():
    rule = make_rule("scaffold", 1.0)
    y, row, _ = client_update(rule, P(1.0), {"c_i": rows(0.25)}, {"c": P(1.0)}, range(1), quadratic_grad(0.0), 0.1)
    assert y["w"].item() == pytest.approx(1.0 - 0.1 * (1.0 + 0.75), abs=1e-15)
    assert row["c_i"]["w"].item() == pytest.approx(0.25 - 1.0 + 0.175 / 0.1, abs=1e-14)


def test_feddyn_h_is_the_mean_of_all_clients_grad_l_over_rounds():
    """h = (1/N) Σ_{i∈[N]} ∇L_i after every round (Acar et al.): the server's h from the models alone,
    the clients' ∇L_i from their own ``client_final``."""
    g = torch.Generator().manual_seed(0)
    n = 5
    rule = make_rule("feddyn", None, alpha=0.1)
    x = P(0.0, 0.0, 0.0)
    st = rule.init_server_state(x)
    tables = [rule.init_client_state(x) for _ in range(n)]
    for _ in range(6):
        ids = torch.randperm(n, generator=g)[:2].tolist()
        finals = {"w": x["w"] + torch.randn(2, 3, generator=g, dtype=torch.float64)}
        for j, i in enumerate(ids):
            _, tables[i] = rule.client_final(x, tables[i], {}, {"y": {"w": finals["w"][j]}}, 3, 0.1)
        x, st = rule.server_update(x, st, finals, HALF, ctx([3, 3], n=n))
        assert torch.allclose(st["h"]["w"], torch.stack([t["grad_i"]["w"] for t in tables]).mean(0), atol=1e-14)
        assert torch.allclose(x["w"], finals["w"].mean(0) - st["h"]["w"] / 0.1, atol=1e-14)


def test_feddyn_client_steps_on_g_minus_grad_l_plus_alpha_times_y_minus_x():
    rule = make_rule("feddyn", None, alpha=0.5)
    y, row, _ = client_update(rule, P(2.0), {"grad_i": rows(1.0)}, {}, range(1), quadratic_grad(0.0), 0.1)
    assert y["w"].item() == pytest.approx(2.0 - 0.1 * (2.0 - 1.0), abs=1e-15)  # first step: y = x
    assert row["grad_i"]["w"].item() == pytest.approx(1.0 - 0.5 * (1.9 - 2.0), abs=1e-15)


def test_fedavgm_and_fedadam_one_step_by_hand():
    x, finals = P(1.0), stacked([2.0], [4.0])  # mean Δ = 2
    m = make_rule("fedavgm", 1.0, momentum=0.5)
    st = m.init_server_state(x)
    st["v"]["w"] += 1.0
    new, out = m.server_update(x, st, finals, HALF, ctx([1, 1]))
    assert out["v"]["w"].item() == 2.5 and new["w"].item() == 3.5  # v = 0.5·1 + 2; x + v
    a = make_rule("fedadam", 0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    new, out = a.server_update(x, a.init_server_state(x), finals, HALF, ctx([1, 1]))
    m1, v1 = 0.1 * 2.0, 0.01 * 4.0
    assert new["w"].item() == pytest.approx(1.0 + 0.1 * m1 / (math.sqrt(v1) + 1e-3), abs=1e-15)


def test_fedyogi_and_fedadagrad_one_step_by_hand():
    """Reddi et al. 2021, Algorithm 2, from m = 0.5 and v = (9, 1) on both sides of Δ_t² = 4: Yogi's v moves by
    (1-β2)·Δ² toward Δ² (9 - 0.04, 1 + 0.04), Adam's by (1-β2)(Δ² - v) (8.95, 1.03), Adagrad's adds Δ² (13, 5)."""
    x, finals = P(1.0, 1.0), stacked([2.0, 2.0], [4.0, 4.0])  # mean Δ = 2 in both coordinates
    start = {"m": rows(0.5, 0.5), "v": rows(9.0, 1.0)}
    m1 = 0.9 * 0.5 + 0.1 * 2.0
    for name, v1 in (("fedyogi", (8.96, 1.04)), ("fedadam", (8.95, 1.03))):
        rule = make_rule(name, 0.01, beta1=0.9, beta2=0.99, tau=1e-3)
        new, out = rule.server_update(x, {k: dict(v) for k, v in start.items()}, finals, HALF, ctx([1, 1]))
        assert out["v"]["w"].tolist() == pytest.approx(v1, abs=1e-14), name
        assert out["m"]["w"].tolist() == pytest.approx([m1, m1], abs=1e-15)
        assert new["w"].tolist() == pytest.approx([1 + 0.01 * m1 / (math.sqrt(v) + 1e-3) for v in v1], abs=1e-15)
    for beta1, m in ((0.0, 2.0), (0.9, m1)):  # β1 = 0: Flower's FedAdagrad, m = Δ_t
        rule = make_rule("fedadagrad", 0.1, beta1=beta1, tau=1e-3)
        new, out = rule.server_update(x, {k: dict(v) for k, v in start.items()}, finals, HALF, ctx([1, 1]))
        assert out["v"]["w"].tolist() == [13.0, 5.0] and out["m"]["w"].tolist() == pytest.approx([m, m], abs=1e-15)
        assert new["w"].tolist() == pytest.approx([1 + 0.1 * m / (math.sqrt(v) + 1e-3) for v in (13, 5)], abs=1e-15)
    assert make_rule("fedyogi", 0.01).init_server_state(x)["v"]["w"].tolist() == [0.0, 0.0]  # v_0 = 0, as Flower's


def test_qfedavg_one_step_by_hand():
    """Li et al. 2020, Algorithm 2, with η_l = 0.1 (L = 10), q = 0.5, x_t = 0, x_1 = (0.1, 0), x_2 = (0, −0.2) and
    F = (1, 4): Δw = L(x_t − x_k) = (−1, 0), (0, 2); F^q = 1, 2; h = q F^(q−1) ‖Δw‖² + L F^q = 0.5·1·1 + 10 = 10.5
    and 0.5·0.5·4 + 20 = 21; x_{t+1} = x_t − (1·(−1, 0) + 2·(0, 2)) / 31.5 = (1, −4)/31.5 (FedAvg: (0.05, −0.1))."""
    x, finals = P(0.0, 0.0), stacked([0.1, 0.0], [0.0, -0.2])
    losses = torch.tensor([1.0, 4.0], dtype=torch.float64)
    rule = make_rule("qfedavg", None, q=0.5)
    extra = {"start_loss": losses}
    new, out = rule.server_update(x, {}, finals, HALF, RoundContext(0.1, torch.tensor([1, 1]), 4, extra))
    assert new["w"].tolist() == pytest.approx([1 / 31.5, -4 / 31.5], rel=1e-9) and out == {}
    # q = 0: h_k = L for every k, x_t + the plain mean of Δ_k (FedAvg, η_g = 1), whatever the losses and weights
    new, _ = make_rule("qfedavg", None, q=0.0).server_update(x, {}, finals, torch.tensor([0.9, 0.1]),
                                                              RoundContext(0.1, torch.tensor([1, 1]), 4, extra))
    assert new["w"].tolist() == pytest.approx([0.05, -0.1], abs=1e-15)
    assert SPECS["qfedavg"].defaults() == {"q": 0.1} and SPECS["qfedavg"].global_lr is None
    with pytest.raises(AssertionError, match="start_loss"):
        rule.server_update(x, {}, finals, HALF, ctx([1, 1]))


def test_fednova_equals_fedavg_when_steps_are_equal_and_normalises_otherwise():
    x, finals = P(0.0, 1.0), stacked([1.0, 1.0], [3.0, -1.0])
    avg, _ = make_rule("fedavg", 1.0).server_update(x, {}, finals, HALF, ctx([4, 4]))
    nova, _ = make_rule("fednova", 1.0).server_update(x, {}, finals, HALF, ctx([4, 4]))
    assert torch.allclose(avg["w"], nova["w"], atol=1e-15)
    # τ = (1, 3): τ_eff = 2; Σ p_i Δ_i/τ_i = 0.5·(1, 0) + 0.5·(3, -2)/3 = (1, -1/3); x + 2·that
    nova, _ = make_rule("fednova", 1.0).server_update(x, {}, finals, HALF, ctx([1, 3]))
    assert torch.allclose(nova["w"], torch.tensor([2.0, 1.0 - 2 / 3], dtype=torch.float64), atol=1e-15)


def _local_gd(x: float, c: float, steps: int, lr: float) -> float:
    """``steps`` of gradient descent on f(y) = ½(y - c)² from x."""
    for _ in range(steps):
        x -= lr * (x - c)
    return x


def test_fednova_removes_fedavgs_objective_inconsistency():
    """Wang et al. 2020 (Fig. 1, Theorem 1): two quadratic clients, minima 0 and 10, taking 1 and 10
    local steps. FedAvg converges to the minimum of Σ τ_i f_i, 100/11 ≈ 9.09 (pulled to the busier
    client), whatever the step size; FedNova to the minimum of Σ f_i, 5, up to O(η_l·τ)."""
    centres, steps, lr = (0.0, 10.0), (1, 10), 0.01
    ends = {}
    for name in ("fedavg", "fednova"):
        rule, x = make_rule(name, 1.0), P(0.0)
        for _ in range(3000):
            finals = stacked(*[[_local_gd(x["w"].item(), c, k, lr)] for c, k in zip(centres, steps)])
            x, _ = rule.server_update(x, {}, finals, HALF, ctx(list(steps), lr=lr))
        ends[name] = x["w"].item()
    assert abs(ends["fednova"] - 5.0) < 0.15
    assert abs(ends["fedavg"] - 100 / 11) < 0.05


def test_normalised_update_in_float32_keeps_the_dtype():
    x = {"w": torch.zeros(3)}
    out = normalised_update(x, {"w": torch.ones(2, 3)}, torch.tensor([0.5, 0.5], dtype=torch.float64),
                            torch.tensor([2, 2]), 1.0, 0.0)
    assert out["w"].dtype == torch.float32 and out["w"].tolist() == [1.0, 1.0, 1.0]


# ----------------------------------------------------------------------------- the spec registry

# The rules fedsl ships with. The pins below say what each of them is (which need D0, keep client state, compose
# with FSL-p); a new rule is checked through its spec alone and needs no entry here.
BUILT_IN = ("fedavg", "fsl", "fsl_p", "ds", "feddu", "d0_only", "fedprox", "fedavgm", "fedadam", "fedyogi",
            "fedadagrad", "scaffold", "feddyn", "fednova", "moon", "qfedavg", "feddf")


def test_every_algorithm_has_one_spec_and_config_reads_it():
    from fedsl.config.schema import ALGORITHM_NAMES, AlgorithmConfig
    assert ALGORITHM_NAMES == ALGORITHMS == tuple(SPECS)
    for name, sp in SPECS.items():
        assert sp.name == name
        for h in sp.hyperparams:  # every rule hyper-parameter is a config key with the spec's default
            assert AlgorithmConfig.model_fields[h.key].default == h.default
        for k in sp.local_keys:
            assert k in sp.defaults()
    assert set(BUILT_IN) <= set(SPECS)
    assert {n for n in BUILT_IN if SPECS[n].needs_server_data} == {"fsl", "fsl_p", "ds", "feddu", "d0_only"}
    assert SPECS["scaffold"].sends == ("c",) and SPECS["scaffold"].comm_factor == 2


@pytest.mark.parametrize("name", ALGORITHMS)
def test_make_algorithm_attaches_the_spec_and_defaults(name):
    from fedsl.algorithms import ServerLearning
    server = ServerLearning(1.0, 0.1, 4, 1) if SPECS[name].server_learning != "off" else None
    alg = make_algorithm(name, LocalTraining(0.1, 4), SPECS[name].default_global_lr(9), server)
    assert alg.spec is SPECS[name]
    for h in SPECS[name].hyperparams:
        assert getattr(alg.rule, h.key) == h.default
    assert getattr(alg.rule, "global_lr", None) == SPECS[name].default_global_lr(9)


def test_a_rules_defaults_are_written_in_its_spec_only():
    """The rules' dataclasses state no default of their own (η_g, μ, β, β1, β2, τ, α, ρ): ``make_rule`` fills
    them in from the spec, the one place they are written (issue 27). A default in the dataclass too
    would be a second copy that could drift from the spec and from config's."""
    import dataclasses
    for name, sp in SPECS.items():
        rule = make_rule(name, sp.default_global_lr(4))
        for f in dataclasses.fields(rule):
            if f.init:
                assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, (name, f.name)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_spec_names_the_state_its_clients_keep(name):
    """``Spec.client_state`` is what the rule's clients keep between rounds (N × d tables each: memory
    planning and host tables read it instead of a list of names)."""
    rule = make_rule(name, SPECS[name].default_global_lr(4))
    assert tuple(rule.init_client_state(P(0.0, 0.0))) == SPECS[name].client_state
    if name in BUILT_IN:
        assert bool(SPECS[name].client_state) == (name in ("scaffold", "feddyn", "moon"))


def test_one_check_of_server_learning_and_what_it_runs():
    """``check_server_learning`` resolves 'auto' and refuses, in one line naming the value and what is
    expected, what does not compose: the one check config validation makes (the algorithms' own copy
    let fsl and fsl_p "compose with FSL-p", and turned fsl + 'parallel' into FSL without a word)."""
    from fedsl.algorithms import check_server_learning as check
    assert ([check(n, "auto", True) for n in ("fsl", "fsl_p", "ds", "fedavg")]
            == ["incremental", "parallel", "off", "off"])
    assert check("scaffold", "incremental", True) == "incremental" and check("fedprox", "parallel", True) == "parallel"
    assert check("fedavg", "off", False) == "off"
    composes = [n for n, s in SPECS.items() if s.parallel_ok and s.server_learning == "off"]
    assert [n for n in composes if n in BUILT_IN] == ["fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi",
                                                      "fedadagrad", "moon"]
    assert all(check(n, "parallel", True) == "parallel" for n in composes)
    listed = ", ".join(composes)  # the registry's order: a new rule whose spec says parallel_ok is listed too
    cases = {("fsl", "parallel", True): "server.learning = 'parallel' contradicts algorithm.name = 'fsl': expected "
                                        "'auto'",
             ("fsl_p", "off", True): "server.learning = 'off' contradicts algorithm.name = 'fsl_p': expected 'auto'",
             ("fednova", "parallel", True): f"server.learning = 'parallel' (FSL-p) composes with {listed}; not "
                                            "algorithm.name = 'fednova'",
             ("qfedavg", "parallel", True): f"server.learning = 'parallel' (FSL-p) composes with {listed}; not "
                                            "algorithm.name = 'qfedavg'",
             ("ds", "auto", False): "algorithm.name = 'ds' with server.learning = 'auto' needs server data: expected "
                                    "data.server_size > 0 or data.server_source = 'clients' / 'dataset' / 'other_ids'",
             ("fedavg", "incremental", False): "algorithm.name = 'fedavg' with server.learning = 'incremental' needs "
                                               "server data: expected data.server_size > 0 or data.server_source = "
                                               "'clients' / 'dataset' / 'other_ids'"}
    for args, msg in cases.items():
        with pytest.raises(ValueError) as e:
            check(*args)
        assert str(e.value) == msg


def test_unknown_algorithm_names_the_known_ones():
    with pytest.raises(ValueError, match="expected one of .*fednova"):
        spec("fedfoo")


def test_fednova_runs_end_to_end_from_a_config(tmp_path):
    from conftest import TINY

    from fedsl.config import loading
    from fedsl.runs.runner import run
    p = tmp_path / "c.toml"
    p.write_text(TINY.format(rounds=3, alg="fednova", dtype="float64", executor="sequential"))
    lines = []
    s = run(loading.load(p), tmp_path / "r", log=lines.append, progress=False)
    assert s["status"] == "completed"
    assert s["hyperparameters"]["η_g"] == {"value": 1.0, "source": "default for fednova"}


# ----------------------------------------------------------------------------- a client with its own optimiser

def test_heavy_ball_clients_move_by_eta_times_a_i_on_a_constant_gradient():
    """With a constant gradient g, τ heavy-ball steps move a client by -η_l·a_i·g: FedNova's a_i."""
    from fedsl.algorithms.fednova import step_norm
    rule, lr = make_rule("fednova", 1.0, rho=0.6), 0.1
    for tau in (1, 3, 7):
        y, _, m = client_update(rule, P(0.0), {}, {}, range(tau), lambda y, b, aux: {"w": torch.tensor([2.0])}, lr)
        a = step_norm(torch.tensor([tau]), 0.6).item()
        assert m["steps"] == tau and y["w"].item() == pytest.approx(-lr * a * 2.0, abs=1e-14)
    assert step_norm(torch.tensor([4]), 0.0).item() == 4.0


def test_fednova_without_momentum_is_local_sgd_bit_for_bit():
    nova, avg = make_rule("fednova", 1.0, rho=0.0), make_rule("fedavg", 1.0)
    a, _, _ = client_update(nova, P(4.0, -1.0), {}, {}, range(5), quadratic_grad(0.3), 0.37)
    b, _, _ = client_update(avg, P(4.0, -1.0), {}, {}, range(5), quadratic_grad(0.3), 0.37)
    assert torch.equal(a["w"], b["w"])


def _fednova_run(executor_cls, rho, dtype=torch.float64, stacked_with=None):
    from conftest import random_federation

    from fedsl.engine.functional import FunctionalModel
    from fedsl.engine.simulator import Simulator
    from fedsl.models import build_model
    fed = random_federation([9, 31, 17, 24, 12, 30, 16, 20], n0=14, dtype=dtype)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).to(dtype))
    alg = make_algorithm("fednova", LocalTraining(0.1, 8), 1.0, None, rho=rho)
    sim = Simulator(fm, fed, alg, executor_cls(fm), clients_per_round=5, seed=11)
    st = sim.initial_state()
    for t in range(3):
        st, info = sim.round(st, t)
    return st.x, info


def test_fednova_momentum_clients_vectorised_equal_sequential_float64():
    """The clients' momentum buffer is carried through vmapped steps and padded steps leave it alone."""
    from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
    a, info = _fednova_run(SequentialExecutor, 0.7)
    b, _ = _fednova_run(VectorisedExecutor, 0.7)
    assert len(set(info.client_steps)) > 1  # padded steps were exercised
    assert all(torch.allclose(a[n], b[n], rtol=0, atol=1e-10) for n in a)
    c, _ = _fednova_run(SequentialExecutor, 0.0)  # momentum changes the result
    assert not all(torch.allclose(a[n], c[n]) for n in a)


def test_fednova_momentum_runs_stacked_as_one_by_one():
    from conftest import random_federation

    from fedsl.engine.executors import VectorisedExecutor
    from fedsl.engine.functional import FunctionalModel
    from fedsl.engine.simulator import Simulator
    from fedsl.engine.stacked import StackedSimulator
    from fedsl.models import build_model
    fed = random_federation([9, 31, 17, 24, 12, 30], n0=14, dtype=torch.float64)

    def sim(seed, rho=0.5):
        fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=seed).to(torch.float64))
        alg = make_algorithm("fednova", LocalTraining(0.1, 8), 1.0, None, rho=rho)
        return Simulator(fm, fed, alg, VectorisedExecutor(fm), clients_per_round=3, seed=seed)

    sims = [sim(1), sim(2)]
    st = StackedSimulator(sims)
    states = st.initial_states()
    singles = [s.initial_state() for s in (sim(1), sim(2))]
    one = [sim(1), sim(2)]
    for t in range(2):
        states, _ = st.round(states, t)
        singles = [o.round(s, t)[0] for o, s in zip(one, singles)]
    for a, b in zip(states, singles):
        assert all(torch.allclose(a.x[n], b.x[n], rtol=0, atol=1e-10) for n in a.x)
    with pytest.raises(ValueError, match="local step \\(rho\\) differs"):
        StackedSimulator([sim(1, 0.5), sim(2, 0.9)])


def test_scaffold_server_derives_the_clients_control_variate_changes():
    """The server's c moves by (1/N) Σ (c_i⁺ - c_i) with c_i⁺ as the clients compute it (to rounding:
    the server forms -c + (x - y_i)/(K_i η_l) without c_i)."""
    g = torch.Generator().manual_seed(1)
    rule = make_rule("scaffold", 1.0)
    x, sent = {"w": torch.randn(3, generator=g, dtype=torch.float64)}, {"c": {"w": torch.randn(3, generator=g,
                                                                                        dtype=torch.float64)}}
    old = [{"c_i": {"w": torch.randn(3, generator=g, dtype=torch.float64)}} for _ in range(2)]
    finals = {"w": x["w"] + torch.randn(2, 3, generator=g, dtype=torch.float64)}
    steps = (2, 5)
    new = [rule.client_final(x, old[j], sent, {"y": {"w": finals["w"][j]}}, steps[j], 0.1)[1] for j in range(2)]
    _, out = rule.server_update(x, sent, finals, HALF, ctx(list(steps)))
    expected = sent["c"]["w"] + sum(n["c_i"]["w"] - o["c_i"]["w"] for n, o in zip(new, old)) / 4
    assert torch.allclose(out["c"]["w"], expected, rtol=0, atol=1e-14)


def test_the_server_round_is_its_stages_in_one_order():
    """``server_round.stages``: which concerns a round has, in the order they run, read off the algorithm."""
    from fedsl.algorithms import DifferentialPrivacy, Robust, ServerLearning
    from fedsl.algorithms import server_round as R
    local = LocalTraining(0.1, 4)
    sl = lambda **kw: ServerLearning(1.0, 0.1, 4, 1, **kw)
    assert R.stages(make_algorithm("fedavg", local, 1.0, None)) == (R.weigh, R.rule)
    assert R.stages(make_algorithm("fsl", local, 1.0, sl())) == (R.weigh, R.rule)  # line 10 follows the stages
    assert R.stages(make_algorithm("feddu", local, 1.0, sl())) == (R.weigh, R.rule, R.rule_gamma)
    every = make_algorithm("fsl_p", local, 1.0, sl(log_angle=True), robust=Robust("median"),
                           privacy=DifferentialPrivacy(1.0, 0.5, 4))
    assert R.stages(every) == (R.robust, R.private, R.weigh, R.beside, R.measure_angle, R.rule)
    assert R._rule_alone(make_algorithm("fsl", local, 1.0, sl())) and not R._rule_alone(every)
