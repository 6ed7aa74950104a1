"""Robust server rules (fedsl.algorithms.robust; the [robust] table).

Every aggregator by hand on tiny tensors (median, trimmed mean, Krum and Multi-Krum scores and selection,
norm bounding, FLTrust's trust scores and rescaling with its all-zero case, bucketing before them); the step
in Algorithm 1's server half: any rule's mean of the returned replies is the robust aggregate, FSL-p's
server row is left out of it, FLTrust's g0 comes from the engine, the stacked engine's batched shortcut
does not bypass it; 'mean' is today's run bit for bit; the median resists an attack that breaks FedAvg;
stacked runs with attacks and robust rules equal the runs alone; nonsense combinations are one-line errors.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import flat_state, random_federation, run_rounds, tiny_config

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms import robust as R
from fedsl.algorithms import server_round as sl
from fedsl.algorithms.base import ClientResults, RunState
from fedsl.algorithms.robust import Robust, robust_results
from fedsl.config import schema as C
from fedsl.core.attacks import Attack
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model
from fedsl.runs.runner import run

pytestmark = pytest.mark.usefixtures("one_thread")


def t64(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ----------------------------------------------------------------------------- the aggregators by hand

def test_median_odd_and_even():
    d = t64([1.0, 9.0], [5.0, -1.0], [3.0, 2.0])
    assert torch.equal(R.median(d), t64(3.0, 2.0))
    d4 = t64([1.0, 9.0], [5.0, -1.0], [3.0, 2.0], [100.0, 4.0])
    assert torch.equal(R.median(d4), t64(4.0, 3.0))  # the mean of the two middle values, not the lower one


def test_trimmed_mean_drops_the_largest_and_smallest_per_coordinate():
    d = t64([1.0, 10.0], [2.0, -50.0], [3.0, 20.0], [4.0, 30.0], [100.0, 40.0])
    assert torch.equal(R.trimmed_mean(d, 0.2), t64(3.0, 20.0))  # k = 1: (2+3+4)/3, (10+20+30)/3
    assert torch.equal(R.trimmed_mean(d, 0.0), d.mean(0))
    assert torch.equal(R.trimmed_mean(d, 0.49), t64(3.0, 20.0))  # k = ⌊2.45⌋ = 2: the median
    assert R.trimmed_mean(t64(*[[float(i)] for i in range(100)]), 0.29).item() == 49.5  # k = 29, not 28


def test_krum_scores_and_selection_by_hand():
    d = t64([0.0], [1.0], [3.0], [10.0])
    # f = 0: S − f − 2 = 2 nearest; squared distances 0:{1,9,100} 1:{1,4,81} 3:{9,4,49} 10:{100,81,49}
    assert torch.equal(R.krum_scores(d, 0), t64(10.0, 5.0, 13.0, 130.0))
    assert torch.equal(R.krum(d, 0), t64(1.0))  # Krum: the lowest score's update
    assert torch.equal(R.krum(d, 0, 2), t64(0.5))  # Multi-Krum, m = 2: the mean of Δ_1, Δ_0
    # f = 1: one nearest; scores 1, 1, 4, 49: the tie goes to the lower row
    assert torch.equal(R.krum_scores(d, 1), t64(1.0, 1.0, 4.0, 49.0))
    assert R.krum_select(R.krum_scores(d, 1), 3).tolist() == [0, 1, 2]
    two_d = t64([0.0, 0.0], [3.0, 4.0], [0.0, 1.0])
    assert torch.equal(R.krum_scores(two_d, 0), t64(1.0, 18.0, 1.0))  # 1 nearest: ‖·‖² in 2-D
    # Robust's defaults: f = ⌊(S' − 3)/2⌋, Multi-Krum's m = S' − f
    assert [R.default_krum_f(s) for s in (1, 3, 4, 5, 7, 10)] == [0, 0, 0, 1, 2, 3]
    assert torch.equal(R.robust_delta(Robust("multi_krum"), d), t64(3.5))  # f = 0, m = 4: every update
    assert torch.equal(R.robust_delta(Robust("multi_krum", krum_m=2), d), t64(0.5))
    assert torch.equal(R.robust_delta(Robust("krum", krum_f=1), d), t64(0.0))


def test_krum_with_fewer_replies_clamps_its_neighbours():
    assert [R.krum_neighbours(s, 1) for s in (1, 2, 3, 4, 6)] == [0, 1, 1, 1, 3]
    assert torch.equal(R.krum(t64([2.0]), 1), t64(2.0))  # one reply: it
    assert torch.equal(R.krum(t64([2.0], [5.0]), 1), t64(2.0))  # two: equal scores, the first


def test_bulyan_by_hand():
    """S' = 7, f = 1: θ = 5 picks by Krum (neighbours |R| − 3, at least 1), then β = 3 per coordinate.
    R = {0, 1, 3, 7, 8, 30, −20}, 4 nearest: scores 0:123 1:90 3:54 7:102 8:139 → 3;
    {0, 1, 7, 8, 30, −20}, 3 nearest: 0:114 1:86 7:86 8:114 → 1 (tie: the lower row);
    {0, 7, 8, 30, −20}, 2 nearest: 0:113 7:50 8:65 → 7; {0, 8, 30, −20}, 1 nearest: 0:64 8:64 → 0 (tie);
    {8, 30, −20}: 8:484 30:484 −20:784 → 8. Picked 3, 1, 7, 0, 8: median 3, the 3 nearest it 3, 1, 0: mean 4/3
    (the picked values' mean is 19/5, their median 3, their 1-trimmed mean 11/3)."""
    d = t64([0.0], [1.0], [3.0], [7.0], [8.0], [30.0], [-20.0])
    assert R.bulyan(d, 1).tolist() == pytest.approx([4 / 3], abs=1e-15)
    assert R.bulyan(torch.cat([d, -d], 1), 1).tolist() == pytest.approx([4 / 3, -4 / 3], abs=1e-15)  # per coordinate
    assert torch.equal(R.bulyan(d, 0), d.mean(0))  # f = 0: θ = β = S', the mean
    with pytest.raises(ValueError) as e:
        R.bulyan(d[:6], 1)
    assert str(e.value) == "robust.aggregator = 'bulyan' with f = 1 needs S' >= 4f + 3 = 7 updates, got 6"
    # the default f is the largest with S' >= 4f + 3; a round with fewer replies than 4f + 3 runs with that one
    assert [R.default_bulyan_f(s) for s in (1, 3, 6, 7, 10, 11)] == [0, 0, 0, 1, 1, 2]
    assert R.robust_delta(Robust("bulyan"), d).tolist() == pytest.approx([4 / 3], abs=1e-15)  # f = 1
    assert torch.equal(R.robust_delta(Robust("bulyan", krum_f=1), d[:6]), d[:6].mean(0))  # S' = 6: f = 0


def test_norm_bound_clips_long_updates_only():
    d = t64([3.0, 4.0], [0.3, 0.4], [0.0, 0.0])
    out = R.clip(d, 1.0)
    torch.testing.assert_close(out, t64([0.6, 0.8], [0.3, 0.4], [0.0, 0.0]), rtol=0, atol=1e-15)
    assert R.robust_delta(Robust("norm_bound", norm_bound=1.0), d).shape == (3, 2)  # a row per client


def test_fltrust_scores_rescaling_and_aggregate_by_hand():
    g0 = t64(2.0, 0.0)
    d = t64([4.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [1.0, 1.0], [0.0, 0.0])
    ts = R.trust_scores(d, g0)
    torch.testing.assert_close(ts, t64(1.0, 0.0, 0.0, 1 / math.sqrt(2), 0.0), rtol=0, atol=1e-15)
    # Δ̄_i = (‖g0‖/‖Δ_i‖) Δ_i: [2, 0] and [√2, √2]; Δ̂ = (1·[2, 0] + (1/√2)·[√2, √2]) / (1 + 1/√2)
    want = t64(3.0, 1.0) / (1 + 1 / math.sqrt(2))
    torch.testing.assert_close(R.fltrust(d, g0), want, rtol=0, atol=1e-15)
    # no update agrees with g0, or g0 = 0: Δ̂ = 0
    assert torch.equal(R.fltrust(t64([-1.0, 0.0], [0.0, 2.0]), g0), t64(0.0, 0.0))
    assert torch.equal(R.fltrust(d, t64(0.0, 0.0)), t64(0.0, 0.0))


# ----------------------------------------------------------------------------- the step in the server half

X = {"w": t64(1.0, 2.0), "b": t64(0.5)}
FINALS = {"w": t64([2.0, 2.0], [1.0, 5.0], [0.0, 2.0], [1.0, 3.0]), "b": t64([1.5], [0.0], [0.5], [1.0])}
RESULTS = ClientResults(FINALS, [3, 5, 7, 9], (2, 3, 2, 4), (4, 0, 7, 2))


def test_bucket_means_by_hand():
    d = t64([1.0], [2.0], [3.0], [4.0], [10.0])
    order = torch.tensor([4, 0, 2, 1, 3])  # 10, 1 | 3, 2 | 4: the last bucket holds the one left over
    assert torch.equal(R.bucket_means(d, 2, order), t64([5.5], [2.5], [4.0]))
    assert torch.equal(R.bucket_means(d, 5, order), t64([4.0]))  # one bucket: the mean
    assert torch.equal(R.bucket_means(d, 1, order), d[order])
    assert [R.bucket_count(5, k) for k in (1, 2, 3, 5, 6)] == [5, 3, 2, 1, 1]


def test_bucket_order_is_a_permutation_drawn_from_seed_and_round_alone():
    a = R.bucket_order(7, 3, 9)
    assert sorted(a.tolist()) == list(range(9))
    assert torch.equal(a, R.bucket_order(7, 3, 9))  # a resumed run draws it again
    orders = {tuple(R.bucket_order(seed, t, 9).tolist()) for seed in (7, 8) for t in (3, 4)}
    assert len(orders) == 4  # a new order each round and each seed


def test_bucketing_keeps_what_the_median_throws_away_from_heterogeneous_updates():
    """Three honest clients of different classes: the coordinate-wise median of their updates is 0 (each
    coordinate has one non-zero value), the failure of robust rules on non-IID data that bucketing addresses
    (Karimireddy et al., ICLR 2022). In buckets of 2 the median sees two means and keeps half of the mean."""
    d = t64([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0])
    assert torch.equal(R.robust_delta(Robust("median"), d), t64(0.0, 0.0, 0.0))
    seed, t = 3, 5
    order = R.bucket_order(seed, t, 3)
    got = R.robust_delta(Robust("median", bucket=2, seed=seed), d, t=t)
    assert torch.equal(got, R.median(R.bucket_means(d, 2, order)))
    assert got.sum().item() == pytest.approx(1.0) and got.max().item() == 0.5  # (x + y)/2 and z, averaged


def test_bucketing_applies_to_the_rules_it_is_for_and_counts_krums_rows_in_buckets():
    d = torch.randn(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    seed, t = 1, 2
    means = R.bucket_means(d, 2, R.bucket_order(seed, t, 7))  # 4 rows: Krum's default f = ⌊(4 − 3)/2⌋ = 0
    assert torch.equal(R.robust_delta(Robust("krum", bucket=2, seed=seed), d, t=t), R.krum(means, 0))
    assert torch.equal(R.robust_delta(Robust("multi_krum", bucket=2, seed=seed), d, t=t), R.krum(means, 0, 4))
    assert torch.equal(R.robust_delta(Robust("trimmed_mean", trim=0.25, bucket=2, seed=seed), d, t=t),
                       R.trimmed_mean(means, 0.25))
    assert torch.equal(R.robust_delta(Robust("median", bucket=1, seed=seed), d, t=t), R.median(d))


def test_robust_results_gives_every_client_the_aggregate():
    out = robust_results(X, RESULTS, Robust("median"))
    # Δ: w [1,0] [0,3] [-1,0] [0,1], b [1, -0.5, 0, 0.5]: medians w [0, 0.5], b 0.25
    for j in range(4):
        assert torch.equal(out.params["w"][j], t64(1.0, 2.5)) and torch.equal(out.params["b"][j], t64(0.75))
    assert (out.sizes, out.steps, out.ids) == (RESULTS.sizes, RESULTS.steps, RESULTS.ids)
    clipped = robust_results(X, RESULTS, Robust("norm_bound", norm_bound=1.0))  # per client: ‖Δ_1‖ = √9.25
    n1 = math.sqrt(9.25)
    torch.testing.assert_close(clipped.params["w"][1], t64(1.0, 2.0 + 3 / n1), rtol=0, atol=1e-15)
    assert torch.equal(clipped.params["w"][2], FINALS["w"][2])  # ‖Δ_2‖ = 1: kept


@pytest.mark.parametrize("name,weighted", [("fedavg", False), ("fedavg", True), ("scaffold", False),
                                           ("fedadam", False)])
def test_any_rules_mean_of_the_robust_replies_is_the_robust_aggregate(name, weighted):
    """x̄ with the robust step equals the rule's update of S copies of x_t + Δ̂ (whatever its weights)."""
    alg = make_algorithm(name, LocalTraining(0.1, 4), 1.5, None, weighted, Robust("trimmed_mean", trim=0.25))
    plain = make_algorithm(name, LocalTraining(0.1, 4), 1.5, None, weighted)
    state = RunState(X, alg.rule.init_server_state(X))
    srv = sl.ServerSide(10, 0, None, None)
    got = sl.aggregate(alg, state, RESULTS, 0, srv)
    hat = R.trimmed_mean(R.flat_deltas(X, FINALS), 0.25)  # k = 1 of 4
    copies = ClientResults({n: (p + R.unflatten(hat, X)[n]).unsqueeze(0).expand(4, *p.shape) for n, p in X.items()},
                           RESULTS.sizes, RESULTS.steps, RESULTS.ids)
    want = sl.aggregate(plain, state, copies, 0, srv)
    for n in X:
        torch.testing.assert_close(got.x_bar[n], want.x_bar[n], rtol=0, atol=1e-15)
    if name == "fedavg":  # x̄ = x + η_g·Δ̂
        torch.testing.assert_close(got.x_bar["w"], X["w"] + 1.5 * R.unflatten(hat, X)["w"], rtol=0, atol=1e-15)


def test_fslp_server_row_joins_after_the_robust_step():
    """FSL-p: the median is of the clients' rows only; the server's x0 joins the mean with weight w0."""
    x0 = {"w": t64(3.0, 3.0), "b": t64(1.0)}
    server = ServerLearning(gamma=1.0, lr=0.1, batch_size=2, epochs=1, mode="parallel", weight=0.2)
    alg = make_algorithm("fedavg", LocalTraining(0.1, 4), 1.0, server, robust=Robust("median"))
    srv = sl.ServerSide(10, 4, lambda x, t, lr: (x0, 7), None)
    got = sl.aggregate(alg, RunState(X), RESULTS, 0, srv)
    hat = R.unflatten(R.median(R.flat_deltas(X, FINALS)), X)
    for n in X:
        want = X[n] + 0.8 * hat[n] + 0.2 * (x0[n] - X[n])
        torch.testing.assert_close(got.x_bar[n], want, rtol=0, atol=1e-15)
    assert got.server_steps == 7


def test_fltrust_takes_g0_from_the_engines_root_update():
    calls = []
    g0 = {"w": t64(1.0, 0.0), "b": t64(0.0)}

    def root(x, t):
        calls.append(t)
        return {n: x[n] + g0[n] for n in x}
    alg = make_algorithm("fedavg", LocalTraining(0.1, 4), 2.0, None, robust=Robust("fltrust"))
    got = sl.aggregate(alg, RunState(X), RESULTS, 5, sl.ServerSide(10, 4, None, None, root_update=root))
    assert calls == [5]
    hat = R.fltrust(R.flat_deltas(X, FINALS), R.flat_deltas(X, {n: v.unsqueeze(0) for n, v in root(X, 5).items()})[0])
    torch.testing.assert_close(got.x_bar["w"], X["w"] + 2.0 * R.unflatten(hat, X)["w"], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="root_update"):
        sl.aggregate(alg, RunState(X), RESULTS, 5, sl.ServerSide(10, 4, None, None))


def test_mean_is_no_robust_step_and_a_robust_rule_is_not_the_rule_alone():
    assert make_algorithm("fedavg", LocalTraining(0.1, 4), 1.0, None, robust=Robust("mean")).robust is None
    assert sl._rule_alone(make_algorithm("fedavg", LocalTraining(0.1, 4), 1.0, None))
    assert not sl._rule_alone(make_algorithm("fedavg", LocalTraining(0.1, 4), 1.0, None, robust=Robust("median")))


# ----------------------------------------------------------------------------- runs

def test_mean_and_no_attack_are_todays_run_bit_for_bit(tmp_path, monkeypatch):
    """``robust.aggregator = 'mean'`` (and an attack of kind 'none') never enter the robust step: the same files. (Their
    other keys, robust.trim or attack.fraction, are refused with them: tests/test_config.py.)"""
    a = run(C.validate(tiny_config(rounds=3)), tmp_path / "a", log=lambda m: None, progress=False)
    monkeypatch.setattr(sl, "robust_results", lambda *a: pytest.fail("the robust step ran"))
    b = run(C.validate(tiny_config(rounds=3, robust={"aggregator": "mean"}, attack={"kind": "none"})),
            tmp_path / "b", log=lambda m: None, progress=False)
    assert a["final_accuracy"] == b["final_accuracy"]
    pa = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["params"]
    pb = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(pa[n], pb[n]) for n in pa)


def _iid10(**extra) -> C.RunConfig:
    """10 clients, all sampled each round, IID font characters: seconds per run."""
    d = tiny_config(rounds=10, alg="fedavg", checkpoint_every=0, **extra)
    d["data"].update(num_clients=10, partition="iid")
    d["algorithm"]["clients_per_round"] = 10
    return C.validate(d)


def test_median_resists_a_sign_flip_attack_that_breaks_fedavg(tmp_path):
    attack = {"kind": "sign_flip", "fraction": 0.2, "scale": 10.0}  # 2 of 10 clients send −10·Δ_i
    broken = run(_iid10(attack=attack), tmp_path / "fedavg", log=lambda m: None, progress=False)
    held = run(_iid10(attack=attack, robust={"aggregator": "median"}), tmp_path / "median", log=lambda m: None,
               progress=False)
    assert broken["attack"]["malicious_count"] == 2
    assert broken["status"] == "diverged" or broken["final_accuracy"] <= 0.3  # chance: 0.25
    assert held["status"] == "completed" and held["final_accuracy"] >= 0.45


# ----------------------------------------------------------------------------- stacked runs

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]


def _sim(fed, executor, attack, robust=None, *, seed=11, gamma=0.8, mode="incremental", global_lr=1.7):
    fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    server = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1, mode=mode) if gamma else None
    alg = make_algorithm("fedavg", LocalTraining(0.1, 8), global_lr, server, robust=robust)
    return Simulator(fm, fed, alg, executor(fm), 4, seed=seed, attack=attack)


def _compare(make_sims, rounds=3, exact=True):
    stacked = StackedSimulator(make_sims())
    states = stacked.initial_states()
    for t in range(rounds):
        states, _ = stacked.round(states, t)
    for r, sim in enumerate(make_sims()):
        alone, _ = run_rounds(sim, rounds)
        a, b = flat_state(states[r]), flat_state(alone)
        for k in a:
            if exact:
                assert torch.equal(a[k], b[k]), f"run {r}: {k} differs"
            else:
                torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-12, msg=f"run {r}: {k}")
    return stacked


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
def test_stacked_runs_with_attacks_and_robust_rules_equal_the_runs_alone(executor, exact):
    fed = random_federation(SIZES, seed=0)
    root = LocalTraining(0.1, 4, steps=2)

    def sims():
        return [_sim(fed, executor, Attack("label_flip", 0.3), Robust("median"), seed=11),
                _sim(fed, executor, Attack("sign_flip", 0.3, scale=3.0), Robust("fltrust", root=root), seed=12),
                _sim(fed, executor, Attack("gaussian", 0.3, noise_std=0.1), Robust("krum"), seed=13, gamma=None),
                _sim(fed, executor, Attack("scale", 0.3), Robust("norm_bound", norm_bound=0.5), seed=14,
                     mode="parallel"),
                _sim(fed, executor, Attack("constant", 0.3, constant=0.01), Robust("trimmed_mean", trim=0.25),
                     seed=15),
                _sim(fed, executor, Attack("sign_flip", 0.3), Robust("median", bucket=3, seed=16), seed=16)]
    stacked = _compare(sims, rounds=4, exact=exact)
    # the label-flipping run trains on its own pool (its malicious clients' samples copied, relabelled)
    flipped = stacked.sims[0].fed
    assert len(flipped.x) > len(fed.x) and stacked.offsets == [0] + [len(flipped.x)] * 5


@pytest.mark.parametrize("robust", [None, Robust("median")])
def test_the_batched_rule_update_of_a_stack_sees_the_attacked_models_and_not_past_a_robust_rule(robust, monkeypatch):
    """The vectorised stack's one vmapped rule update (FedAvg alone) reads what the servers received, the
    malicious clients' attacked models, as each run alone does; with a robust rule it is not taken at all."""
    fed = random_federation(SIZES, seed=0)
    calls = []
    vmapped = StackedSimulator._rule_updates
    monkeypatch.setattr(StackedSimulator, "_rule_updates", lambda self, *a: calls.append(1) or vmapped(self, *a))

    def sims():
        return [_sim(fed, VectorisedExecutor, Attack("sign_flip", 0.4, scale=2.0), robust, seed=s, gamma=None)
                for s in (11, 12)]
    stacked = _compare(sims, rounds=3, exact=False)
    assert stacked.batched_server and bool(calls) == (robust is None)
    assert all(sim.attacked for sim in stacked.sims)


# ----------------------------------------------------------------------------- configuration

@pytest.mark.parametrize("robust,top,fragment", [
    ({"aggregator": "fltrust"}, {"data": {"server_size": 0}}, "robust.aggregator = 'fltrust'"),
    ({"aggregator": "norm_bound"}, {}, "robust.norm_bound = τ > 0"),
    ({"aggregator": "krum", "krum_f": 1}, {}, "S >= f + 3 = 4, got S = 3"),
    ({"aggregator": "multi_krum", "krum_m": 4}, {}, "robust.krum_m = 4: expected at most"),
    ({"aggregator": "trimmed_mean", "trim": 0.5}, {}, "robust.trim = 0.5"),
    ({"aggregator": "mode"}, {}, "robust.aggregator = 'mode'"),
    ({"aggregator": "norm_bound", "norm_bound": 0}, {}, "robust.norm_bound = 0"),
    ({"aggregator": "mean", "bucket": 2}, {}, "robust.bucket = 2 averages the updates in buckets"),
    ({"aggregator": "fltrust", "bucket": 2}, {}, "expected robust.aggregator in median, trimmed_mean, krum"),
    ({"aggregator": "krum", "bucket": 2}, {}, "got ⌈S/s⌉ = 2"),
    ({"aggregator": "bulyan", "krum_f": 1}, {}, "expected algorithm.clients_per_round S >= 4f + 3 = 7, got S = 3"),
    ({"aggregator": "bulyan", "bucket": 2}, {}, "expected robust.aggregator in median, trimmed_mean, krum"),
    ({"aggregator": "median", "bucket": 0}, {}, "robust.bucket = 0"),
])
def test_nonsense_robust_configs_are_one_line(robust, top, fragment):
    d = tiny_config(alg="fedavg", robust=robust)
    for k, v in top.items():
        d[k].update(v)
    with pytest.raises(C.ConfigError) as info:
        C.validate(d)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_krum_with_three_clients_and_the_default_f_validates():
    cfg = C.validate(tiny_config(alg="fedavg", robust={"aggregator": "krum"}))  # S = 3, f = 0: one neighbour
    assert cfg.robust.krum_f is None


# ----------------------------------------------------------------------------- Flower

@pytest.mark.parametrize("aggregator,extra", [
    ("fltrust", {}), ("krum", {}), ("median", {"robust.bucket": 2}),
    ("bulyan", {"algorithm.clients_per_round": 7, "data.num_clients": 7, "data.samples_per_client": 12,
                "robust.krum_f": 1, "rounds": 2}),  # θ = 5 of 7 picked, β = 3 per coordinate; then line 10
])
def test_a_robust_rule_on_flower_equals_the_simulator(aggregator, extra, flower_task_identity):
    """The Flower strategy calls the same server half: FLTrust (its g0 from the server's Simulator), Krum, a
    bucketed median (its bucket order from the run's seed and the round) and Bulyan, then server learning, give
    the simulator's x_T bit for bit."""
    from test_flower import BASE, run_flower, run_simulator
    rc = {**BASE, "robust.aggregator": aggregator, "algorithm.clients_per_round": 3, "rounds": 3, **extra}
    strategy, _ = run_flower(rc)
    expected, _ = run_simulator(rc)
    assert all(torch.equal(strategy.state.x[n], expected.x[n]) for n in expected.x)
