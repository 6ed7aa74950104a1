"""Stacked runs advance in lock-step with results equal to running them one by one.

Each case stacks runs that differ in what a sweep varies (seed, η_l, γ, B, the data
pool and partition) and compares every run's model, rule state and round records with
the same run on its own: exactly with the sequential executor (same operations in the
same order), to float64 rounding with the vectorised one (R·S clients in one vmap).
"""

import pytest
import torch

from conftest import random_federation, run_rounds
from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms.gamma_schedule import GammaSchedule
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import RunState, Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]
HP = {"fedprox": {"mu": 0.3}, "feddyn": {"alpha": 0.1}, "fedadam": {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3}}
GLOBAL_LR = {"fedavg": 1.7, "fedprox": 1.7, "fedadam": 0.1, "scaffold": 1.7, "feddyn": 1.0, "ds": 1.7}


def _sim(name, fed, executor, *, lr=0.1, batch=8, gamma=0.8, mode="incremental", seed=11, model="mlp",
         schedule=None):
    fm = FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    sl = None
    if gamma is not None:
        sl = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1, mode=mode,
                            schedule=schedule)
    alg = make_algorithm(name, LocalTraining(lr, batch), GLOBAL_LR[name], sl, **HP.get(name, {}))
    return Simulator(fm, fed, alg, executor(fm), 4, seed=seed)


def _clone(st: RunState) -> RunState:
    return RunState({n: p.clone() for n, p in st.x.items()},
                    {k: {n: p.clone() for n, p in v.items()} for k, v in st.algo.items()}, st.gamma)


def _flat(st: RunState) -> dict:
    out = {f"x.{n}": p for n, p in st.x.items()}
    out.update({f"{k}.{n}": p for k, v in st.algo.items() for n, p in v.items()})
    return out


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
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "feddyn", "fedadam"])
def test_stacked_equals_one_by_one(name, executor, exact):
    """Seeds, η_l, B, γ (one run without server learning) and the data pool all differ."""
    fed_a = random_federation(SIZES, seed=0)
    fed_b = random_federation(SIZES[::-1], seed=1)  # another pool and partition: concatenated

    def sims():
        return [_sim(name, fed_a, executor, seed=11),
                _sim(name, fed_a, executor, seed=12, lr=0.05, batch=5, gamma=1.5),
                _sim(name, fed_b, executor, seed=13, gamma=None),
                _sim(name, fed_b, executor, seed=11, lr=0.2, gamma=0.3)]
    stacked, _ = _compare(sims, exact=exact)
    assert stacked.offsets == [0, 0, len(fed_a.x), len(fed_a.x)]


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
def test_stacked_fslp_ds_adaptive(executor, exact):
    """FSL-p (server as a client), DS (clients hold D0 too) and an adaptive γ stack as well."""
    fed = random_federation(SIZES, seed=0)
    _compare(lambda: [_sim("fedavg", fed, executor, mode="parallel", seed=s) for s in (1, 2)], exact=exact)
    _compare(lambda: [_sim("ds", fed, executor, gamma=None, seed=s) for s in (1, 2)], exact=exact)
    adaptive = GammaSchedule(kind="adaptive", gamma=1.0, shrink=0.5)
    _compare(lambda: [_sim("fedavg", fed, executor, schedule=adaptive, seed=s) for s in (1, 2)], exact=exact)


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
    with pytest.raises(ValueError, match="proximal coefficient"):
        a = _sim("fedprox", fed, SequentialExecutor)
        b = _sim("fedprox", fed, SequentialExecutor)
        object.__setattr__(b.alg.rule, "mu", 0.9)
        StackedSimulator([a, b])
    with pytest.raises(ValueError, match="parameters differ"):
        StackedSimulator([_sim("fedavg", fed, SequentialExecutor),
                          _sim("fedavg", fed, SequentialExecutor, model="linear")])
    with pytest.raises(ValueError, match="at least one run"):
        StackedSimulator([])
