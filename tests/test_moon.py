"""The client-loss hook (a rule's ``local_loss`` term inside the differentiated function) and MOON on it.

- a zero term changes nothing, bit for bit, on both executors; a non-zero one does change the model;
- MOON's step computed by the engine equals a hand-written plain-PyTorch one (one client, one step);
- first participation: z_prev = z_glob, the term has no gradient (FedAvg's step, to rounding);
- stacked MOON runs equal the runs one by one (exactly with the sequential executor);
- a run through the runner completes and resumes bit-identically (the previous models are a client table);
- MOON with a model that exposes no representation is a one-line configuration error.
"""

import copy
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from conftest import flat_state, random_federation, run_rounds, tiny_config
from torch import nn

from fedsl.algorithms import Algorithm, LocalTraining, make_algorithm, make_rule, spec
from fedsl.algorithms.fedavg import FedAvg
from fedsl.config import schema as C
from fedsl.config.schema import ConfigError
from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import make_plan
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import MODELS, TEXT_MODELS, build_model, has_representation
from fedsl.runs.build import check
from fedsl.runs.runner import run

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30]
EXECUTORS = [SequentialExecutor, VectorisedExecutor]


def _fm(fed, model="small_cnn", seed=3):
    return FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=seed).to(fed.x.dtype))


def _equal_states(a, b) -> bool:
    fa, fb = flat_state(a), flat_state(b)
    return fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


@dataclass(frozen=True)
class _Term(FedAvg):
    """FedAvg plus a test term c·Σ z² + c·Σ logits² (c = 0: a term that reaches z and the logits but is zero)."""

    c: float = 0.0
    name: str = field(default="term", init=False)

    def local_loss(self, y, aux, batch):
        z = batch.features if batch.features is not None else batch.logits
        return self.c * ((z * z).sum() + (batch.logits * batch.logits).sum())


# ------------------------------------------------------------------------------------------------ the hook

@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("model", ["small_cnn", "linear"])  # with a representation (and dropout), without
def test_a_zero_term_equals_plain_training_bit_for_bit(executor, model):
    fed = random_federation(SIZES, seed=0)
    local = LocalTraining(0.1, 8)

    def final(rule):
        fm = _fm(fed, model)
        return run_rounds(Simulator(fm, fed, Algorithm(rule.name, local, rule), executor(fm), 4, seed=5), 3)[0]

    plain = final(FedAvg(1.0))
    assert _equal_states(final(_Term(1.0, c=0.0)), plain)
    moved = final(_Term(1.0, c=1e-3))  # the hook is really in the gradient
    assert not torch.equal(moved.x[next(iter(moved.x))], plain.x[next(iter(plain.x))])


# ------------------------------------------------------------------------------------------------ MOON, one step

def _one_step_setup(seen: bool):
    fed = random_federation([40], seed=2, n0=4)
    fm = _fm(fed, "small_cnn")  # dropout in it: the local model's mask is the step's key
    x0 = fm.params()
    g = torch.Generator().manual_seed(9)
    prev = {n: p + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in x0.items()}
    flag = torch.tensor(1.0 if seen else 0.0, dtype=torch.float64)
    plan = make_plan([fed.clients[0]], [0], 16, 1, 1, 7, 0, rng.CLIENT_BATCHES).to(fed.x.device, fed.x.dtype)
    states = {"prev": {n: v.unsqueeze(0) for n, v in prev.items()}, "seen": {"flag": flag.unsqueeze(0)}}
    return fed, fm, x0, prev, plan, states


def _hand_moon_step(fm, x0, prev, xb, yb, key, lr, mu, tau, seen):
    """One SGD step of CE + μ·ℓ_con written with torch.nn and autograd, outside the engine."""
    net = copy.deepcopy(fm.module).train(True)
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(x0[n])
    for name in fm.key_names:  # the step's dropout key, as the engine feeds it
        net.get_submodule(name.rsplit(".", 1)[0]).key = key.clone()
    body = nn.Sequential(*list(net)[:-2])  # small_cnn: z is the input of its last Dropout + Linear

    def frozen_z(params):
        m = copy.deepcopy(net).train(False)
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(params[n])
            return nn.Sequential(*list(m)[:-2])(xb)

    z = body(xb)
    logits = net[-1](net[-2](z))
    ce = F.cross_entropy(logits, yb)
    pos = torch.exp(F.cosine_similarity(z, frozen_z(x0), dim=1) / tau)
    neg = torch.exp(F.cosine_similarity(z, frozen_z(prev if seen else x0), dim=1) / tau)
    loss = ce + mu * (-torch.log(pos / (pos + neg))).mean()
    loss.backward()
    return {n: x0[n] - lr * p.grad for n, p in net.named_parameters()}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_moon_step_equals_a_hand_written_one(executor):
    fed, fm, x0, prev, plan, states = _one_step_setup(seen=True)
    rule, lr = make_rule("moon", 1.0, moon_mu=1.0, moon_tau=0.5), 0.2
    finals, rows = executor(fm).train(rule, [x0], plan, fed.x, fed.y, lr, states, [{}])
    idx = plan.idx[0, 0]
    assert plan.steps == (1,) and bool((plan.weight[0, 0] > 0).all())  # one full batch: a plain mean
    want = _hand_moon_step(fm, x0, prev, fed.x[idx], fed.y[idx], plan.keys[0, 0], lr, 1.0, 0.5, seen=True)
    for n in want:
        torch.testing.assert_close(finals[n][0], want[n], rtol=1e-12, atol=1e-14)
    # the term matters here: FedAvg's step is elsewhere
    plain, _ = executor(fm).train(make_rule("fedavg", 1.0), [x0], plan, fed.x, fed.y, lr)
    assert max((plain[n][0] - want[n]).abs().max().item() for n in want) > 1e-6
    # the client's new state: its final model is its next round's previous model
    assert all(torch.equal(rows["prev"][n][0], finals[n][0]) for n in x0) and rows["seen"]["flag"].tolist() == [1.0]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_moon_first_participation_compares_with_x_t_and_adds_no_gradient(executor):
    """Before a client has a previous model, z_prev = z_glob (x_t's): ℓ_con = log 2 whatever y, no gradient."""
    fed, fm, x0, prev, plan, states = _one_step_setup(seen=False)
    lr = 0.2
    finals, rows = executor(fm).train(make_rule("moon", 1.0), [x0], plan, fed.x, fed.y, lr, states, [{}])
    plain, _ = executor(fm).train(make_rule("fedavg", 1.0), [x0], plan, fed.x, fed.y, lr)
    idx = plan.idx[0, 0]
    want = _hand_moon_step(fm, x0, prev, fed.x[idx], fed.y[idx], plan.keys[0, 0], lr, 1.0, 0.5, seen=False)
    for n in x0:  # the stored prev (a random model) is not read
        torch.testing.assert_close(finals[n][0], plain[n][0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(finals[n][0], want[n], rtol=1e-12, atol=1e-14)
    assert rows["seen"]["flag"].tolist() == [1.0]


def test_moon_spec_defaults_and_bounds():
    rule = make_rule("moon", 1.0)
    assert (rule.moon_mu, rule.moon_tau, spec("moon").default_global_lr(5)) == (1.0, 0.5, 1.0)  # paper's μ, τ, η_g
    for bad in ({"moon_tau": 0.0}, {"moon_mu": -1.0}):
        data = tiny_config(rounds=2, alg="moon")
        data["algorithm"].update(bad)
        with pytest.raises(C.ConfigError, match=next(iter(bad))):
            C.validate(data)


# ------------------------------------------------------------------------------------------------ stacked

def _moon_sim(fed, executor, *, seed, lr=0.1, batch=8, model="small_cnn", mu=1.0):
    fm = _fm(fed, model)
    alg = make_algorithm("moon", LocalTraining(lr, batch), 1.0, None, moon_mu=mu, moon_tau=0.5)
    return Simulator(fm, fed, alg, executor(fm), 4, seed=seed)


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
def test_stacked_moon_equals_one_by_one(executor, exact):
    """Seeds, η_l, B and the data pool differ; 4 of 6 clients per round, so rounds 2-3 mix clients that
    have a previous model with clients that have none (their first participation)."""
    fed_a, fed_b = random_federation(SIZES, seed=0), random_federation(SIZES[::-1], seed=1)

    def sims():
        return [_moon_sim(fed_a, executor, seed=11), _moon_sim(fed_a, executor, seed=12, lr=0.05, batch=5),
                _moon_sim(fed_b, executor, seed=13)]

    stacked = StackedSimulator(sims())
    states = stacked.initial_states()
    for t in range(3):
        states, _ = stacked.round(states, t)
    for r, sim in enumerate(sims()):
        alone, _ = run_rounds(sim, 3)
        a, b = flat_state(states[r]), flat_state(alone)
        assert a.keys() == b.keys() and "clients.prev.11.weight" in a
        for k in a:
            if exact:
                assert torch.equal(a[k], b[k]), f"run {r}: {k} differs"
            else:
                torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-12, msg=f"run {r}: {k}")
    seen = states[0].clients["seen"]["flag"]
    assert seen.sum() >= 4  # the sampled clients now have their previous models
    with pytest.raises(ValueError, match="moon_mu"):  # one vmapped step takes one μ
        StackedSimulator([_moon_sim(fed_a, executor, seed=11), _moon_sim(fed_a, executor, seed=12, mu=0.5)])


# ------------------------------------------------------------------------------------------------ end to end

def test_moon_runs_and_resumes_bit_identically_through_the_runner(tmp_path):
    cfg = C.validate(tiny_config(rounds=5, alg="moon", dtype="float64", executor="sequential",
                                 checkpoint_every=2))
    quiet = {"log": lambda s: None, "progress": False}
    run(cfg, tmp_path / "full", stop_after=4, **quiet)  # 4 rounds straight (its checkpoint keeps the tables)
    assert run(cfg, tmp_path / "part", stop_after=2, **quiet)["status"] == "interrupted"
    assert run(cfg, tmp_path / "part", resume=True, stop_after=2, **quiet)["rounds_done"] == 4  # 2, resumed, 2
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in ("full", "part"))
    assert a["round"] == b["round"] == 4 and set(a["clients"]) == {"prev", "seen"}
    pa, pb = a["params"], b["params"]
    assert pa.keys() == pb.keys() and all(torch.equal(v, pb[n]) for n, v in pa.items())
    for k, g in a["clients"].items():
        assert g.keys() == b["clients"][k].keys() and all(torch.equal(v, b["clients"][k][n]) for n, v in g.items()), k
    assert 0 < a["clients"]["seen"]["flag"].sum() <= 6
    for d in ("full", "part"):
        summary = run(cfg, tmp_path / d, resume=True, **quiet)
        assert summary["status"] == "completed" and summary["rounds_done"] == 5


def test_moon_with_a_model_without_representation_is_a_one_line_config_error(tmp_path):
    data = tiny_config(rounds=2, alg="moon")
    data["model"] = {"name": "linear"}
    cfg = C.validate(data)
    with pytest.raises(ConfigError) as e:
        check(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "'moon'" in msg and "'linear'" in msg and "features(x)" in msg
    with pytest.raises(ConfigError, match="has none"):  # a run started without check() is refused too
        run(cfg, tmp_path / "r", log=lambda s: None, progress=False)
    data["model"] = {"name": "mlp"}
    check(C.validate(data))  # a model with a representation passes
    fed = random_federation(SIZES, seed=0)  # the Python API, without the runner: the rule says it in one line
    fm = _fm(fed, "linear")
    sim = Simulator(fm, fed, make_algorithm("moon", LocalTraining(0.1, 8), 1.0, None), SequentialExecutor(fm), 4, 0)
    with pytest.raises(ValueError, match=r"^algorithm 'moon' reads the model's representation z: expected"):
        sim.round(sim.initial_state(), 0)


def test_built_in_models_expose_a_representation_that_composes_to_forward():
    for name in MODELS:
        text = name in TEXT_MODELS  # character indices [L], not images
        shape = (80,) if text else (3, 32, 32) if name == "cifar_cnn" else (1, 28, 28)
        model = build_model(name, 80 if text else 10, shape, seed=0).train(False)
        assert has_representation(model) == (name not in ("linear", "logreg")), name
        if name not in ("linear", "logreg"):
            g = torch.Generator().manual_seed(0)
            x = torch.randint(0, 80, (2, *shape), generator=g) if text else torch.randn(2, *shape, generator=g)
            assert torch.equal(model.head(model.features(x)), model(x)), name
    assert build_model("cifar_cnn", 10, (3, 32, 32), seed=0).features(torch.zeros(1, 3, 32, 32)).shape == (1, 128)
    assert not has_representation(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)))
    holder = nn.Module()
    holder.features, holder.head = nn.Identity(), nn.Identity()  # submodules of those names (torchvision's VGG)
    assert not has_representation(holder)


def test_captured_moon_step_equals_the_eager_one_float64():
    """The hook is inside the captured step (torch.compile's capture, what the GPU's compile modes replay): one
    graph, no graph break, the eager rounds' numbers."""
    from torch._dynamo.utils import counters
    fed = random_federation(SIZES, seed=0)

    def sim(mode):
        fm = _fm(fed)
        return Simulator(fm, fed, make_algorithm("moon", LocalTraining(0.1, 8), 1.0, None),
                         VectorisedExecutor(fm, mode), 4, seed=3)

    torch._dynamo.reset()  # a graph compiled by an earlier test in this process would be reused, not counted
    counters.clear()
    a, _ = run_rounds(sim("off"), 2)
    b, _ = run_rounds(sim("aot_eager"), 2)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    fa, fb = flat_state(a), flat_state(b)
    assert all(torch.allclose(fa[k], fb[k], rtol=0, atol=1e-12) for k in fa)


def test_moon_on_flower_matches_the_simulator(one_thread, flower_task_identity):
    """On Flower each client keeps its previous model in its ClientApp's context.state: the same rounds."""
    pytest.importorskip("flwr")
    from conftest import max_diff
    from test_flower import BASE, run_flower, run_simulator
    rc = {**BASE, "algorithm.name": "moon", "rounds": 3}
    strategy, grid = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert max_diff(strategy.state.x, expected.x) == 0.0 and strategy.state.clients == {}
    for ctx in grid.contexts.values():
        stored = ctx.state.array_records.get("fedsl.prev")
        if stored is not None:
            row = {n: torch.from_numpy(a.numpy()) for n, a in stored.items()}
            pid = ctx.node_config["partition-id"]
            assert max_diff(row, {n: v[pid] for n, v in expected.clients["prev"].items()}) == 0.0


def test_moon_on_worker_processes_is_bit_identical_to_sequential():
    """executor = 'processes': the workers build the same hooked gradient (the rule travels pickled)."""
    from fedsl.engine.pool import ProcessPoolExecutor
    fed = random_federation(SIZES, seed=0)
    finals = []
    for make in (SequentialExecutor, lambda fm: ProcessPoolExecutor(fm, workers=2)):
        fm = _fm(fed)
        ex = make(fm)
        try:
            sim = Simulator(fm, fed, make_algorithm("moon", LocalTraining(0.1, 8), 1.0, None), ex, 4, seed=1)
            finals.append(run_rounds(sim, 2)[0])
        finally:
            getattr(ex, "close", lambda: None)()
    assert _equal_states(*finals)
