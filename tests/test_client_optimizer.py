"""The clients' optimiser: heavy-ball momentum μ_c and weight decay λ (``algorithm.client_momentum``,
``algorithm.weight_decay``; ``fedsl.algorithms.base.ClientOptimizer``).

- a client's round with them is torch.optim.SGD(lr=η_l, momentum=μ_c, weight_decay=λ) with a fresh optimizer per
  round: by hand and against torch on dyadic numbers (exact in float64), and on a model's own batches;
- they compose with the rules' corrections (the correction joins the gradient before the momentum) and weight decay
  is the L2 term of the loss for every rule; the rules that read a client's update as plain SGD's refuse momentum
  in one line;
- off (the defaults), the engines run the rule itself, and a zero momentum and decay change no bit;
- the sequential and vectorised executors, stacked runs and a Flower ClientApp give the same updates with them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import random_federation, run_rounds, tiny_config

from fedsl.algorithms import SPECS, LocalTraining, ServerLearning, client_update, make_algorithm, make_rule
from fedsl.algorithms.base import MOMENTUM_BUFFER, ClientOptimizer, LocalSGD
from fedsl.config.schema import ConfigError, validate
from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import make_plan
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]  # uneven: 2 to 4 steps of B = 8, so the vectorised executor pads


def P(*v):  # a one-parameter "model" with a vector weight
    return {"w": torch.tensor(v, dtype=torch.float64)}


def quadratic_grad(centre: float):
    """The gradient of f(y) = ½‖y - centre‖² (what the engine would hand a client step)."""
    return lambda y, batch, aux: {"w": y["w"] - centre}


def torch_sgd(x0: list[float], centre: float, steps: int, lr: float, momentum: float, weight_decay: float):
    """``steps`` steps of torch.optim.SGD on ½‖y - centre‖² from x0 (a fresh optimizer: the buffer starts empty)."""
    p = torch.nn.Parameter(torch.tensor(x0, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr, momentum=momentum, weight_decay=weight_decay)
    for _ in range(steps):
        p.grad = p.detach() - centre
        opt.step()
    return p.detach()


# ----------------------------------------------------------------------------- the step, exactly

def test_momentum_and_weight_decay_by_hand_and_as_torch_optim_sgd():
    """η_l = μ_c = λ = 1/2 on ½‖y - 2‖² from (4, -2): every number dyadic, so each is exact in float64.

    g' = g + λy, b ← μ_c·b + g' (b = 0 before the first step), y ← y - η_l·b:
        y = 4:  g' = 2 + 2 = 4,          b = 4,                  y = 2
        y = 2:  g' = 0 + 1 = 1,          b = 2 + 1 = 3,          y = 0.5
        y = .5: g' = -1.5 + .25 = -1.25, b = 1.5 - 1.25 = 0.25,  y = 0.375
    and for -2: -2 → 0.5 → 2.375 → 2.53125 (g' = -5, -1.25, 1.5625; b = -5, -3.75, -0.3125)."""
    opt = ClientOptimizer(make_rule("fedavg", 1.0), momentum=0.5, weight_decay=0.5)
    y, state, m = client_update(opt, P(4.0, -2.0), {}, {}, range(3), quadratic_grad(2.0), 0.5)
    assert y["w"].tolist() == [0.375, 2.53125] and state == {} and m == {"steps": 3}
    assert torch.equal(y["w"], torch_sgd([4.0, -2.0], 2.0, 3, 0.5, 0.5, 0.5))
    # each alone: momentum without decay, decay without momentum (torch's update either way)
    for mu, wd in ((0.5, 0.0), (0.0, 0.5)):
        y, _, _ = client_update(ClientOptimizer(make_rule("fedavg", 1.0), mu, wd), P(4.0, -2.0), {}, {}, range(3),
                                quadratic_grad(2.0), 0.5)
        assert torch.equal(y["w"], torch_sgd([4.0, -2.0], 2.0, 3, 0.5, mu, wd)), (mu, wd)
    plain, _, _ = client_update(make_rule("fedavg", 1.0), P(4.0, -2.0), {}, {}, range(3), quadratic_grad(2.0), 0.5)
    assert plain["w"].tolist() == [2.25, 1.5]  # plain SGD halves the distance to 2 each step


def test_the_buffer_lives_within_a_round():
    """Two rounds of one step each are two first steps (b = g' each time: no momentum carried over), and the
    carry's buffer never reaches the client's state."""
    opt = ClientOptimizer(make_rule("fedavg", 1.0), momentum=0.5)
    carry, _ = opt.client_init(P(4.0), {}, {})
    assert carry[MOMENTUM_BUFFER]["w"].tolist() == [0.0]
    y1, s1, _ = client_update(opt, P(4.0), {}, {}, range(1), quadratic_grad(2.0), 0.5)
    y2, s2, _ = client_update(opt, y1, s1, {}, range(1), quadratic_grad(2.0), 0.5)
    assert y1["w"].tolist() == [3.0] and y2["w"].tolist() == [2.5] and s1 == s2 == {}


def test_a_client_round_is_torch_optim_sgd_on_the_models_batches():
    """The engine's client update (its batches, its gradient of the weighted cross-entropy) with μ_c and λ equals
    torch.optim.SGD(momentum, weight_decay) stepping a copy of the module on the same batches, to float64 rounding:
    plain SGD itself differs there by an ulp (torch's module and fedsl's functional model round their gradients
    differently); the optimiser's arithmetic is exact in the dyadic test above."""
    fed = random_federation([23], n0=4, dtype=torch.float64)
    fm = FunctionalModel(build_model("mlp", 4, (1, 8, 8), seed=3).to(torch.float64))
    plan = make_plan([fed.clients[0]], [0], 5, 2, None, seed=0, round_=0,
                     stream=rng.CLIENT_BATCHES).to(torch.device("cpu"), torch.float64)
    lr, mu, wd = 0.1, 0.9, 0.01
    x0 = fm.params()
    got = SequentialExecutor(fm).train(ClientOptimizer(make_rule("fedavg", 1.0), mu, wd), [x0], plan, fed.x, fed.y,
                                       lr)[0]
    module = copy.deepcopy(fm.module)
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=mu, weight_decay=wd)
    for k in range(plan.steps[0]):
        w = plan.weight[0, k]
        b = int((w > 0).sum())
        idx = plan.idx[0, k, :b]
        opt.zero_grad()
        (F.cross_entropy(module(fed.x[idx]), fed.y[idx], reduction="none") * w[:b]).sum().backward()
        opt.step()
    assert plan.steps[0] == 10
    for n, p in module.named_parameters():
        torch.testing.assert_close(got[n][0], p.detach(), rtol=0, atol=1e-14, msg=n)
    plain = SequentialExecutor(fm).train(make_rule("fedavg", 1.0), [x0], plan, fed.x, fed.y, lr)[0]
    assert all((got[n] - plain[n]).abs().max() > 1e-4 for n in got)  # the settings move the model


# ----------------------------------------------------------------------------- composing with the rules

def test_a_rules_correction_joins_the_gradient_before_the_momentum():
    """FedProx (μ = 1/2, anchor x_t = 4) with μ_c = 1/2 on ½‖y - 2‖², η_l = 1/2, by hand:
        y = 4:   d = 2 + 0 = 2,              b = 2,              y = 3
        y = 3:   d = 1 + ½(3 - 4) = 0.5,     b = 1 + 0.5 = 1.5,  y = 2.25
    (its direction is g + μ(y - x_t); the buffer takes d)."""
    prox = make_rule("fedprox", 1.0, mu=0.5)
    carry, aux = prox.client_init(P(4.0), {}, {})
    assert prox.direction({"y": P(3.0)}, aux, P(1.0))["w"].tolist() == [0.5]
    y, _, _ = client_update(ClientOptimizer(prox, 0.5), P(4.0), {}, {}, range(2), quadratic_grad(2.0), 0.5)
    assert y["w"].tolist() == [2.25]


def _client_half_rules():
    """Every rule whose client half differs (by its spec: a correction, a state, a term, sent values)."""
    return ["fedavg", "fedprox", "scaffold", "feddyn", "fednova", "moon", "fedclg_c"]


def _inputs(name: str):
    """x, the client's state and what was sent, for a rule's client half on P(·, ·)."""
    rule = make_rule(name, 1.0, **({"rho": 0.5} if name == "fednova" else {}))
    x = P(4.0, -1.0)
    state = {k: {n: v + 0.25 for n, v in g.items()} if k != "seen" else g
             for k, g in rule.init_client_state(x).items()}
    sent = {"c": P(0.5, -0.25), "server_grad": P(1.0, 0.5), "start_grad": P(-0.5, 0.75)}
    return rule, x, state, sent


@pytest.mark.parametrize("name", _client_half_rules())
def test_weight_decay_is_the_l2_term_of_the_loss_for_every_rule(name):
    """λ with any rule (μ_c = 0) is the rule's own client half on the gradient of f + λ/2‖y‖²: the same numbers,
    bit for bit, final model and new state (FedNova's heavy-ball ρ takes g + λy, as torch's SGD would)."""
    rule, x, state, sent = _inputs(name)
    lam = 0.125
    wd = client_update(ClientOptimizer(rule, 0.0, lam), x, state, sent, range(4), quadratic_grad(0.5), 0.25)
    l2 = client_update(rule, x, state, sent, range(4),
                       lambda y, b, aux: {"w": (y["w"] - 0.5) + lam * y["w"]}, 0.25)
    assert torch.equal(wd[0]["w"], l2[0]["w"])
    assert wd[1].keys() == l2[1].keys() and all(torch.equal(wd[1][k][n], l2[1][k][n]) for k in wd[1] for n in wd[1][k])


def test_momentum_with_a_corrected_rule_is_heavy_ball_on_its_direction():
    """For the rules that compose with momentum, each step's buffer takes the rule's direction (SCAFFOLD-style
    correction in FedCLG-C, FedDyn's α(y - x_t) - ∇L_i): the update equals torch-style heavy ball on d, by hand."""
    for name in ("feddyn", "fedclg_c", "fedprox", "moon"):
        rule, x, state, sent = _inputs(name)
        mu, lr, grad = 0.5, 0.25, quadratic_grad(0.5)
        got, new, _ = client_update(ClientOptimizer(rule, mu), x, state, sent, range(3), grad, lr)
        carry, aux = rule.client_init(x, state, sent)
        y, b = x, {"w": torch.zeros(2, dtype=torch.float64)}
        for _ in range(3):
            d = rule.direction({"y": y}, aux, grad(y, None, aux))
            b = {"w": mu * b["w"] + d["w"]}
            y = {"w": y["w"] - lr * b["w"]}
        assert torch.equal(got["w"], y["w"]), name
        want = rule.client_final(x, state, sent, {"y": y}, 3, lr)[1]
        assert all(torch.equal(new[k][n], want[k][n]) for k in want for n in want[k]), name


def test_the_refactored_steps_are_the_rules_formulas():
    """FedProx, SCAFFOLD, FedDyn and FedCLG-C now give their correction as ``direction``; their step is still their
    paper's formula, operation for operation (plain SGD's numbers unchanged)."""
    x, g, lr = P(4.0, -1.0), P(0.3, -0.7), 0.1
    y = P(3.1, -0.4)
    prox = make_rule("fedprox", 1.0, mu=0.37)
    _, aux = prox.client_init(x, {}, {})
    assert torch.equal(prox.client_step({"y": y}, aux, g, lr)["y"]["w"],
                       y["w"] - lr * (g["w"] + 0.37 * (y["w"] - x["w"])))
    scaffold, _, state, sent = _inputs("scaffold")
    _, aux = scaffold.client_init(x, state, sent)
    corr = sent["c"]["w"] - state["c_i"]["w"]
    assert torch.equal(scaffold.direction({"y": y}, aux, g)["w"], g["w"] + corr)
    assert torch.equal(scaffold.client_step({"y": y}, aux, g, lr)["y"]["w"], y["w"] - lr * (g["w"] + corr))
    dyn, _, state, sent = _inputs("feddyn")
    _, aux = dyn.client_init(x, state, sent)
    assert torch.equal(dyn.client_step({"y": y}, aux, g, lr)["y"]["w"],
                       y["w"] - lr * (g["w"] + dyn.alpha * (y["w"] - x["w"]) + -state["grad_i"]["w"]))
    clg, _, state, sent = _inputs("fedclg_c")
    _, aux = clg.client_init(x, state, sent)
    corr = sent["server_grad"]["w"] - sent["start_grad"]["w"]
    assert torch.equal(clg.client_step({"y": y}, aux, g, lr)["y"]["w"], y["w"] - lr * (g["w"] + corr))


# ----------------------------------------------------------------------------- refusals

REFUSED = ("scaffold", "fednova", "fedclg_s", "qfedavg")


def test_the_rules_that_read_plain_sgd_refuse_momentum_in_one_line():
    assert {n for n, s in SPECS.items() if s.momentum_refused} == set(REFUSED)
    for name in REFUSED:
        data = tiny_config(alg=name)
        data["algorithm"]["client_momentum"] = 0.9
        with pytest.raises(ConfigError, match=rf"^algorithm.client_momentum = 0.9 with algorithm.name = '{name}': "
                                              r".*: expected algorithm.client_momentum = 0$") as e:
            validate(data)
        assert "\n" not in str(e.value)
        data["algorithm"]["client_momentum"] = 0.0
        data["algorithm"]["weight_decay"] = 1e-3
        assert validate(data).algorithm.weight_decay == 1e-3  # weight decay composes with every rule
        with pytest.raises(ValueError, match=rf"client_momentum = 0.5 with algorithm.name = '{name}'"):
            make_algorithm(name, LocalTraining(0.1, 8, momentum=0.5), 1.0,
                           ServerLearning(1.0, 0.1, 4, 1) if SPECS[name].server_learning != "off" else None)
    # a rule that takes its own step, used directly: refused by the wrapper itself
    with pytest.raises(ValueError, match=r"^algorithm.client_momentum = 0.5: FedNova's clients take their own local "
                                         r"step, which has no place for the momentum buffer: expected 0$"):
        ClientOptimizer(make_rule("fednova", 1.0), 0.5)


@pytest.mark.parametrize("key, value, expected", [
    ("client_momentum", 1.0, "less than 1"), ("client_momentum", -0.1, "greater than or equal to 0"),
    ("weight_decay", -1e-3, "greater than or equal to 0"), ("weight_decay", float("inf"), "finite"),
    ("client_momentum", "0.9", "valid number")])
def test_bad_values_are_refused_in_one_line(key, value, expected):
    data = tiny_config(alg="fsl")
    data["algorithm"][key] = value
    with pytest.raises(ConfigError, match=rf"^algorithm.{key} = .*{expected}") as e:
        validate(data)
    assert "\n" not in str(e.value)
    for mu, wd, needle in ((1.0, 0.0, r"client_momentum = 1.0: expected a number in \[0, 1\)"),
                           (0.0, -1.0, r"weight_decay = -1.0: expected a finite number >= 0")):
        with pytest.raises(ValueError, match=needle):
            ClientOptimizer(LocalSGD(), mu, wd)


# ----------------------------------------------------------------------------- off by default

def test_off_by_default_the_engines_run_the_rule_itself():
    """The defaults are 0 and 0, and then the client half is the rule object itself: the code path (and so every
    number) of a run that never heard of these keys."""
    cfg = validate(tiny_config(alg="fsl"))
    assert (cfg.algorithm.client_momentum, cfg.algorithm.weight_decay) == (0.0, 0.0)
    alg = make_algorithm("fedprox", LocalTraining(0.1, 8), 1.0, None)
    assert alg.client is alg.rule
    on = make_algorithm("fedprox", LocalTraining(0.1, 8, momentum=0.9, weight_decay=1e-3), 1.0, None)
    assert on.client == ClientOptimizer(on.rule, 0.9, 1e-3)


def _sim(name, executor, local, dtype=torch.float64, seed=11, fed=None, **hp):
    fed = fed if fed is not None else random_federation(SIZES, n0=14, dtype=dtype)
    fm = FunctionalModel(build_model("mlp", 4, (1, 8, 8), seed=3).to(dtype))
    sl = ServerLearning(gamma=0.8, lr=0.05, batch_size=6, epochs=1) if name in ("fsl", "fedclg_c") else None
    alg = make_algorithm(name, local, 1.0 if name in ("feddyn", "moon", "fednova") else 1.7, sl, **hp)
    return Simulator(fm, fed, alg, executor(fm), clients_per_round=5, seed=seed)


def test_zero_momentum_and_decay_change_no_bit(monkeypatch):
    """The wrapper forced on with μ_c = λ = 0 (not what the defaults run) gives the plain run bit for bit: 3 rounds
    of FSL and of FedProx, models and test metrics."""
    def run(name, **hp):
        st, infos = run_rounds(_sim(name, SequentialExecutor, LocalTraining(0.1, 8), **hp), 3)
        return st.x, infos
    for name, hp in (("fsl", {}), ("fedprox", {"mu": 0.3})):
        plain, infos = run(name, **hp)
        with monkeypatch.context() as m:
            m.setattr(LocalTraining, "client", lambda self, rule: ClientOptimizer(rule, 0.0, 0.0))
            wrapped, winfos = run(name, **hp)
        assert all(torch.equal(plain[n], wrapped[n]) for n in plain), name
        assert [i.client_steps for i in infos] == [i.client_steps for i in winfos]


# ----------------------------------------------------------------------------- the engines agree

@pytest.mark.parametrize("name, mu, wd, hp", [
    ("fsl", 0.9, 1e-2, {}), ("fedprox", 0.5, 1e-2, {"mu": 0.3}), ("feddyn", 0.5, 0.0, {"alpha": 0.1}),
    ("moon", 0.9, 1e-3, {}), ("scaffold", 0.0, 5e-2, {}), ("fednova", 0.0, 5e-2, {"rho": 0.5})])
def test_sequential_and_vectorised_executors_agree(name, mu, wd, hp):
    """3 rounds of uneven clients (padded, masked steps carry the buffer unchanged) in float64."""
    local = LocalTraining(0.1, 8, momentum=mu, weight_decay=wd)
    a, infos = run_rounds(_sim(name, SequentialExecutor, local, **hp), 3)
    b, _ = run_rounds(_sim(name, VectorisedExecutor, local, **hp), 3)
    assert len(set(infos[-1].client_steps)) > 1  # padded steps were exercised
    for n in a.x:
        torch.testing.assert_close(a.x[n], b.x[n], rtol=0, atol=1e-10, msg=n)
    plain, _ = run_rounds(_sim(name, SequentialExecutor, LocalTraining(0.1, 8), **hp), 3)
    assert max((a.x[n] - plain.x[n]).abs().max().item() for n in a.x) > 1e-6  # the settings took effect


@pytest.mark.parametrize("executor, exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
def test_stacked_runs_equal_one_by_one_and_differing_settings_do_not_stack(executor, exact):
    fed = random_federation(SIZES, n0=14, dtype=torch.float64)
    local = LocalTraining(0.1, 8, momentum=0.9, weight_decay=1e-2)

    def sims():
        return [_sim("fsl", executor, local, fed=fed, seed=11),
                _sim("fsl", executor, LocalTraining(0.05, 5, momentum=0.9, weight_decay=1e-2), fed=fed, seed=12)]
    stacked = StackedSimulator(sims())
    states = stacked.initial_states()
    for t in range(3):
        states, _ = stacked.round(states, t)
    for st, sim in zip(states, sims()):
        alone, _ = run_rounds(sim, 3)
        for n in alone.x:
            torch.testing.assert_close(st.x[n], alone.x[n], rtol=0, atol=0 if exact else 1e-12, msg=n)
    for other in (LocalTraining(0.1, 8, momentum=0.5, weight_decay=1e-2), LocalTraining(0.1, 8, momentum=0.9)):
        with pytest.raises(ValueError, match=r"run 1 cannot be stacked with run 0: the clients' momentum or weight "
                                             r"decay \(algorithm.client_momentum, algorithm.weight_decay\) differs"):
            StackedSimulator([_sim("fsl", executor, local, fed=fed), _sim("fsl", executor, other, fed=fed)])


def test_a_sweep_over_the_settings_is_not_stacked_together(tmp_path):
    from fedsl.config.expand import expand_variants
    from fedsl.sweeps.compare import stack_groups, stack_key
    cfg = validate(tiny_config(alg="fsl", stack=8, seeds=[0, 1],
                               sweep={"algorithm.client_momentum": [0.0, 0.9], "algorithm.weight_decay": [0.0, 1e-3]}))
    runs = expand_variants(cfg)
    groups = stack_groups(runs, tmp_path, resume=False)
    assert len(groups) == 4 and all(len(g) == 2 for g in groups)  # the two seeds of each setting together
    for g in groups:
        assert len({(runs[r].algorithm.client_momentum, runs[r].algorithm.weight_decay) for r in g}) == 1
        assert len({stack_key(runs[r]) for r in g}) == 1


# ----------------------------------------------------------------------------- Flower

def test_a_flower_client_app_gives_the_simulators_update(flower_task_identity):
    """FSL with μ_c and λ in the run config: fedsl's ClientApps (in process, driven by FedslStrategy) give the
    simulator's run bit for bit; and a ClientApp's train reply is ``train_partition``'s update with the settings."""
    pytest.importorskip("flwr")
    from conftest import max_diff
    from test_flower import BASE, run_flower, run_simulator

    from fedsl.flower import parse_run_config

    rc = {**BASE, "rounds": 3, "algorithm.client_momentum": 0.9, "algorithm.weight_decay": 1e-2}
    strategy, _ = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert max_diff(strategy.state.x, expected.x) == 0.0
    assert strategy.alg.local.momentum == 0.9 and strategy.alg.local.weight_decay == 1e-2
    plain, _ = run_simulator({**BASE, "rounds": 3})
    assert max_diff(plain.x, expected.x) > 1e-6
    with pytest.raises(ConfigError, match="client_momentum = 0.9 with algorithm.name = 'scaffold'"):
        parse_run_config({**rc, "algorithm.name": "scaffold"})


def test_the_captured_vectorised_step_equals_the_eager_one():
    """``compile``: the vmapped step with the momentum buffer in its carry, captured by torch.compile ('aot_eager':
    the capture without code generation), computes the eager step's rounds, in one graph (no graph break)."""
    from torch._dynamo.utils import counters
    fed = random_federation(SIZES, n0=14, dtype=torch.float64)
    local = LocalTraining(0.1, 8, momentum=0.9, weight_decay=1e-2)

    def sim(compile_mode):
        fm = FunctionalModel(build_model("mlp", 4, (1, 8, 8), seed=3).to(torch.float64))
        alg = make_algorithm("fedprox", local, 1.0, None, mu=0.3)
        return Simulator(fm, fed, alg, VectorisedExecutor(fm, compile_mode), clients_per_round=4, seed=3)
    torch._dynamo.reset()  # a graph an earlier test compiled would be reused, not counted
    counters.clear()
    a, _ = run_rounds(sim("off"), 2)
    b, _ = run_rounds(sim("aot_eager"), 2)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    for n in a.x:
        torch.testing.assert_close(a.x[n], b.x[n], rtol=0, atol=1e-12, msg=n)
