"""Central differential privacy (privacy.*): DP-FedAvg's clipped, noised mean and its accounting.

McMahan, Ramage, Talwar, Zhang, ICLR 2018: Δ̂_t = (Σ_i Δ_i·min(1, C/‖Δ_i‖) + N(0, z²C² I)) / S. The tests
compute clipping and noise by hand on tiny tensors, check where the mechanism sits in the server half (before
the rule, FSL-p and line 10; never bypassed by the stacked engine's batched rule update), ε against the
dp-accounting library called directly and against a published value recomputed independently, the
calibration of z to a target ε, the run's files (metrics.csv's epsilon, summary.json's privacy), the
config's one-line errors, resume and stacking bit for bit.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from conftest import flat_state, max_diff, random_federation, run_rounds, tiny_config

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms.base import ClientResults, RunState, client_weights, deltas, weighted_mean
from fedsl.algorithms.privacy import (
    AdaptiveClipping,
    DifferentialPrivacy,
    clip_factors,
    gaussian_noise,
    next_clip,
    private_update,
    privatize,
    update_noise_multiplier,
    update_norms,
)
from fedsl.algorithms.server_round import ServerSide, _rule_alone, server_update
from fedsl.config.schema import ConfigError, validate
from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]


# ----------------------------------------------------------------------------- the mechanism by hand

def _round():
    """x_t and two clients' models: Δ_0 = (6, 8 | 0) with norm 10, Δ_1 = (0.75, 0 | 1) with norm 1.25
    (parameters "w" of 2 and "b" of 1 coordinates; every number exact in binary)."""
    x = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "b": torch.tensor([3.0], dtype=torch.float64)}
    finals = {"w": torch.tensor([[7.0, 10.0], [1.75, 2.0]], dtype=torch.float64),
              "b": torch.tensor([[3.0], [4.0]], dtype=torch.float64)}
    return x, ClientResults(finals, [30, 50], (3, 5), (4, 9))


def test_clipping_by_hand():
    """C = 2.5: Δ_0 (norm 10) is scaled by 1/4 to (1.5, 2 | 0); Δ_1 (norm 1.25) stays. z = 0, S = 2: Δ̂ is
    their mean (1.125, 1 | 0.5), exactly; every client's model becomes x_t + Δ̂, its id, n_i and K_i kept."""
    x, res = _round()
    d = deltas(x, res.params)
    assert update_norms(d).tolist() == [10.0, 1.25]
    assert clip_factors(update_norms(d), 2.5).tolist() == [0.25, 1.0]
    dp = DifferentialPrivacy(clip=2.5, noise_multiplier=0.0, clients_per_round=2)
    upd = private_update(x, res, dp, seed=0, t=0)
    assert upd["w"].tolist() == [1.125, 1.0] and upd["b"].tolist() == [0.5]
    out = privatize(x, res, dp, seed=0, t=0)
    assert out.params["w"].tolist() == [[2.125, 3.0]] * 2 and out.params["b"].tolist() == [[3.5]] * 2
    assert (out.sizes, out.steps, out.ids) == (res.sizes, res.steps, res.ids)
    # S is the configured clients per round, not the updates that arrived: one of S = 4 arrived -> Σ/4
    one = ClientResults({n: v[1:] for n, v in res.params.items()}, [50], (5,), (9,))
    upd = private_update(x, one, DifferentialPrivacy(2.5, 0.0, 4), seed=0, t=0)
    assert upd["w"].tolist() == [0.1875, 0.0] and upd["b"].tolist() == [0.25]


def test_noise_by_hand_from_the_seed_and_round():
    """z = 2, C = 2.5, S = 2: Δ̂ = clipped mean + (zC/S)·ξ, ξ ~ N(0, I) drawn from rng(seed, t, DP_NOISE), the
    parameters in name order ("b" then "w"); another round or seed draws other noise."""
    x, res = _round()
    dp = DifferentialPrivacy(clip=2.5, noise_multiplier=2.0, clients_per_round=2)
    assert dp.noise_std == 2.5
    g = rng.rng(7, 3, rng.DP_NOISE)
    xi_b, xi_w = g.standard_normal(1) * 2.5, g.standard_normal(2) * 2.5
    upd = private_update(x, res, dp, seed=7, t=3)
    assert upd["w"].tolist() == (np.array([1.125, 1.0]) + xi_w).tolist()
    assert upd["b"].tolist() == (np.array([0.5]) + xi_b).tolist()
    assert not torch.equal(private_update(x, res, dp, seed=7, t=4)["w"], upd["w"])
    assert not torch.equal(private_update(x, res, dp, seed=8, t=3)["w"], upd["w"])
    # float32 models see the same draw, rounded
    x32 = {n: v.float() for n, v in x.items()}
    res32 = ClientResults({n: v.float() for n, v in res.params.items()}, res.sizes, res.steps, res.ids)
    torch.testing.assert_close(private_update(x32, res32, dp, 7, 3)["w"], upd["w"].float(), rtol=1e-6, atol=1e-6)


def test_noise_has_the_standard_deviation_zc_over_s():
    x = {"w": torch.zeros(200_000, dtype=torch.float64)}
    res = ClientResults({"w": torch.zeros(1, 200_000, dtype=torch.float64)}, [1], (1,))
    upd = private_update(x, res, DifferentialPrivacy(clip=0.5, noise_multiplier=1.2, clients_per_round=3), 1, 0)
    assert upd["w"].std().item() == pytest.approx(0.2, rel=0.01) and abs(upd["w"].mean().item()) < 2e-3


def test_with_nothing_clipped_and_no_noise_the_aggregate_is_fedavgs_mean_bit_for_bit():
    x, res = _round()
    upd = private_update(x, res, DifferentialPrivacy(clip=1e9, noise_multiplier=0.0, clients_per_round=2), 0, 0)
    plain = weighted_mean(deltas(x, res.params), client_weights(res.sizes, False))
    assert all(torch.equal(upd[n], plain[n]) for n in plain)


def test_dp_sits_before_the_rule_fslp_and_line_10():
    """A DP round = the plain algorithm's round on the privatized replies: FSL-p's server row joins the
    private aggregate, and line 10 runs from x̄ = x_t + η_g·Δ̂ (server learning on D0 is post-processing)."""
    fed = random_federation(SIZES)
    dp = DifferentialPrivacy(clip=0.3, noise_multiplier=1.5, clients_per_round=4)
    for mode in ("incremental", "parallel"):
        sims = [_sim(fed, privacy=p, mode=mode) for p in (dp, None)]
        st = sims[0].initial_state()
        work = sims[0].sample(0)
        finals, _ = sims[0].train_clients(st, work, 0)
        res = sims[0].results(work, finals, st.x, 0)
        with_dp, _ = server_update(sims[0].alg, st, res, 0, sims[0].server)
        by_hand, _ = server_update(sims[1].alg, st, privatize(st.x, res, dp, sims[0].seed, 0), 0, sims[1].server)
        assert all(torch.equal(with_dp.x[n], by_hand.x[n]) for n in st.x), mode
        plain, _ = server_update(sims[1].alg, st, res, 0, sims[1].server)
        assert max_diff(plain.x, with_dp.x) > 1e-3


def test_adaptive_clipping_by_hand():
    """Andrew et al. 2021 with _round's norms 10 and 1.25, S = 4 (two arrived), γ = 0.5, η_C = 0.2:
    at C_t = 2.5 one is unclipped: b̄ = (1 − 2/2 + σ_b·ξ)/4 + 1/2, C_{t+1} = 2.5·exp(−0.2 (b̄ − 0.5)); σ_b = 0: b̄ = 1/2,
    C stays; at C_t = 20 both: b̄ = 3/4, C shrinks by exp(−0.05); ξ from rng(seed, t, DP_COUNT_NOISE)."""
    x, res = _round()
    dp = DifferentialPrivacy(2.5, 0.0, 4, AdaptiveClipping(0.5, 0.2, 0.0))
    assert next_clip(x, res, dp, 2.5, seed=7, t=3) == 2.5
    assert next_clip(x, res, dp, 20.0, seed=7, t=3) == pytest.approx(20 * math.exp(-0.2 * 0.25), rel=1e-15)
    noisy = DifferentialPrivacy(2.5, 0.0, 4, AdaptiveClipping(0.3, 0.2, 1.5))
    xi = rng.rng(7, 3, rng.DP_COUNT_NOISE).standard_normal()
    assert next_clip(x, res, noisy, 2.5, 7, 3) == pytest.approx(2.5 * math.exp(-0.2 * ((1.5 * xi) / 4 + 0.5 - 0.3)),
                                                                rel=1e-15)
    # the noise multipliers: z_Δ^-2 + (2σ_b)^-2 = z^-2 (z = 1, σ_b = 1: z_Δ = 1/√0.75); σ_b defaults to S/20
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx(1 / math.sqrt(0.75), rel=1e-15)
    assert update_noise_multiplier(0.0, 0.0) == 0.0
    dp = DifferentialPrivacy(2.5, 0.5, 40, AdaptiveClipping())
    assert dp.count_stddev == 2.0 and dp.update_noise_multiplier ** -2 + 4.0 ** -2 == pytest.approx(0.5 ** -2)
    assert DifferentialPrivacy(2.5, 0.0, 40, AdaptiveClipping()).count_stddev == 0.0  # clipping only
    with pytest.raises(ValueError) as e:
        update_noise_multiplier(1.0, 0.5)
    assert "z = 1 needs z < 2·σ_b = 1 (σ_b = privacy.count_stddev, default S/20)" in str(e.value)
    # round t's update: clipped at C_t, noised with z_Δ·C_t/S (the C it clipped with)
    dp = DifferentialPrivacy(10.0, 1.0, 2, AdaptiveClipping(count_stddev=1.0))
    upd = private_update(x, res, dp, 7, 3, clip=2.5)
    noise = gaussian_noise(x, dp.update_noise_multiplier * 2.5 / 2, 7, 3)
    assert upd["w"].tolist() == pytest.approx((torch.tensor([1.125, 1.0], dtype=torch.float64) + noise["w"]).tolist(),
                                              abs=1e-15)


def test_adaptive_clip_norm_carries_from_round_to_round():
    """The server's round clips at the state's C_t (C_0 = privacy.clip at first) and hands C_{t+1} to the next
    state; a round without replies keeps C; a fixed clip leaves RunState.clip None."""
    x, res = _round()
    adaptive = DifferentialPrivacy(2.5, 0.0, 2, AdaptiveClipping(0.5, 0.2, 0.0))
    alg = make_algorithm("fedavg", LocalTraining(0.1, 8), 1.0, None, privacy=adaptive)
    side = ServerSide(4, 0, None, None, seed=7)
    one, _ = server_update(alg, RunState(x), res, 0, side)
    assert one.clip == next_clip(x, res, adaptive, 2.5, 7, 0) == 2.5  # b̄ = (1 − 1)/2 + 1/2 = γ: C stays
    two, _ = server_update(alg, RunState(x, clip=20.0), res, 1, side)  # both unclipped at 20: b̄ = 1
    assert two.clip == pytest.approx(20 * math.exp(-0.2 * 0.5), rel=1e-15)
    assert two.x["w"].tolist() == [1.0 + 3.375, 2.0 + 4.0]  # nothing clipped at 20: x_t + the plain mean
    assert server_update(alg, RunState(x, clip=20.0), None, 1, side)[0].clip == 20.0
    fixed = make_algorithm("fedavg", LocalTraining(0.1, 8), 1.0, None, privacy=DifferentialPrivacy(2.5, 0.0, 2))
    assert server_update(fixed, RunState(x), res, 0, side)[0].clip is None


def test_adaptive_clip_norm_is_checkpointed(tmp_path):
    from fedsl.runs import checkpoint
    x, _ = _round()
    checkpoint.save(tmp_path / "c.pt", checkpoint.Checkpoint(3, RunState(x, clip=0.75)))
    assert checkpoint.load(tmp_path / "c.pt").state.clip == 0.75


# ----------------------------------------------------------------------------- runs

def _sim(fed, privacy=None, name="fsl", seed=11, executor=SequentialExecutor, mode="incremental", gamma=0.8):
    fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    sl = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1, mode=mode) if gamma is not None else None
    alg = make_algorithm(name, LocalTraining(0.1, 8), 1.7, sl, privacy=privacy)
    return Simulator(fm, fed, alg, executor(fm), 4, seed=seed)


def test_huge_clip_and_no_noise_is_fedavg_to_rounding():
    """C = 10^12, z = 0: FedAvg's run, to float64 rounding (not bit for bit: the aggregate Δ̂ is FedAvg's mean
    bit for bit, above, but enters the rule as the models x_t + Δ̂, and (x_t + Δ̂) − x_t rounds); a C that
    clips changes the run."""
    fed = random_federation(SIZES)
    plain, _ = run_rounds(_sim(fed, name="fedavg", gamma=None), 4)
    huge, _ = run_rounds(_sim(fed, DifferentialPrivacy(1e12, 0.0, 4), name="fedavg", gamma=None), 4)
    assert max_diff(plain.x, huge.x) < 1e-13
    clipped, _ = run_rounds(_sim(fed, DifferentialPrivacy(0.05, 0.0, 4), name="fedavg", gamma=None), 4)
    assert max_diff(plain.x, clipped.x) > 1e-3


@pytest.mark.parametrize("executor,exact", [(SequentialExecutor, True), (VectorisedExecutor, False)])
def test_stacked_dp_runs_equal_runs_one_by_one(executor, exact, monkeypatch):
    """Each run draws its own noise (its seed); the stacked engine's one vmapped rule update, which would read
    the clients' raw models, is never taken for a DP run (``_rule_alone``)."""
    fed = random_federation(SIZES)
    dp = DifferentialPrivacy(clip=0.3, noise_multiplier=1.1, clients_per_round=4)

    def sims():
        return [_sim(fed, dp, name="fedavg", gamma=None, seed=s, executor=executor) for s in (1, 2)] + \
            [_sim(fed, DifferentialPrivacy(0.5, 0.7, 4), seed=3, executor=executor)]
    calls = []
    vmapped = StackedSimulator._rule_updates
    monkeypatch.setattr(StackedSimulator, "_rule_updates", lambda self, *a: calls.append(1) or vmapped(self, *a))
    stacked = StackedSimulator(sims())
    states = stacked.initial_states()
    for t in range(3):
        states, _ = stacked.round(states, t)
    assert not calls and not _rule_alone(sims()[0].alg)
    for r, sim in enumerate(sims()):
        alone, _ = run_rounds(sim, 3)
        a, b = flat_state(states[r]), flat_state(alone)
        for k in a:
            if exact:
                assert torch.equal(a[k], b[k]), f"run {r}: {k}"
            else:
                torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-12)
    assert max_diff(states[0].x, states[1].x) > 1e-3  # two seeds, two noises


def _dp_config(rounds=6, **privacy):
    return validate(tiny_config(rounds=rounds, alg="fsl", executor="sequential",
                                privacy=privacy or {"clip": 0.1, "noise_multiplier": 0.3}))


def _rows(path):
    with open(path / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_run_writes_epsilon_per_row_and_the_budget_in_its_summary(tmp_path):
    pytest.importorskip("dp_accounting")
    from fedsl.core import privacy_accounting as pa
    from fedsl.runs.runner import run

    cfg = _dp_config(rounds=3, clip=0.05, target_epsilon=20.0)
    summary = run(cfg, tmp_path / "dp", log=lambda m: None, progress=False)
    rows = _rows(tmp_path / "dp")
    z, q = summary["privacy"]["noise_multiplier"], 3 / 6
    assert [r["round"] for r in rows] == ["0", "1", "2", "3"]
    assert [float(r["epsilon"]) for r in rows] == [0.0] + [pa.epsilon(q, z, t, 1e-5, "rdp") for t in (1, 2, 3)]
    assert 0 < float(rows[1]["epsilon"]) < float(rows[2]["epsilon"]) < float(rows[3]["epsilon"]) <= 20.0
    p = json.loads((tmp_path / "dp" / "summary.json").read_text())["privacy"]
    assert p["epsilon"] == float(rows[-1]["epsilon"]) and p["epsilon"] == pytest.approx(20.0, abs=0.01)
    assert (p["delta"], p["clip"], p["sampling_rate"], p["accountant"], p["rounds"]) == (1e-5, 0.05, 0.5, "rdp", 3)
    assert p["noise_multiplier"] == pa.calibrate(q, 3, 20.0, 1e-5, "rdp")
    assert summary["hyperparameters"]["z"]["source"] == "calibrated to ε = 20 after T rounds"
    # without privacy: an empty column, no budget
    plain = run(validate(tiny_config(rounds=1, alg="fsl", executor="sequential")), tmp_path / "plain",
                log=lambda m: None, progress=False)
    assert "privacy" not in plain and {r["epsilon"] for r in _rows(tmp_path / "plain")} == {""}


def test_resume_with_dp_is_bit_identical(tmp_path):
    pytest.importorskip("dp_accounting")
    from fedsl.runs.results import RunDir
    from fedsl.runs.runner import run

    cfg = _dp_config(rounds=6)
    quiet = {"log": lambda m: None, "progress": False}
    run(cfg, tmp_path / "whole", **quiet)
    run(cfg, tmp_path / "cut", stop_after=3, **quiet)
    run(cfg, tmp_path / "cut", resume=True, **quiet)
    a, b = RunDir(tmp_path / "whole").load_checkpoint(), RunDir(tmp_path / "cut").load_checkpoint()
    assert a.round == b.round == 6 and all(torch.equal(a.state.x[n], b.state.x[n]) for n in a.state.x)
    assert all(torch.isfinite(v).all() for v in a.state.x.values())
    keep = ("round", "accuracy", "loss", "epsilon")
    assert [[r[k] for k in keep] for r in _rows(tmp_path / "whole")] == \
        [[r[k] for k in keep] for r in _rows(tmp_path / "cut")]


@pytest.mark.parametrize("adaptive", [{}, {"privacy.adaptive": True, "privacy.count_stddev": 0.5}])
def test_flower_runs_dp_as_the_simulator(flower_task_identity, adaptive):
    """The Flower strategy goes through the same server half: DP's x_T bit for bit (the noise from the run's
    seed), adaptive clipping's C_t too (z = 0.5 < 2σ_b = 1), and ε after each round in rounds.json's records (the
    same z either way); the ClientApps need no accounting."""
    pytest.importorskip("flwr")
    pytest.importorskip("dp_accounting")
    from test_flower import BASE, run_flower, run_simulator

    rc = {**BASE, "rounds": 3, "privacy.clip": 0.2, "privacy.noise_multiplier": 0.5, **adaptive}
    strategy, _ = run_flower(rc)
    expected, _ = run_simulator(rc)
    assert max_diff(strategy.state.x, expected.x) == 0.0
    assert strategy.state.clip == expected.clip and (expected.clip not in (None, 0.2)) == bool(adaptive)
    budget = strategy.setup.privacy
    assert (budget.q, budget.noise_multiplier, budget.clip) == (0.5, 0.5, 0.2)
    assert [h["epsilon"] for h in strategy.history] == [budget.epsilon(t) for t in (1, 2, 3)]
    plain, _ = run_simulator({**BASE, "rounds": 3})
    assert max_diff(plain.x, expected.x) > 1e-3


def test_a_sweep_over_epsilon_with_non_private_references_reports(tmp_path, monkeypatch):
    """privacy-emnist's layout: DP variants swept over target_epsilon, a non-private variant pinned at
    target_epsilon = inf (one run, not one per ε), drawn by `fedsl report` as a dashed line across the plot."""
    pytest.importorskip("dp_accounting")
    from matplotlib.axes import Axes
    from test_runs import tiny

    from fedsl.cli import main

    lines = []
    real = Axes.axhline
    monkeypatch.setattr(Axes, "axhline", lambda self, y=0, *a, **k: lines.append((y, k.get("label"))) or
                        real(self, y, *a, **k))
    tables = ('\n[sweep]\n"privacy.target_epsilon" = [10.0, 40.0]\n'
              '[variants.FSL-DP]\nprivacy = { clip = 0.05 }\n'
              '[variants.FSL]\nprivacy = { target_epsilon = inf }\n')
    cfg = tmp_path / "dp.toml"
    cfg.write_text(tiny(tmp_path, rounds=2).read_text() + tables)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    runs = json.loads((out / "group.json").read_text())["runs"]
    assert sorted(runs) == ["FSL", "FSL-DP-target_epsilon=10", "FSL-DP-target_epsilon=40"]
    assert "privacy" not in json.loads((out / "FSL" / "summary.json").read_text())
    eps = [json.loads((out / r / "summary.json").read_text())["privacy"]["epsilon"] for r in sorted(runs)[1:]]
    assert eps[0] <= 10.0 < eps[1] <= 40.0
    assert main(["report", str(out)]) == 0
    assert (out / "report" / "sweep.png").stat().st_size > 5_000
    final = json.loads((out / "FSL" / "summary.json").read_text())["final_accuracy"]
    assert (final, "FSL (privacy.target_epsilon = inf)") in lines


# ----------------------------------------------------------------------------- accounting

def _library_epsilon(q, z, steps, delta, kind):
    import dp_accounting as dp
    acc = dp.rdp.RdpAccountant() if kind == "rdp" else dp.pld.PLDAccountant()
    return acc.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(z)), steps).get_epsilon(delta)


def _moments_accountant(q, sigma, steps, delta):
    """ε of the sampled Gaussian mechanism as Abadi et al. (CCS 2016) compute it, written out independently of
    the library: integer orders α = 2..256, RDP(α) = log A_α/(α − 1) with A_α = Σ_k C(α,k)(1−q)^(α−k) q^k
    exp((k²−k)/(2σ²)) (Mironov, Talwar, Zhang 2019, eq. for integer α), ε = min_α T·RDP(α) + log(1/δ)/(α − 1)."""
    from scipy.special import logsumexp

    def rdp(a):
        return logsumexp([math.lgamma(a + 1) - math.lgamma(k + 1) - math.lgamma(a - k + 1) + (a - k) * math.log1p(-q)
                          + k * math.log(q) + (k * k - k) / (2 * sigma ** 2) for k in range(a + 1)]) / (a - 1)
    return min(steps * rdp(a) + math.log(1 / delta) / (a - 1) for a in range(2, 257))


def test_epsilon_is_the_librarys_and_reproduces_abadi_et_al():
    """Abadi et al. (CCS 2016, Section 3.1): q = 0.01, σ = 4, T = 10,000 steps, δ = 10⁻⁵ give ε ≈ 1.26 by the
    moments accountant; our independent recomputation gives 1.2586. The library's RDP accountant converts RDP
    to (ε, δ) more tightly (ε = 1.0355) and PLD more tightly still (0.947)."""
    pytest.importorskip("dp_accounting")
    from fedsl.core import privacy_accounting as pa

    assert _moments_accountant(0.01, 4.0, 10_000, 1e-5) == pytest.approx(1.26, abs=0.005)
    rdp = pa.epsilon(0.01, 4.0, 10_000, 1e-5, "rdp")
    assert rdp == _library_epsilon(0.01, 4.0, 10_000, 1e-5, "rdp") == pytest.approx(1.0355, abs=1e-4)
    assert 0.75 * 1.26 < rdp < 1.26
    pld = pa.epsilon(0.01, 4.0, 10_000, 1e-5, "pld")
    assert pld == _library_epsilon(0.01, 4.0, 10_000, 1e-5, "pld") and 0.9 * rdp < pld < rdp
    # TensorFlow Privacy's MNIST tutorial: q = 256/60,000, z = 1.1, 60 epochs -> ε = 3.01 (moments accountant)
    steps = round(60 * 60_000 / 256)
    assert _moments_accountant(256 / 60_000, 1.1, steps, 1e-5) == pytest.approx(3.01, abs=0.005)
    assert pa.epsilon(256 / 60_000, 1.1, steps, 1e-5) < 3.01


def test_epsilon_grows_with_rounds_and_falls_with_noise():
    """q = 0.01, z = 1.1, δ = 10⁻⁵: ε(10,000 rounds) = 5.632 (RDP), more after more rounds, less with more noise;
    no rounds: 0; no noise: ∞."""
    pytest.importorskip("dp_accounting")
    from fedsl.core import privacy_accounting as pa

    e = [pa.epsilon(0.01, 1.1, t, 1e-5) for t in (1, 1_000, 10_000, 20_000)]
    assert e == sorted(e) and len(set(e)) == 4 and e[2] == pytest.approx(5.632, abs=1e-3)
    z = [pa.epsilon(0.01, s, 10_000, 1e-5) for s in (0.9, 1.1, 1.5, 3.0)]
    assert z == sorted(z, reverse=True) and len(set(z)) == 4
    assert pa.epsilon(0.01, 1.1, 10_000, 1e-6) > e[2]  # a smaller δ costs ε
    assert pa.epsilon(0.01, 1.1, 0, 1e-5) == 0.0 and pa.epsilon(0.01, 0.0, 5, 1e-5) == math.inf


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_calibration_meets_the_target_with_the_least_noise(target):
    pytest.importorskip("dp_accounting")
    from fedsl.core import privacy_accounting as pa

    q, rounds = 10 / 450, 200
    z = pa.calibrate(q, rounds, target, 1e-5)
    eps = pa.epsilon(q, z, rounds, 1e-5)
    assert eps <= target and eps == pytest.approx(target, abs=0.01)
    assert pa.epsilon(q, z - 2 * pa.Z_TOL, rounds, 1e-5) > target  # less noise would not do


def test_pld_calibration_and_the_edges():
    pytest.importorskip("dp_accounting")
    from fedsl.core import privacy_accounting as pa

    z = pa.calibrate(0.1, 20, 2.0, 1e-5, "pld")
    assert pa.epsilon(0.1, z, 20, 1e-5, "pld") <= 2.0 < pa.epsilon(0.1, z - 2 * pa.Z_TOL, 20, 1e-5, "pld")
    assert z < pa.calibrate(0.1, 20, 2.0, 1e-5, "rdp")  # PLD's tighter ε needs less noise
    assert pa.calibrate(0.1, 20, math.inf, 1e-5) == 0.0
    with pytest.raises(pa.CalibrationError, match=r"target_epsilon = 1e\+06: met with noise multiplier z < 0.1"):
        pa.calibrate(0.5, 1, 1e6, 1e-5)
    assert pa.default_delta(450) == 1e-5 and pa.default_delta(100_000) == pytest.approx(100_000 ** -1.1)
    assert all(pa.default_delta(n) < 1 / n for n in (2, 45, 450, 35_000, 10**6))


# ----------------------------------------------------------------------------- configuration

@pytest.mark.parametrize("privacy,message", [
    ({"clip": 1.0}, "privacy.clip = 1.0: expected exactly one of privacy.noise_multiplier = z or "
                    "privacy.target_epsilon = ε, got neither"),
    ({"clip": 1.0, "noise_multiplier": 1.0, "target_epsilon": 2.0}, "got both privacy.noise_multiplier and"),
    ({"noise_multiplier": 1.0}, "privacy.noise_multiplier = 1.0 without privacy.clip: expected privacy.clip = C > 0"),
    ({"target_epsilon": 2.0}, "privacy.target_epsilon = 2.0 without privacy.clip"),
    ({"delta": 1e-6}, "privacy.delta = 1e-06 without privacy.clip"),
    ({"clip": -1.0, "noise_multiplier": 1.0}, "privacy.clip = -1.0: Input should be greater than 0"),
    ({"clip": 1.0, "noise_multiplier": -0.5}, "privacy.noise_multiplier = -0.5: Input should be greater than or equal"),
    ({"clip": 1.0, "target_epsilon": 0.0}, "privacy.target_epsilon = 0.0: Input should be greater than 0"),
    ({"clip": 1.0, "noise_multiplier": 1.0, "delta": 1.0}, "privacy.delta = 1.0: Input should be less than 1"),
    ({"clip": 1.0, "noise_multiplier": 1.0, "accountant": "gdp"}, "privacy.accountant = 'gdp': Input should be"),
])
def test_config_errors_are_one_line(privacy, message):
    with pytest.raises(ConfigError) as err:
        validate(tiny_config(privacy=privacy))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_what_dp_refuses_and_allows():
    base = tiny_config()
    dp = {"clip": 1.0, "noise_multiplier": 1.0}
    for over, message in [({"weighted": True}, "algorithm.weighted = true: expected weighted = false"),
                          ({"name": "feddu"}, "FedDU's γ_t reads the sampled clients' label counts"),
                          ({"name": "qfedavg"}, "q-FedAvg's server step reads each sampled client's F_i(x_t)"),
                          ({"availability": 0.5}, "availability = 0.5: the accountant's sampling rate q = S/N")]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            validate({**base, "algorithm": {**base["algorithm"], **over}, "privacy": dp})
    with pytest.raises(ConfigError, match="with robust.aggregator = 'median': DP-FedAvg's sensitivity C/S is that of"):
        validate({**base, "robust": {"aggregator": "median"}, "privacy": dp})
    for privacy, message in [({"adaptive": True}, "privacy.adaptive = true without privacy.clip: expected"),
                             ({**dp, "target_quantile": 0.3}, "privacy.target_quantile = 0.3 sets adaptive clipping"),
                             ({**dp, "adaptive": True, "target_quantile": 1.0}, "privacy.target_quantile = 1.0")]:
        with pytest.raises(ConfigError) as err:
            validate({**base, "privacy": privacy})
        assert message in str(err.value) and "\n" not in str(err.value)
    # z and the count's σ_b must compose (z < 2σ_b; S = 3: σ_b = 0.15): resolve's budget says so in one line
    from types import SimpleNamespace

    from fedsl.config.resolve import privacy_budget
    pytest.importorskip("dp_accounting")
    with pytest.raises(ConfigError) as err:
        privacy_budget(validate({**base, "privacy": {"clip": 1.0, "noise_multiplier": 0.3, "adaptive": True}}),
                       SimpleNamespace(num_clients=6))
    assert "z = 0.3 needs z < 2·σ_b = 0.3" in str(err.value) and "\n" not in str(err.value)
    budget = privacy_budget(validate({**base, "privacy": {"clip": 1.0, "noise_multiplier": 0.2, "adaptive": True}}),
                            SimpleNamespace(num_clients=6))
    assert budget.record(2)["adaptive_clipping"] == {"initial_clip": 1.0, "target_quantile": 0.5, "clip_lr": 0.2,
                                                     "count_stddev": 0.15,
                                                     "update_noise_multiplier": (0.2 ** -2 - 0.3 ** -2) ** -0.5}
    validate(tiny_config(privacy={"target_epsilon": math.inf}))  # no privacy asked: a sweep's non-private variant
    assert validate(tiny_config()).privacy.enabled is False
    assert validate(tiny_config(privacy={"clip": 2.0, "target_epsilon": math.inf})).privacy.enabled


def test_a_missing_dp_accounting_is_one_line_naming_the_extra(monkeypatch):
    import importlib

    from fedsl.runs.build import check

    real = importlib.import_module

    def without(name, *a, **k):
        if name == "dp_accounting":
            raise ImportError("No module named 'dp_accounting'")
        return real(name, *a, **k)
    monkeypatch.setattr(importlib, "import_module", without)
    with pytest.raises(ConfigError) as err:
        check(_dp_config())
    assert str(err.value) == ("privacy.clip is set: accounting ε needs the dp-accounting package, which is not "
                              "installed here: pip install 'fedsl[privacy]'")
    check(validate(tiny_config()))  # without privacy nothing asks for it


def test_the_noise_stream_is_its_own():
    streams = {k: v for k, v in vars(rng).items() if k.isupper() and isinstance(v, int)}
    assert list(streams.values()).count(rng.DP_NOISE) == 1 and rng.DP_NOISE == 15
    assert list(streams.values()).count(rng.DP_COUNT_NOISE) == 1
