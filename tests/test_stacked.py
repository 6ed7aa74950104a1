"""Stacked runs advance in lock-step with results equal to running them one by one.

Each case stacks runs that differ in what a sweep varies (seed, η_l, γ, B, the data
pool and partition) and compares every run's model, rule state and round records with
the same run on its own: exactly with the sequential executor (same operations in the
same order), to float64 rounding with the vectorised one (R·S clients in one vmap).
"""

import pytest
import torch
from conftest import clone_state, flat_state, random_federation, run_rounds, tiny_config

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms.base import LOCAL_SGD
from fedsl.algorithms.gamma_schedule import GammaSchedule
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]
HP = {"fedprox": {"mu": 0.3}, "feddyn": {"alpha": 0.1}, "fedadam": {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
      "fedavgm": {"momentum": 0.9}, "fednova": {"rho": 0.5}, "feddu": {"feddu_decay": 0.9}}
GLOBAL_LR = {"fedavg": 1.7, "fedprox": 1.7, "fedadam": 0.1, "scaffold": 1.7, "feddyn": 1.0, "ds": 1.7, "fedavgm": 1.0,
             "fednova": 1.0, "feddu": 1.7, "d0_only": 1.7}


def _sim(name, fed, executor, *, lr=0.1, batch=8, gamma=0.8, mode="incremental", seed=11, model="mlp",
         schedule=None):
    fm = FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    sl = None
    if gamma is not None:
        sl = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1, mode=mode,
                            schedule=schedule)
    alg = make_algorithm(name, LocalTraining(lr, batch), GLOBAL_LR[name], sl, **HP.get(name, {}))
    return Simulator(fm, fed, alg, executor(fm), 4, seed=seed)


_clone = clone_state


_flat = flat_state


def _compare(make_sims, rounds=3, exact=True):
    """Run make_sims() stacked and one by one; compare states and round records."""
    stacked = StackedSimulator(make_sims())
    states = stacked.initial_states()
    for t in range(rounds):
        states, infos = stacked.round(states, t)
    for r, sim in enumerate(make_sims()):
        alone, alone_infos = run_rounds(sim, rounds)
        a, b = _flat(states[r]), _flat(alone)
        assert a.keys() == b.keys()
        for k in a:
            if exact:
                assert torch.equal(a[k], b[k]), f"run {r}: {k} differs"
            else:
                torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-12, msg=f"run {r}: {k}")
        assert states[r].gamma == alone.gamma
        info = infos[r]
        assert info.clients.tolist() == alone_infos[-1].clients.tolist()
        assert info.server_steps == alone_infos[-1].server_steps
        assert info.client_steps == alone_infos[-1].client_steps
    return stacked, states


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "feddyn", "fedadam", "fedavgm", "fednova"])
def test_stacked_equals_one_by_one(name, executor, exact):
    """Seeds, η_l, B, γ (one run without server learning) and the data pool all differ. With the
    vectorised executor the rule's update of all runs is one vmapped call (``batched_server``)."""
    fed_a = random_federation(SIZES, seed=0)
    fed_b = random_federation(SIZES[::-1], seed=1)  # another pool and partition: concatenated

    def sims():
        return [_sim(name, fed_a, executor, seed=11),
                _sim(name, fed_a, executor, seed=12, lr=0.05, batch=5, gamma=1.5),
                _sim(name, fed_b, executor, seed=13, gamma=None),
                _sim(name, fed_b, executor, seed=11, lr=0.2, gamma=0.3)]
    stacked, _ = _compare(sims, exact=exact)
    assert stacked.offsets == [0, 0, len(fed_a.x), len(fed_a.x)]
    assert stacked.batched_server == (executor is VectorisedExecutor)


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
def test_stacked_fslp_ds_adaptive(executor, exact):
    """FSL-p (server as a client), DS (clients hold D0 too) and an adaptive γ stack as well."""
    fed = random_federation(SIZES, seed=0)
    _compare(lambda: [_sim("fedavg", fed, executor, mode="parallel", seed=s) for s in (1, 2)], exact=exact)
    _compare(lambda: [_sim("ds", fed, executor, gamma=None, seed=s) for s in (1, 2)], exact=exact)
    adaptive = GammaSchedule(kind="adaptive", shrink=0.5)
    _compare(lambda: [_sim("fedavg", fed, executor, schedule=adaptive, seed=s) for s in (1, 2)], exact=exact)


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
@pytest.mark.parametrize("name", ["feddu", "d0_only"])
def test_stacked_server_data_rivals(name, executor, exact, monkeypatch):
    """FedDU (its γ_t from each run's own clients, x̄_t and D0) and the D0-only control stack too; FedDU's
    rounds aggregate run by run (its γ_t is per run), and its γ_t are the ones the runs take alone."""
    fed_a = random_federation(SIZES, seed=0)
    fed_b = random_federation(SIZES[::-1], seed=1)

    def sims():
        return [_sim(name, fed_a, executor, seed=11), _sim(name, fed_a, executor, seed=12, lr=0.05, gamma=1.5),
                _sim(name, fed_b, executor, seed=13, gamma=0.3)]
    calls = []
    vmapped = StackedSimulator._rule_updates
    monkeypatch.setattr(StackedSimulator, "_rule_updates", lambda self, *a: calls.append(1) or vmapped(self, *a))
    stacked, states = _compare(sims, exact=exact)
    # FedDU's γ_t needs each run's own x̄_t, so its runs never take the one vmapped rule update
    assert bool(calls) == (name == "d0_only" and executor is VectorisedExecutor)
    if name == "feddu":
        _, infos = stacked.round(states, 3)
        alone = [run_rounds(sim, 4)[1][-1].gamma for sim in sims()]
        assert [i.gamma for i in infos] == pytest.approx(alone, rel=1e-10)
        assert all(0 < g for g in alone)


def test_server_update_is_batched_only_when_the_runs_share_it(monkeypatch):
    """One vmapped rule update needs the rule's numbers, N and the weighting shared, and no per-run
    extra (FSL-p's server client, the angle); otherwise each run aggregates on its own."""
    fed = random_federation(SIZES, seed=0)
    other_n = random_federation(SIZES[:6], seed=1)
    adaptive = GammaSchedule(kind="adaptive", shrink=0.5)
    calls = []
    vmapped = StackedSimulator._rule_updates
    monkeypatch.setattr(StackedSimulator, "_rule_updates", lambda self, *a: calls.append(1) or vmapped(self, *a))

    def batched(*sims):
        """Whether round 0 of the stacked runs took the engine's one vmapped rule update."""
        calls.clear()
        stacked = StackedSimulator(list(sims))
        stacked.round(stacked.initial_states(), 0)
        return len(calls) == 1
    v = VectorisedExecutor
    assert batched(_sim("scaffold", fed, v, seed=1), _sim("scaffold", fed, v, seed=2, lr=0.05, gamma=None))
    assert not batched(_sim("fedavg", fed, v), _sim("fedavg", other_n, v))  # N differs
    assert not batched(_sim("fedavg", fed, v), _sim("fedavg", fed, v, mode="parallel"))  # FSL-p
    assert not batched(_sim("fedavg", fed, v), _sim("fedavg", fed, v, schedule=adaptive))  # cos θ_t
    a, b = _sim("fedavg", fed, v), _sim("fedavg", fed, v)
    b.alg = type(b.alg)(**{**b.alg.__dict__, "rule": type(b.alg.rule)(global_lr=2.0)})  # η_g differs
    assert not batched(a, b)
    assert not batched(_sim("fedavg", fed, SequentialExecutor), _sim("fedavg", fed, SequentialExecutor))


@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_line_10_of_all_runs_is_one_executor_call(executor, monkeypatch):
    """The stacked round goes through the same server half as a single run (``server_updates``), with line 10
    of every run with server learning in one executor call on the batches planned ahead, none run by run."""
    fed = random_federation(SIZES, seed=0)
    sims = [_sim("fedavg", fed, executor, seed=1), _sim("fedavg", fed, executor, seed=2, gamma=None),
            _sim("fedavg", fed, executor, seed=3, gamma=1.5)]
    stacked = StackedSimulator(sims)
    lines10, alone = [], []
    train = stacked.executor.train
    monkeypatch.setattr(stacked.executor, "train", lambda rule, starts, *a: (
        lines10.append(len(starts)) if rule is LOCAL_SGD else None) or train(rule, starts, *a))
    for sim in sims:
        monkeypatch.setattr(sim, "server_sgd", lambda *a: alone.append(a))
    _, infos = stacked.round(stacked.initial_states(), 0)
    assert lines10 == [2] and alone == []  # runs 0 and 2, together
    assert [i.server_steps > 0 for i in infos] == [True, False, True]


def test_host_work_made_ahead_is_taken_and_changes_nothing(monkeypatch):
    """The runner makes round t + 1's host work (sampling, client and server plans) before it waits for round
    t's evaluation: the round takes it instead of making its own, and the states are bit-identical. Work
    made for another round is not taken."""
    fed = random_federation(SIZES, seed=0)

    def sims():  # server learning on (0.8) and off: server plans for some runs only
        return [_sim("scaffold", fed, SequentialExecutor, seed=1), _sim("scaffold", fed, SequentialExecutor, seed=2,
                                                                         gamma=None)]
    plain = StackedSimulator(sims())
    a = plain.initial_states()
    for t in range(3):
        a, _ = plain.round(a, t)
    ahead = StackedSimulator(sims())
    b = ahead.initial_states()
    made = []
    for sim in ahead.sims:
        monkeypatch.setattr(sim, "sample", lambda t, host=False, f=sim.sample: made.append(("sample", t)) or f(t, host))
        monkeypatch.setattr(sim, "server_plan", lambda t, host=False, f=sim.server_plan:
                            made.append(("server", t)) or f(t, host))
    ahead.prepare(7)  # another round's: not taken by round 0
    b, _ = ahead.round(b, 0)
    assert made == [("sample", 7)] * 2 + [("server", 7)] + [("sample", 0)] * 2 + [("server", 0)]
    for t in (1, 2):
        ahead.prepare(t)
        before = len(made)
        b, _ = ahead.round(b, t)
        assert len(made) == before  # round t made no host work of its own
    for r in range(2):
        x, y = _flat(a[r]), _flat(b[r])
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_stacked_cnn_vectorised_and_evaluation():
    """A conv model with dropout (keys per client step) and stacked evaluation."""
    fed = random_federation(SIZES, shape=(1, 12, 12), seed=0)

    def sims():
        return [_sim("fedavg", fed, VectorisedExecutor, model="small_cnn", seed=s, lr=lr)
                for s, lr in ((1, 0.1), (2, 0.05), (3, 0.1))]
    stacked, states = _compare(sims, rounds=2, exact=False)
    assert len(stacked.test_groups) == 1 and stacked.test_groups[0] == [0, 1, 2]
    together = stacked.evaluate([s.x for s in states])
    for r, (sim, st) in enumerate(zip(stacked.sims, states)):
        acc, loss = sim.evaluate(st.x)
        assert together[r][0] == pytest.approx(acc, abs=1e-12)
        assert together[r][1] == pytest.approx(loss, rel=1e-10)


def test_identical_pools_are_shared():
    fed = random_federation(SIZES, seed=0)
    copy = random_federation(SIZES, seed=0)  # equal content, another tensor
    assert copy.x is not fed.x
    stacked = StackedSimulator([_sim("fedavg", fed, SequentialExecutor), _sim("fedavg", copy, SequentialExecutor)])
    assert stacked.offsets == [0, 0] and stacked.x is fed.x
    assert stacked.sims[1].fed.x is fed.x  # the duplicate is dropped


def test_incompatible_runs_are_refused():
    fed = random_federation(SIZES, seed=0)
    with pytest.raises(ValueError, match="run 1 cannot be stacked with run 0: server rule Scaffold differs"):
        StackedSimulator([_sim("fedavg", fed, SequentialExecutor), _sim("scaffold", fed, SequentialExecutor)])
    with pytest.raises(ValueError, match=r"hyper-parameter of the local step \(mu\) differs"):
        a = _sim("fedprox", fed, SequentialExecutor)
        b = _sim("fedprox", fed, SequentialExecutor)
        object.__setattr__(b.alg.rule, "mu", 0.9)
        StackedSimulator([a, b])
    with pytest.raises(ValueError, match="parameters differ"):
        StackedSimulator([_sim("fedavg", fed, SequentialExecutor),
                          _sim("fedavg", fed, SequentialExecutor, model="linear")])
    with pytest.raises(ValueError, match="at least one run"):
        StackedSimulator([])


# --- sweeps run stacked through the runner -------------------------------------------------

def sweep_config(stack, alg="fsl", executor="sequential", **top) -> dict:
    """8 runs of the tiny config: 2 η_l (one diverges) × 2 γ (η_g for a rule without server learning, which reads
    no γ) × 2 seeds, 5 rounds."""
    second = "server.gamma" if alg == "fsl" else "algorithm.global_lr"
    return tiny_config(rounds=5, alg=alg, executor=executor, name="sw", seeds=[0, 1], checkpoint_every=2,
                       stack=stack, sweep={"algorithm.local_lr": [0.05, 1e9], second: [0.5, 1.0]}, **top)


LOG: list[str] = []


def _sweep(tmp_path, stack, alg="fsl", executor="sequential", stop_after=None, resume=False, name=None):
    from fedsl.config import schema as C
    from fedsl.sweeps.compare import run_group

    out = tmp_path / (name or f"{alg}-{executor}-stack{stack}")
    cfg = C.validate(sweep_config(stack, alg, executor))
    if stop_after is not None:  # interrupt every run of the stack after stop_after rounds
        from fedsl.runs import runner
        orig = runner.run_stacked
        runner.run_stacked = lambda *a, **k: orig(*a, **{**k, "stop_after": stop_after})
        try:
            run_group(cfg, out, log=LOG.append, progress=False)
        finally:
            runner.run_stacked = orig
    else:
        run_group(cfg, out, resume=resume, log=LOG.append, progress=False)
    return out


def _results(out):
    import csv
    import json
    res = {}
    for d in sorted(p for p in out.iterdir() if (p / "summary.json").is_file()):
        with open(d / "metrics.csv") as f:
            metrics = [[r[c] for c in ("round", "accuracy", "loss", "rolling_accuracy", "gamma")]
                       for r in csv.DictReader(f)]
        summary = json.loads((d / "summary.json").read_text())
        params = torch.load(d / "checkpoint.pt", weights_only=True)["params"]
        res[d.name] = (metrics, summary["status"], summary["rounds_done"], params)
    return res


@pytest.mark.slow
@pytest.mark.parametrize("alg", ["fsl", "scaffold"])
def test_stacked_sweep_equals_one_by_one(tmp_path, alg):
    """8 runs (2 η_l × 2 γ × 2 seeds) stacked 8 at a time and one by one: the same files; the
    η_l = 1e9 runs diverge inside the stack and leave it while the others go on."""
    LOG.clear()
    alone = _results(_sweep(tmp_path, 1, alg))
    assert not any(m.startswith("stacked") for m in LOG)
    stacked = _results(_sweep(tmp_path, 8, alg))
    assert sum(m.startswith("stacked 8 runs (sequential executor)") for m in LOG) == 1, LOG[-3:]
    assert alone.keys() == stacked.keys() and len(alone) == 8
    for name in alone:
        (m1, s1, d1, p1), (m2, s2, d2, p2) = alone[name], stacked[name]
        assert (s1, d1) == (s2, d2), name
        assert m1 == m2, name
        for n in p1:  # diverged runs hold NaNs: equal where both are NaN
            torch.testing.assert_close(p1[n], p2[n], rtol=0, atol=0, equal_nan=True, msg=f"{name}: {n}")
    statuses = {name: v[1] for name, v in stacked.items()}
    assert {s for n, s in statuses.items() if "1e+09" in n} == {"diverged"}
    assert {s for n, s in statuses.items() if "0.05" in n} == {"completed"}


@pytest.mark.slow
def test_stacked_sweep_interrupted_then_resumed(tmp_path):
    """A stack stopped after 2 rounds keeps every run resumable; resuming gives the uninterrupted result."""
    LOG.clear()
    whole = _results(_sweep(tmp_path, 4, executor="vectorised", name="whole"))
    assert sum(m.startswith("stacked 4 runs (vectorised executor)") for m in LOG) == 2
    out = _sweep(tmp_path, 4, executor="vectorised", stop_after=2, name="cut")
    cut = _results(out)
    assert {v[1] for v in cut.values()} == {"interrupted", "diverged"}
    assert {v[2] for n, v in cut.items() if "0.05" in n} == {2}
    LOG.clear()
    resumed = _results(_sweep(tmp_path, 4, executor="vectorised", resume=True, name="cut"))
    assert sum(m.startswith("stacked 4 runs") for m in LOG) == 1  # the 4 interrupted ones; diverged stay finished
    for name in whole:
        assert resumed[name][:3] == whole[name][:3], name
        for n in whole[name][3]:
            torch.testing.assert_close(resumed[name][3][n], whole[name][3][n], rtol=0, atol=0, equal_nan=True)


def test_stack_groups_and_limits(tmp_path):
    from fedsl.config import schema as C
    from fedsl.config.expand import expand_variants
    from fedsl.config.schema import ConfigError
    from fedsl.runs.memory import stack_limit
    from fedsl.sweeps.compare import stack_groups

    cfg = C.validate(sweep_config(3, executor="auto"))
    runs = expand_variants(cfg)
    groups = stack_groups(runs, tmp_path, resume=False)
    assert [len(g) for g in groups] == [3, 3, 2] and sorted(sum(groups, [])) == sorted(runs)
    auto = C.validate(sweep_config("auto", executor="auto", device="cpu"))
    assert stack_limit(auto) == 1  # CPU: stacking measured to gain nothing
    with pytest.raises(ConfigError, match="stack = 0: expected 'auto' or an integer >= 1"):
        C.validate(sweep_config(0, executor="auto"))
    for bad in ("many", True, 2.5):
        with pytest.raises(ConfigError, match="stack") as e:
            C.validate(sweep_config(bad, executor="auto"))
        assert "\n" not in str(e.value)


def test_stack_limit_model_sizes_are_the_models():
    """The memory plan's d is counted on the model built for the config's dataset: the paper's CNNs have
    the paper's d (545,098 on CIFAR-10; 1,409,197 on its 45 EMNIST classes), any other model its own count;
    an image folder, whose inputs only the files say, gets the generous bound."""
    from fedsl.config import schema as C
    from fedsl.models import build_model
    from fedsl.runs import memory

    def cfg(model, **data):
        return C.validate({"name": "m", "rounds": 1, "model": {"name": model},
                           "data": {"num_clients": 10, "server_source": "clients", "server_clients": 1, **data},
                           "algorithm": {"name": "fsl", "clients_per_round": 2, "local_lr": 0.1, "batch_size": 8}})
    assert memory.model_params(cfg("cifar_cnn", dataset="cifar10")) == 545_098
    assert memory.model_params(cfg("emnist_cnn", dataset="emnist", classes="paper45")) == 1_409_197
    small = sum(p.numel() for p in build_model("small_cnn", 10, (1, 28, 28), 0).parameters())
    assert memory.model_params(cfg("small_cnn", dataset="mnist")) == small
    assert memory.model_params(cfg("small_cnn", dataset="image_folder")) == memory.UNKNOWN_MODEL_PARAMS


def test_checkpoint_every_zero_keeps_only_the_final_model(tmp_path):
    """checkpoint_every = 0: no periodic checkpoints; the final one holds the model and the
    server state but not the N × d per-client tables. Periodic checkpoints hold them (a run resumes from
    them); a finished run's final one never does: nothing resumes a finished run."""
    from fedsl.config import schema as C
    from fedsl.runs.runner import run

    data = sweep_config(1, "scaffold")
    for k in ("seeds", "sweep"):
        data.pop(k)
    data["checkpoint_every"] = 0
    cfg = C.validate(data)
    run(cfg, tmp_path / "a", log=lambda m: None, progress=False, stop_after=3)
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 3 and set(ckpt["algo"]) == {"c"} and set(ckpt["clients"]) == {"c_i"}  # resumable
    run(cfg, tmp_path / "a", resume=True, log=lambda m: None, progress=False)
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 5 and set(ckpt["algo"]) == {"c"} and ckpt["clients"] == {}
    every = C.validate({**data, "checkpoint_every": 1})
    run(every, tmp_path / "b", log=lambda m: None, progress=False, stop_after=4)
    assert set(torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["clients"]) == {"c_i"}
    full = run(every, tmp_path / "b", resume=True, log=lambda m: None, progress=False)
    ref = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert full["status"] == "completed" and set(ref["algo"]) == {"c"} and ref["clients"] == {}
    assert all(torch.equal(ref["params"][n], ckpt["params"][n]) for n in ref["params"])


def test_stack_limit_on_a_gpu_from_measured_memory(monkeypatch):
    """stack = 'auto' on CUDA: tables (N × d) plus the measured working memory per run, in 80% of the
    free memory: 37 SCAFFOLD runs of the CIFAR CNN (N = 1,000) on an H200's 139 GB, 21 on an H100's
    79 GB (it was 31 and 17 with a guessed half of the memory); FSL's runs, without tables, 64."""
    import torch

    from fedsl.config import schema as C
    from fedsl.runs import memory
    monkeypatch.setattr(memory.placement, "resolve_device", lambda name: torch.device("cuda"))

    def cfg(alg):
        return C.validate({"name": "s", "rounds": 1, "model": {"name": "cifar_cnn"},
                           "data": {"dataset": "cifar10", "num_clients": 1000, "server_source": "clients",
                                    "server_clients": 10},
                           "algorithm": {"name": alg, "clients_per_round": 10, "local_lr": 0.02, "batch_size": 10}})
    for free, scaffold in ((139e9, 37), (79e9, 21)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (int(free), int(free)))
        assert memory.stack_limit(cfg("scaffold")) == memory.stack_limit(cfg("feddyn")) == scaffold
        assert memory.stack_limit(cfg("fsl")) == 64
        # tables in host memory leave the working memory only: as many runs as FSL's
        host = C.validate({**cfg("scaffold").model_dump(), "client_tables": "host"})
        assert memory.stack_limit(host) == 64
    # 'auto' puts them in host memory when one run's 2.18 GB would take over half the free memory
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(4e9), int(4e9)))
    assert memory.stack_limit(cfg("scaffold")) == memory.stack_limit(cfg("fsl")) == 4
    device = C.validate({**cfg("scaffold").model_dump(), "client_tables": "device"})
    assert memory.stack_limit(device) == 1


def test_client_tables_where_they_live(monkeypatch):
    """``client_tables``: 'device' or 'host' as asked; 'auto' = host on a GPU when one run's tables (N × d per
    state the rule keeps) would take more than half its free memory; a CPU run's tables are in host memory
    anyway; rules without client state keep no tables."""
    import torch

    from fedsl.algorithms import LocalTraining, make_algorithm
    from fedsl.config import schema as C
    from fedsl.runs.placement import tables_on_host

    def cfg(tables="auto", dtype="float32"):
        return C.validate({"name": "s", "rounds": 1, "data": {"dataset": "synthetic_chars"}, "client_tables": tables,
                           "dtype": dtype, "algorithm": {"name": "scaffold"}})
    scaffold = make_algorithm("scaffold", LocalTraining(0.1, 10), 1.0, None)
    fedavg = make_algorithm("fedavg", LocalTraining(0.1, 10), 1.0, None)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(5e9), int(80e9)))
    n, d = 1000, 545_098  # 2.18 GB of float32 c_i; 4.36 GB in float64
    assert not tables_on_host(cfg(), cuda, scaffold, n, d)
    assert tables_on_host(cfg(dtype="float64"), cuda, scaffold, n, d)
    assert tables_on_host(cfg(), cuda, scaffold, 2 * n, d)
    assert not tables_on_host(cfg(), cuda, fedavg, 100 * n, d)
    assert not tables_on_host(cfg("device"), cuda, scaffold, 100 * n, d)
    assert tables_on_host(cfg("host"), cuda, scaffold, 1, 1)
    assert not tables_on_host(cfg("host"), cpu, scaffold, n, d)


def test_a_stacked_runs_checkpoint_holds_only_its_own_model(tmp_path):
    """A stacked run's model is a view into the tensor of all stacked runs; its checkpoint must
    hold its own numbers only (torch.save writes a view's whole storage: each of 4 stacked runs'
    checkpoints held all 4 models, 4× the size)."""
    import copy

    from fedsl.config import schema as C
    from fedsl.sweeps.compare import run_group

    sizes = {}
    for stack in (1, 4):
        data = tiny_config(rounds=3, executor="vectorised", checkpoint_every=3, seeds=[0, 1, 2, 3], stack=stack)
        run_group(C.validate(copy.deepcopy(data)), tmp_path / str(stack), log=lambda m: None, progress=False)
        sizes[stack] = sorted(p.stat().st_size for p in (tmp_path / str(stack)).glob("*/checkpoint.pt"))
    assert len(sizes[4]) == 4 and sizes[4] == sizes[1]
    blob = torch.load(next((tmp_path / "4").glob("*/checkpoint.pt")), weights_only=True)
    assert all(v.untyped_storage().nbytes() == v.numel() * v.element_size() for v in blob["params"].values())
