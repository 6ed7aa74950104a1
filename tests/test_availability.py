"""Partial participation and stragglers (fedsl.core.participation; algorithm.availability, straggler_*).

Each option changes who is sampled or what arrives, deterministically from (seed, round): the tests check
sampling among the available clients only, partial stragglers' fewer steps, dropped stragglers' absence
from the aggregate, resume and stacking bit for bit, the Flower strategy drawing as the simulator does,
the config's bounds, and that the defaults draw nothing new.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import TINY, clone_state, flat_state, max_diff, random_federation, run_rounds
from test_flower import BASE, run_flower, run_simulator

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.config.loading import load
from fedsl.config.schema import ConfigError
from fedsl.core import participation, rng
from fedsl.core.participation import Participation
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import make_plan, truncate
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model
from fedsl.runs.runner import run

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20, 11, 14]


def _sim(part=Participation(), name="fsl", seed=11, gamma=0.8, global_lr=1.7, s=4, fed=None,
         executor=SequentialExecutor):
    fed = fed or random_federation(SIZES)
    fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    sl = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1) if gamma is not None else None
    alg = make_algorithm(name, LocalTraining(0.1, 8), global_lr, sl)
    return Simulator(fm, fed, alg, executor(fm), s, seed=seed, part=part)


# ----------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("pattern", ["bernoulli", "fixed"])
def test_only_available_clients_are_sampled(pattern):
    part = Participation(0.3, pattern)
    sizes = []
    for t in range(40):
        avail = participation.available(5, t, 50, 0.3, pattern)
        ids = participation.sample(5, t, 50, 8, part)
        assert set(ids.tolist()) <= set(avail.tolist())
        assert len(ids) == min(8, len(avail)) and list(ids) == sorted(ids)
        sizes.append(len(avail))
    assert 8 < np.mean(sizes) < 22  # about p·N = 15 available per round
    # fewer available than S: all of them
    ids = participation.sample(5, 0, 50, 49, part)
    np.testing.assert_array_equal(ids, participation.available(5, 0, 50, 0.3, pattern))


def test_fixed_pattern_is_an_evenly_spread_fraction_of_rounds():
    """p = 1/4, fixed: every client available in exactly one round of every 4, the clients staggered."""
    rounds = np.array([np.isin(np.arange(20), participation.available(2, t, 20, 0.25, "fixed")) for t in range(12)])
    assert (rounds.reshape(3, 4, 20).sum(axis=1) == 1).all()
    assert len({int(np.argmax(rounds[:4, i])) for i in range(20)}) > 1  # different phases


def test_bernoulli_availability_changes_every_round():
    a = [tuple(participation.available(2, t, 30, 0.5, "bernoulli")) for t in range(10)]
    assert len(set(a)) > 5


def test_the_defaults_draw_nothing_new(monkeypatch):
    """p = 1 and f = 0: the sampling is rng.sample_clients itself and no other stream is drawn."""
    drawn = []
    real = rng.rng

    def spy(seed, *stream):
        drawn.append(stream)
        return real(seed, *stream)
    monkeypatch.setattr(rng, "rng", spy)
    sim = _sim()
    st = sim.initial_state()
    for t in range(3):
        st, info = sim.round(st, t)
        np.testing.assert_array_equal(info.clients, np.sort(real(11, t, rng.SAMPLE_CLIENTS).choice(10, 4,
                                                                                                   replace=False)))
    new = {rng.AVAILABILITY, rng.AVAILABILITY_PHASE, rng.SAMPLE_AVAILABLE, rng.STRAGGLERS}
    assert not [s for s in drawn if new & set(s[:2])]


# ----------------------------------------------------------------------------- the simulator

def test_rounds_with_no_available_client_still_run_server_learning():
    sim = _sim(Participation(0.05))
    st = sim.initial_state()
    empty = 0
    for t in range(6):
        x = {n: v.clone() for n, v in st.x.items()}
        st, info = sim.round(st, t)
        assert set(info.clients.tolist()) <= set(participation.available(11, t, 10, 0.05, "bernoulli").tolist())
        if len(info.clients) == 0:
            empty += 1
            assert info.client_steps == () and info.server_steps > 0 and max_diff(st.x, x) > 0
    assert empty >= 3


def test_partial_stragglers_do_fewer_steps():
    full = run_rounds(_sim(), 4)[1]
    part = run_rounds(_sim(Participation(straggler_fraction=0.5)), 4)[1]
    for a, b in zip(full, part):
        assert a.clients.tolist() == b.clients.tolist()  # stragglers change no one's sampling
        shorter = [j for j, (k, k0) in enumerate(zip(b.client_steps, a.client_steps)) if k < k0]
        assert len(shorter) == 2 and all(1 <= k <= k0 for k, k0 in zip(b.client_steps, a.client_steps))


def test_a_truncated_plan_is_the_plan_of_fewer_steps():
    """What makes the Flower client's plan (local-steps = K'_i) the simulator's truncated one."""
    data = [np.arange(0, 23)]
    full = make_plan(data, [3], 4, 2, None, 1, 5, rng.CLIENT_BATCHES)
    short = make_plan(data, [3], 4, 2, 5, 1, 5, rng.CLIENT_BATCHES)
    cut = truncate(full, (5,))
    assert cut.steps == short.steps == (5,)
    assert torch.equal(cut.idx, short.idx) and torch.equal(cut.weight, short.weight) and torch.equal(cut.keys,
                                                                                                    short.keys)


def test_dropped_stragglers_are_absent_from_the_aggregate():
    """FedAvg with η_g = 1 and no server learning: x_1 is the mean of the arriving clients' models only."""
    sim = _sim(Participation(straggler_fraction=0.5, straggler_mode="drop"), name="fedavg", gamma=None, global_lr=1.0)
    st = sim.initial_state()
    work = sim.sample(0)
    assert len(work.dropped) == 2 and work.dropped <= set(work.ids.tolist())
    finals, _ = sim.train_clients(clone_state(st), work, 0)
    keep = [j for j, i in enumerate(work.ids.tolist()) if i not in work.dropped]
    new, info = sim.round(st, 0)
    assert info.dropped == tuple(sorted(work.dropped))
    assert max_diff(new.x, {n: v[keep].mean(0) for n, v in finals.items()}) < 1e-12
    assert max_diff(new.x, {n: v.mean(0) for n, v in finals.items()}) > 1e-6  # the dropped ones would move it


@pytest.mark.parametrize("part", [Participation(0.4, "bernoulli", 0.5, "partial"),
                                  Participation(0.5, "fixed", 0.4, "drop")])
def test_resume_is_bit_identical(part):
    """Everything is drawn from (seed, t): 2 rounds, then a fresh simulator from the state, equals 5 in one go."""
    whole, infos = run_rounds(_sim(part, name="scaffold"), 5)
    st, _ = run_rounds(_sim(part, name="scaffold"), 2)
    sim = _sim(part, name="scaffold")
    for t in range(2, 5):
        st, info = sim.round(clone_state(st), t)
        assert info.client_steps == infos[t].client_steps and info.dropped == infos[t].dropped
    a, b = flat_state(st), flat_state(whole)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("executor", [SequentialExecutor, VectorisedExecutor])
def test_stacked_runs_equal_runs_one_by_one(executor):
    """Runs of different settings stacked (one with no available client in most rounds): each equals its run
    alone, bit for bit with the sequential executor, to float64 rounding with the vectorised one."""
    parts = [Participation(0.4, "bernoulli", 0.5, "partial"), Participation(0.5, "fixed", 0.4, "drop"),
             Participation(), Participation(0.05)]
    exact = executor is SequentialExecutor

    def sims():
        return [_sim(p, name="scaffold", seed=11 + r, executor=executor) for r, p in enumerate(parts)]
    stacked = StackedSimulator(sims())
    states = stacked.initial_states()
    all_infos = []
    for t in range(4):
        states, infos = stacked.round(states, t)
        all_infos.append(infos)
    for r, sim in enumerate(sims()):
        alone, alone_infos = run_rounds(sim, 4)
        a, b = flat_state(states[r]), flat_state(alone)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) if exact else torch.allclose(a[k], b[k], rtol=0, atol=1e-12) for k in a), r
        for t, info in enumerate(alone_infos):
            mine = all_infos[t][r]
            assert (mine.clients.tolist(), mine.client_steps, mine.dropped) == (info.clients.tolist(),
                                                                                 info.client_steps, info.dropped)


def test_an_interrupted_run_resumes_identically(tmp_path):
    """Through the runner and its checkpoint: nothing of the options is checkpointed, all is redrawn from t."""
    extra = "availability = 0.5\nstraggler_fraction = 0.4\nstraggler_mode = 'drop'\n"
    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(rounds=8, alg="fsl", dtype="float64", executor="auto") + extra)
    cfg = load(p)
    assert not cfg.participation.full
    run(cfg, tmp_path / "full", log=lambda s: None, progress=False)
    run(cfg, tmp_path / "part", log=lambda s: None, progress=False, stop_after=4)
    run(cfg, tmp_path / "part", resume=True, log=lambda s: None, progress=False)
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["params"]
    b = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    metrics = [(tmp_path / d / "metrics.csv").read_text().splitlines() for d in ("full", "part")]
    assert [r.split(",")[:4] for r in metrics[0]] == [r.split(",")[:4] for r in metrics[1]]


# ----------------------------------------------------------------------------- Flower

@pytest.mark.parametrize("extra", [
    {"algorithm.availability": 0.5, "algorithm.straggler_fraction": 0.5},  # partial: local-steps sent
    {"algorithm.availability": 0.75, "algorithm.availability_pattern": "fixed", "algorithm.straggler_fraction": 0.5,
     "algorithm.straggler_mode": "drop", "algorithm.clients_per_round": 3},
])
def test_flower_samples_and_straggles_as_the_simulator(one_thread, flower_task_identity, extra):
    rc = {**BASE, "rounds": 4, "data.num_clients": 6, "data.samples_per_client": 16, **extra}
    strategy, grid = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["sampled"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert [h["trained"] for h in strategy.history] == [[c for c in i.clients.tolist() if c not in i.dropped]
                                                        for i in infos]
    assert [h.get("straggler_dropped", []) for h in strategy.history] == [list(i.dropped) for i in infos]
    if extra.get("algorithm.straggler_mode") != "drop":
        assert [h["client_steps"] for h in strategy.history] == [list(i.client_steps) for i in infos]
    # the options were exercised: availability changed whom the server sampled, and stragglers straggled
    s = rc["algorithm.clients_per_round"]
    assert any(i.clients.tolist() != rng.sample_clients(1, t, 6, s).tolist() for t, i in enumerate(infos))
    assert any(i.dropped for i in infos) or any(k == 1 for i in infos for k in i.client_steps)
    assert max_diff(strategy.state.x, expected.x) == 0.0


# ----------------------------------------------------------------------------- config

MINIMAL = {"rounds": 1, "data": {"dataset": "synthetic_chars"}, "algorithm": {"name": "fedavg"}}


@pytest.mark.parametrize("item, fragment", [
    ("algorithm.availability=0", "algorithm.availability = 0"),
    ("algorithm.availability=1.5", "algorithm.availability = 1.5"),
    ("algorithm.availability_pattern='weekly'", "algorithm.availability_pattern = 'weekly'"),
    ("algorithm.straggler_fraction=1.0", "algorithm.straggler_fraction = 1.0"),
    ("algorithm.straggler_fraction=-0.1", "algorithm.straggler_fraction = -0.1"),
    ("algorithm.straggler_mode='late'", "algorithm.straggler_mode = 'late'"),
])
def test_bad_values_are_refused_in_one_line(item, fragment):
    with pytest.raises(ConfigError) as info:
        load(None, [item], base=copy.deepcopy(MINIMAL))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_config_keys_reach_the_simulator():
    keys = ["algorithm.availability=0.5", "algorithm.availability_pattern='fixed'", "algorithm.straggler_fraction=0.25",
            "algorithm.straggler_mode='drop'"]
    cfg = load(None, keys, base=copy.deepcopy(MINIMAL))
    assert cfg.participation == Participation(0.5, "fixed", 0.25, "drop")
    assert load(None, [], base=copy.deepcopy(MINIMAL)).participation.full


def test_participation_checks_its_bounds():
    with pytest.raises(ValueError, match="availability = 0"):
        Participation(0.0)
    with pytest.raises(ValueError, match="straggler fraction = 1"):
        Participation(straggler_fraction=1)


def test_flower_rounds_with_no_available_client_run_server_learning(one_thread, flower_task_identity):
    rc = {**BASE, "rounds": 4, "data.num_clients": 6, "data.samples_per_client": 16, "algorithm.availability": 0.1}
    strategy, grid = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert any(len(i.clients) == 0 for i in infos)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert all(h["server_steps"] > 0 for h in strategy.history)
    assert max_diff(strategy.state.x, expected.x) == 0.0
