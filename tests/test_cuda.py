"""The engine on CUDA (skipped without a GPU; run on the device machine, see benchmarks/RESULTS.md).

- the vectorised executor on the GPU equals the sequential one on the CPU (float64);
- stacked runs on the GPU equal the same runs one by one there, evaluation included;
- a run through the runner keeps its data on the device and resumes bit-identically;
- a stacked sweep through the runner writes the same results as one by one.
"""

import copy

import pytest
import torch
from conftest import random_federation, run_rounds, stacked_and_alone, tiny_config

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]
CUDA = torch.device("cuda")


def _sim(name, fed, executor, seed=11, lr=0.1, gamma=0.8):
    fm = FunctionalModel(build_model("small_cnn", fed.num_classes, fed.input_shape, seed=3).to(
        device=fed.x.device, dtype=fed.x.dtype))
    alg = make_algorithm(name, LocalTraining(lr, 8), 1.7, ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1))
    return Simulator(fm, fed, alg, executor(fm), 4, seed=seed)


def _assert_states_close(a, b, tol=1e-10):
    for n in a.x:
        torch.testing.assert_close(a.x[n].cpu(), b.x[n].cpu(), rtol=tol, atol=tol)
    for k in a.algo:
        for n in a.algo[k]:
            torch.testing.assert_close(a.algo[k][n].cpu(), b.algo[k][n].cpu(), rtol=tol, atol=tol)


def _assert_resume_bit_identical(cfg, tmp_path):
    """A run stopped after round 3 and resumed ends with the uninterrupted run's model, bit for bit."""
    from fedsl.runs.runner import run
    whole = run(cfg, tmp_path / "whole", log=lambda m: None, progress=False)
    run(cfg, tmp_path / "cut", log=lambda m: None, progress=False, stop_after=3)
    resumed = run(cfg, tmp_path / "cut", resume=True, log=lambda m: None, progress=False)
    assert whole["status"] == resumed["status"] == "completed"
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["params"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_cuda_vectorised_equals_cpu_sequential(name):
    cpu = random_federation(SIZES, shape=(1, 12, 12))
    gpu = cpu.to(CUDA, torch.float64)
    a, _ = run_rounds(_sim(name, cpu, SequentialExecutor), 3)
    b, _ = run_rounds(_sim(name, gpu, VectorisedExecutor), 3)
    assert b.x["0.weight"].device.type == "cuda"
    _assert_states_close(a, b)


def test_cuda_stacked_equals_one_by_one():
    fed = random_federation(SIZES, shape=(1, 12, 12)).to(CUDA, torch.float64)
    other = random_federation(SIZES[::-1], shape=(1, 12, 12), seed=1).to(CUDA, torch.float64)

    def sims():
        return [_sim("scaffold", fed, VectorisedExecutor, seed=1), _sim("scaffold", fed, VectorisedExecutor, seed=2,
                                                                         lr=0.05, gamma=1.5),
                _sim("scaffold", other, VectorisedExecutor, seed=3)]
    for state, (s_acc, s_loss), alone, sim in stacked_and_alone(sims, 3):
        _assert_states_close(state, alone)
        acc, loss = sim.evaluate(alone.x)
        assert s_acc == pytest.approx(acc, abs=1e-12) and s_loss == pytest.approx(loss, rel=1e-9)


def test_cuda_run_resume_and_stacked_sweep(tmp_path):
    import csv

    from fedsl.config import schema as C
    from fedsl.runs.build import prepare
    from fedsl.sweeps.compare import run_group

    cfg = C.validate(tiny_config(rounds=6, dtype="float64", checkpoint_every=2, device="cuda", deterministic=True))
    prep = prepare(cfg)
    assert prep.sim.fed.x.device.type == "cuda" and prep.sim.executor.name == "vectorised"
    assert torch.backends.cudnn.deterministic
    # deterministic = true: a resumed run equals the uninterrupted one bit for bit
    _assert_resume_bit_identical(cfg, tmp_path)

    def sweep(stack):
        data = tiny_config(rounds=6, dtype="float64", checkpoint_every=2, device="cuda")
        data.update(seeds=[0, 1], stack=stack, sweep={"server.gamma": [0.5, 1.0]})
        out = tmp_path / f"sweep{stack}"
        run_group(C.validate(copy.deepcopy(data)), out, log=lambda m: None, progress=False)
        res = {}
        for d in sorted(p for p in out.iterdir() if (p / "metrics.csv").is_file()):
            with open(d / "metrics.csv") as f:
                res[d.name] = [(float(r["accuracy"]), float(r["loss"])) for r in csv.DictReader(f)]
        return res

    one, four = sweep(1), sweep(4)
    assert one.keys() == four.keys() and len(one) == 4
    for name in one:
        for (a1, l1), (a2, l2) in zip(one[name], four[name]):
            assert a1 == pytest.approx(a2, abs=1e-9) and l1 == pytest.approx(l2, rel=1e-8), name


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])  # with server learning: FSL, SCAFFOLD+SL
def test_cuda_graphs_replay_the_eager_rounds(name):
    """``compile = 'cuda-graphs'``: the K local steps (and the server's K0) captured once per shape
    and replayed give the eager rounds (same kernels), one run and stacked runs alike."""
    fed = random_federation(SIZES, shape=(1, 12, 12)).to(CUDA, torch.float64)

    def graphs(fm):
        return VectorisedExecutor(fm, "cuda-graphs")

    eager, _ = run_rounds(_sim(name, fed, VectorisedExecutor), 3)
    sim = _sim(name, fed, graphs)
    replayed, _ = run_rounds(sim, 3)
    assert sim.executor._graphs  # captured (once per shape: these clients' K_i vary by round)
    _assert_states_close(eager, replayed, tol=1e-12)
    import fedsl.engine.executors as ex
    kept, ex.GRAPH_MAX_STEPS = ex.GRAPH_MAX_STEPS, 1  # longer loops (pretraining) run eagerly: not captured
    try:
        fresh = _sim(name, fed, graphs)
        run_rounds(fresh, 1)
        assert not fresh.executor._graphs
    finally:
        ex.GRAPH_MAX_STEPS = kept

    def stack(executor):
        return StackedSimulator([_sim(name, fed, executor, seed=1), _sim(name, fed, executor, seed=2, lr=0.05)])
    out = {}
    for label, executor in (("eager", VectorisedExecutor), ("graphs", graphs)):
        stacked = stack(executor)
        states = stacked.initial_states()
        for t in range(3):
            states, _ = stacked.round(states, t)
        out[label] = states
    for a, b in zip(out["eager"], out["graphs"]):
        _assert_states_close(a, b, tol=1e-12)


def _text_sim(name, fed, executor, seed=11, dtype=torch.float64):
    fm = FunctionalModel(build_model("char_lstm_small", 80, (10,), seed=3).to(device=fed.x.device, dtype=dtype))
    alg = make_algorithm(name, LocalTraining(0.5, 4), 1.0, ServerLearning(gamma=1.0, lr=0.5, batch_size=4, epochs=1))
    return Simulator(fm, fed, alg, executor(fm), 3, seed=seed)


@pytest.mark.parametrize("name", ["fsl", "scaffold"])
def test_cuda_char_lstm_vectorised_and_graphs_equal_cpu_sequential(name):
    """Text on the GPU: the vmapped plain LSTM (eager, then its K steps captured as CUDA graphs) equals nn.LSTM's
    kernel on the CPU, the windows kept as uint8 indices on the device."""
    from conftest import random_text_federation
    cpu = random_text_federation([9, 14, 11, 8])
    gpu = cpu.to(CUDA, torch.float64)
    assert gpu.x.dtype == torch.uint8 and gpu.x.device.type == "cuda"
    a, _ = run_rounds(_text_sim(name, cpu, SequentialExecutor), 3)
    b, _ = run_rounds(_text_sim(name, gpu, VectorisedExecutor), 3)
    _assert_states_close(a, b, tol=1e-9)
    sim = _text_sim(name, gpu, lambda fm: VectorisedExecutor(fm, "cuda-graphs"))
    c, _ = run_rounds(sim, 3)
    assert sim.executor._graphs
    _assert_states_close(b, c, tol=1e-12)


@pytest.mark.parametrize("name", ["scaffold", "fednova"])  # fednova: τ_eff was float()-ed every round
def test_cuda_stacked_round_does_not_wait_for_the_gpu(name):
    """A stacked round queues its work without one stream synchronisation (plans, ids, weights, K_i
    and step sizes are copied from pinned memory): the host prepares the next kernels while the GPU
    runs. Before, a blocking copy per run and plan made the host wait hundreds of times a round."""
    fed = random_federation([16] * 8, shape=(1, 12, 12)).to(CUDA, torch.float32)  # shapes repeat: no recapture
    for executor in (VectorisedExecutor, lambda fm: VectorisedExecutor(fm, "cuda-graphs")):
        stacked = StackedSimulator([_sim(name, fed, executor, seed=s) for s in (1, 2, 3)])
        states, _ = stacked.round(stacked.initial_states(), 0)  # warm-up: capture, cuDNN's choices
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with pytest.raises(RuntimeError, match="synchroniz"):  # the mode catches a blocking copy
                torch.ones(3).to(CUDA)
            for t in (1, 2):
                states, _ = stacked.round(states, t)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert all(torch.isfinite(s.x["0.weight"]).all() for s in states)


def test_cuda_graphs_keep_deterministic_resume_bit_identical(tmp_path):
    """``deterministic = true`` with ``compile = 'cuda-graphs'``: a resumed run (which captures its graphs
    anew) equals the uninterrupted one bit for bit, as the eager one does."""
    from fedsl.config import schema as C

    _assert_resume_bit_identical(C.validate(tiny_config(rounds=6, dtype="float64", checkpoint_every=2, device="cuda",
                                                        deterministic=True, compile="cuda-graphs")), tmp_path)


def test_cuda_host_tables_equal_device_tables(tmp_path):
    """``client_tables = 'host'``: SCAFFOLD's c_i stay in host memory, the sampled rows go over and back each
    round; the rounds (one run and stacked) equal those with the tables on the GPU, and a run resumes bit
    for bit from a checkpoint."""
    from fedsl.config import schema as C

    fed = random_federation(SIZES, shape=(1, 12, 12)).to(CUDA, torch.float64)

    def sims(host):
        out = [_sim("scaffold", fed, VectorisedExecutor, seed=s) for s in (1, 2)]
        for sim in out:
            sim.tables_device = torch.device("cpu") if host else CUDA
        return out
    a, _ = run_rounds(sims(False)[0], 3)
    b, _ = run_rounds(sims(True)[0], 3)
    assert b.clients["c_i"]["0.weight"].device.type == "cpu" and a.clients["c_i"]["0.weight"].device.type == "cuda"
    _assert_states_close(a, b, tol=0)
    assert all(torch.equal(a.clients["c_i"][n].cpu(), b.clients["c_i"][n]) for n in a.clients["c_i"])
    together = []
    for host in (False, True):
        stacked = StackedSimulator(sims(host))
        states = stacked.initial_states()
        for t in range(3):
            states, _ = stacked.round(states, t)
        together.append(states)
    for on_gpu, on_host in zip(*together):
        _assert_states_close(on_gpu, on_host, tol=0)
    _assert_states_close(together[1][0], b)
    _assert_resume_bit_identical(C.validate(tiny_config(rounds=6, alg="scaffold", dtype="float64", checkpoint_every=2,
                                                        device="cuda", deterministic=True, client_tables="host")),
                                 tmp_path)
