import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_federation
from torch import nn

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor, make_executor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import make_plan
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model

# uneven clients: 9..31 samples, so with B=8 clients take 2, 3 or 4 steps and the last
# batch of an epoch is partial -> the vectorised executor pads with no-op steps.
SIZES = [9, 31, 17, 24, 12, 30, 16, 20]


def _run(executor_cls, alg_name, dtype, rounds=3, model="small_cnn", epochs=1, steps=None):
    fed = random_federation(SIZES, n0=14, dtype=dtype)
    fm = FunctionalModel(build_model(model, 4, (1, 8, 8), seed=3).to(dtype))
    server = ServerLearning(gamma=0.8, lr=0.05, batch_size=6, epochs=1)
    alg = make_algorithm(alg_name, LocalTraining(0.1, 8, epochs, steps), 1.7, server)
    sim = Simulator(fm, fed, alg, executor_cls(fm), clients_per_round=5, seed=11)
    st = sim.initial_state()
    for t in range(rounds):
        st, info = sim.round(st, t)
    return st.x, info


@pytest.mark.parametrize("alg", ["fedavg", "fsl", "fsl_p", "ds"])
def test_vectorised_equals_sequential_float64(alg):
    a, info = _run(SequentialExecutor, alg, torch.float64)
    b, _ = _run(VectorisedExecutor, alg, torch.float64)
    assert len(set(info.client_steps)) > 1  # the masked no-op steps were exercised
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=0, atol=1e-10), n


@pytest.mark.parametrize("alg", ["fedavg", "fsl", "fsl_p", "ds"])
def test_vectorised_equals_sequential_float32(alg):
    a, _ = _run(SequentialExecutor, alg, torch.float32)
    b, _ = _run(VectorisedExecutor, alg, torch.float32)
    for n in a:
        scale = a[n].abs().max().clamp_min(1e-12)
        assert ((a[n] - b[n]).abs().max() / scale).item() < 1e-4, n


@pytest.mark.parametrize("executor_cls", [SequentialExecutor, VectorisedExecutor])
def test_server_epochs_set_k0_in_the_simulator(executor_cls):
    """K0 = E_s·⌈n0/B0⌉ at the simulator: E_s = 3 server epochs of n0 = 14 in batches of 6 are 9 steps a round
    (not E_s = 1's 3), equal to asking for K0 = 9 steps, and they change the model."""
    def run(epochs, steps=None):
        fed = random_federation(SIZES, n0=14, dtype=torch.float64)
        fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).to(torch.float64))
        alg = make_algorithm("fsl", LocalTraining(0.1, 8), 1.7, ServerLearning(0.8, 0.05, 6, epochs, steps))
        sim = Simulator(fm, fed, alg, executor_cls(fm), clients_per_round=5, seed=11)
        st = sim.initial_state()
        for t in range(2):
            st, info = sim.round(st, t)
        return st.x, info
    three, info3 = run(3)
    one, info1 = run(1)
    as_steps, info_k = run(1, steps=9)
    assert (info3.server_steps, info1.server_steps, info_k.server_steps) == (9, 3, 9)
    assert max((three[n] - one[n]).abs().max().item() for n in three) > 1e-6
    assert all(torch.equal(three[n], as_steps[n]) for n in three)


def test_executors_agree_with_local_steps_and_epochs():
    a, info = _run(SequentialExecutor, "fsl", torch.float64, epochs=2)
    b, _ = _run(VectorisedExecutor, "fsl", torch.float64, epochs=2)
    assert max(info.client_steps) == 8  # 2 epochs of ceil(31/8)
    assert all(torch.allclose(a[n], b[n], atol=1e-10, rtol=0) for n in a)
    a, info = _run(SequentialExecutor, "fedavg", torch.float64, steps=7)
    b, _ = _run(VectorisedExecutor, "fedavg", torch.float64, steps=7)
    assert set(info.client_steps) == {7}
    assert all(torch.allclose(a[n], b[n], atol=1e-10, rtol=0) for n in a)


def test_any_module_without_batchnorm_runs_on_both_executors():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.norm = nn.GroupNorm(2, 4)
            self.drop = nn.Dropout(0.2)
            self.fc = nn.Linear(4 * 8 * 8, 4)

        def forward(self, x):
            return self.fc(self.drop(torch.tanh(self.norm(self.conv(x)))).flatten(1))

    out = []
    for ex in (SequentialExecutor, VectorisedExecutor):
        torch.manual_seed(0)
        fm = FunctionalModel(Net().double())
        fed = random_federation(SIZES, dtype=torch.float64)
        alg = make_algorithm("fsl", LocalTraining(0.1, 8), 1.0, ServerLearning(1.0, 0.1, 6, 1))
        sim = Simulator(fm, fed, alg, ex(fm), 4, seed=0)
        st = sim.initial_state()
        for t in range(2):
            st, _ = sim.round(st, t)
        out.append(st.x)
    assert all(torch.allclose(out[0][n], out[1][n], atol=1e-10, rtol=0) for n in out[0])


def test_zero_weight_steps_are_exact_noops():
    fed = random_federation([10], dtype=torch.float64)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=0).double())
    params = fm.params()
    plan = make_plan([fed.clients[0]], [0], 4, 1, None, seed=0, round_=0, stream=rng.CLIENT_BATCHES)
    # a plan whose every weight is zero leaves the model bit-identical
    silent = type(plan)(plan.idx, torch.zeros_like(plan.weight), plan.keys, plan.steps)
    out = VectorisedExecutor(fm).local_sgd(params, silent, fed.x, fed.y, 0.5)
    assert all(torch.equal(out[n][0], params[n]) for n in params)


def test_plan_covers_each_sample_once_per_epoch():
    data = np.arange(100, 123)  # 23 samples
    plan = make_plan([data], [5], 5, 2, None, seed=1, round_=4, stream=rng.CLIENT_BATCHES)
    assert plan.steps == (10,)  # 2 epochs x ceil(23/5)
    real = plan.weight[0] > 0
    for epoch in range(2):
        idx = plan.idx[0, epoch * 5:(epoch + 1) * 5][real[epoch * 5:(epoch + 1) * 5]]
        assert sorted(idx.tolist()) == list(range(100, 123))
    assert torch.allclose(plan.weight[0].sum(1), torch.ones(10, dtype=torch.float64))
    # plans are a function of (seed, round, client id) only
    again = make_plan([data], [5], 5, 2, None, seed=1, round_=4, stream=rng.CLIENT_BATCHES)
    other = make_plan([data], [5], 5, 2, None, seed=1, round_=5, stream=rng.CLIENT_BATCHES)
    assert torch.equal(plan.idx, again.idx) and torch.equal(plan.keys, again.keys)
    assert not torch.equal(plan.idx, other.idx)


def test_client_sampling_without_replacement_and_deterministic():
    for t in range(20):
        ids = rng.sample_clients(3, t, 10, 4)
        assert len(set(ids.tolist())) == 4 and ids.min() >= 0 and ids.max() < 10
        assert np.array_equal(ids, rng.sample_clients(3, t, 10, 4))
    seen = {tuple(rng.sample_clients(3, t, 10, 4)) for t in range(20)}
    assert len(seen) > 10  # different rounds draw different clients


def test_auto_executor_by_device():
    fm = FunctionalModel(build_model("linear", 2, (1, 2, 2), seed=0))
    assert make_executor("auto", fm, torch.device("cpu")).name == "sequential"
    assert make_executor("vectorised", fm, torch.device("cpu")).name == "vectorised"
    with pytest.raises(ValueError, match="executor = 'gpu'"):
        make_executor("gpu", fm, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_cpu():
    a, _ = _run(VectorisedExecutor, "fsl", torch.float64)
    fed = random_federation(SIZES, n0=14, dtype=torch.float64).to(torch.device("cuda"), torch.float64)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).double().cuda())
    alg = make_algorithm("fsl", LocalTraining(0.1, 8), 1.7, ServerLearning(0.8, 0.05, 6, 1))
    sim = Simulator(fm, fed, alg, VectorisedExecutor(fm), 5, seed=11)
    st = sim.initial_state()
    for t in range(3):
        st, _ = sim.round(st, t)
    p = st.x
    assert all(torch.allclose(a[n], p[n].cpu(), atol=1e-9, rtol=0) for n in a)


@pytest.mark.parametrize("name,hp", [("scaffold", {}), ("fednova", {"rho": 0.5}), ("fsl", {})])
def test_captured_vectorised_step_equals_the_eager_one_float64(name, hp):
    """``compile``: the vmapped client step captured by torch.compile (the graph the GPU's CUDA-graph
    mode replays; 'aot_eager' checks the capture without code generation) computes the eager step's
    rounds, clients' states and server learning included (issue 16)."""
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)

    def sim(compile_mode):
        fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=0).to(torch.float64))
        sl = ServerLearning(1.0, 0.1, 5, 1) if name == "fsl" else None
        alg = make_algorithm(name, LocalTraining(0.1, 8), 1.5, sl, **hp)
        return Simulator(fm, fed, alg, VectorisedExecutor(fm, compile_mode), clients_per_round=4, seed=3)

    from torch._dynamo.utils import counters
    torch._dynamo.reset()  # a graph an earlier test compiled would be reused, not counted
    counters.clear()
    eager, captured = sim("off"), sim("aot_eager")
    a, b = eager.initial_state(), captured.initial_state()
    for t in range(2):
        a, _ = eager.round(a, t)
        b, _ = captured.round(b, t)
    # one graph for the whole step (no graph break), captured once and replayed every step and round
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert all(torch.allclose(a.x[n], b.x[n], rtol=0, atol=1e-12) for n in a.x)
    for k, g in a.clients.items():
        assert all(torch.allclose(v, b.clients[k][n], rtol=0, atol=1e-12) for n, v in g.items())


def test_compile_is_checked_once_when_the_config_is_validated():
    """``compile`` needs the vectorised executor, and 'cuda-graphs' a CUDA device: config validation refuses the
    others in one line (test_config), and device = 'auto' without a GPU where the device is resolved, before any
    work; the engine only asserts what was checked (issue 27: one check, not two with two messages)."""
    from fedsl.config.schema import ConfigError
    from fedsl.runs.placement import resolve_device
    fm = FunctionalModel(build_model("mlp", 4, (1, 8, 8), seed=0))
    assert make_executor("vectorised", fm, torch.device("cpu"), "aot_eager").compile == "aot_eager"
    with pytest.raises(AssertionError):
        make_executor("auto", fm, torch.device("cpu"), "default")
    assert resolve_device("cpu", "default").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^compile = 'cuda-graphs' captures CUDA graphs: device = 'auto' is "
                                              r"'cpu' on this machine: expected a machine with a CUDA device, or "
                                              r"compile = 'off'$"):
            resolve_device("auto", "cuda-graphs")


def test_bfloat16_evaluation_is_close_to_float32_and_opt_in():
    """``eval_precision = 'bfloat16'``: forward passes under bf16 autocast give (nearly) the float32
    accuracy and loss, single and stacked (an unknown precision is refused by config validation: test_config)."""
    from fedsl.engine.functional import evaluate, evaluate_many
    fed = random_federation(SIZES, n0=10, n_test=400, dtype=torch.float32)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=0))
    params = fm.params()
    acc32, loss32 = evaluate(fm, params, fed.x_test, fed.y_test, 100)
    acc16, loss16 = evaluate(fm, params, fed.x_test, fed.y_test, 100, "bfloat16")
    assert (acc16, loss16) != (acc32, loss32)  # bf16 really ran: the loss moved in its last digits
    assert abs(acc16 - acc32) <= 0.01 and loss16 == pytest.approx(loss32, rel=1e-2)
    stacked = {n: torch.stack([p, p]) for n, p in params.items()}
    many = evaluate_many(fm, stacked, fed.x_test, fed.y_test, 100, "bfloat16")
    assert all(abs(acc - acc32) <= 0.01 and loss == pytest.approx(loss32, rel=1e-2) for acc, loss in many)


@pytest.mark.parametrize("alg", ["fsl", "scaffold", "moon"])
def test_the_sequential_executors_autograd_gives_torch_func_grads_numbers(alg, monkeypatch):
    """The sequential executor differentiates by plain autograd (``eager_grad``): the same numbers, bit for bit,
    as ``torch.func.grad`` of the same loss, with dropout, a client-state rule and a rule with a loss term."""
    eager, _ = _run(SequentialExecutor, alg, torch.float32, rounds=2, model="small_cnn")
    monkeypatch.setattr("fedsl.engine.sequential.eager_grad", torch.func.grad)
    func, _ = _run(SequentialExecutor, alg, torch.float32, rounds=2, model="small_cnn")
    assert all(torch.equal(eager[n], func[n]) for n in eager)


def test_training_one_client_does_not_import_torch_dynamo():
    """A Flower ClientApp is a process per message: torch.func.grad's first call would import torch._dynamo
    (about a second of CPU) in each one. The sequential executor's gradient does not, nor does counting the model's
    FLOPs (executor = 'auto' on a CPU; torch's FLOP counter would)."""
    code = ("import sys, torch\n"
            "from conftest import random_federation\n"
            "from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm\n"
            "from fedsl.engine.executors import SequentialExecutor\n"
            "from fedsl.engine.functional import FunctionalModel\n"
            "from fedsl.engine.simulator import Simulator\n"
            "from fedsl.models import build_model\n"
            "fm = FunctionalModel(build_model('small_cnn', 4, (1, 8, 8), seed=3))\n"
            "alg = make_algorithm('fsl', LocalTraining(0.1, 8, 1, None), 1.0, ServerLearning(1.0, 0.05, 6, 1))\n"
            "fed = random_federation([9, 31, 17], n0=14, dtype=torch.float32)\n"
            "sim = Simulator(fm, fed, alg, SequentialExecutor(fm), 2, seed=1)\n"
            "sim.round(sim.initial_state(), 0)\n"
            "from fedsl.models.flops import train_flops\n"
            "assert train_flops(fm.module, (1, 8, 8)) > 0\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent, check=False)
    assert out.stdout.strip() == "False", out.stdout + out.stderr[-2000:]


def test_forward_without_buffers_equals_functional_call_and_leaves_the_module_as_it_was():
    """The fast forward (parameters put in the modules' slots, then back) is functional_call's numbers, for a tied
    weight too (both of its owners take the given tensor), under autograd and vmap, and after an error."""
    from torch.func import functional_call, grad, vmap

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Linear(6, 6, bias=False)
            self.mid = nn.Linear(6, 6)
            self.out = nn.Linear(6, 6, bias=False)
            self.out.weight = self.emb.weight  # one parameter, two owners

        def forward(self, x):
            if x.shape[-1] != 6:
                raise ValueError("bad input")
            return self.out(torch.tanh(self.mid(self.emb(x))))

    torch.manual_seed(0)
    fm = FunctionalModel(Tied().double())
    before = {n: p for n, p in fm.module.named_parameters()}
    params = {n: torch.randn_like(p) for n, p in fm.params().items()}
    assert sorted(params) == ["emb.weight", "mid.bias", "mid.weight"]
    x = torch.randn(5, 6, dtype=torch.float64)
    assert torch.equal(fm.forward(params, x), functional_call(fm.module, params, (x,)))
    f = lambda p, x: fm.forward(p, x).square().sum()
    g_fast = grad(f)(params, x)
    g_ref = grad(lambda p, x: functional_call(fm.module, p, (x,)).square().sum())(params, x)
    assert all(torch.equal(g_fast[n], g_ref[n]) for n in params)
    xs = torch.randn(3, 5, 6, dtype=torch.float64)
    assert torch.equal(vmap(fm.forward, in_dims=(None, 0))(params, xs),
                       torch.stack([functional_call(fm.module, params, (xi,)) for xi in xs]))
    with pytest.raises(ValueError, match="bad input"):
        fm.forward(params, torch.randn(5, 4, dtype=torch.float64))
    assert {n: p for n, p in fm.module.named_parameters()} == before
    assert fm.module.out.weight is fm.module.emb.weight is before["emb.weight"]
