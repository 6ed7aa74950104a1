"""fedsl's server rules against Flower 1.42's Message-API strategies, on identical inputs, round after round.

Each test runs fedsl's server half (``server_round.server_update`` of a ``make_algorithm``: the robust or private
step, then the rule) and Flower's strategy (``configure_train``, then ``aggregate_train`` of reply Messages, as
``Strategy.start`` calls them) on the same client updates Δ_i over several rounds: d = 7 parameters in two arrays
("w" 2×3, "b" 1), float64, 5 clients unless stated, each side applying the Δ_i to its own x_t and keeping its own
state. The comparable setting: Flower averages the clients' models weighted by their "num-examples", fedsl by n_i
with ``algorithm.weighted = true`` (FedAvgM, FedYogi, FedAdagrad) or by the plain mean (Multi-Krum, DP-FedAvg: equal
n_i there); the robust rules and q-FedAvg weigh no client by n_i on either side.

Where they agree (to 1e-12: float64 on values of order 1, the two sides summing in different orders): FedAvgM,
FedYogi, FedAdagrad (β1 = 0, Flower's), Krum, Multi-Krum, trimmed mean, median, q-FedAvg, and Bulyan once Flower's is
given Krum re-run per pick as its selection rule. Where they differ, the tests assert Flower's numbers, so that a
Flower release that changes them is noticed (docs/explanations/algorithms.md, "Where fedsl differs from Flower"):

- FedAdam: Flower scales η by √(1 − β2^(t+1)) / (1 − β1^(t+1)) in round t (0.742 in round 1 at β1 = 0.9,
  β2 = 0.99), a bias correction that Reddi et al.'s Algorithm 2 does not have.
- Adaptive clipping: Flower's server-side wrapper counts the *clipped* updates where Andrew et al.'s rule counts
  the unclipped ones, so its clip norm moves away from the target quantile.
- Bulyan: Flower picks its θ updates by one Krum pass over all of them; El Mhamdi et al. re-run Krum on those left.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.usefixtures("flower_task_identity")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp import strategy as flower  # noqa: E402
from flwr.serverapp.strategy.multikrum import select_multikrum  # noqa: E402

from fedsl.algorithms import SPECS, LocalTraining, make_algorithm  # noqa: E402
from fedsl.algorithms.base import ClientResults, RunState  # noqa: E402
from fedsl.algorithms.privacy import AdaptiveClipping, DifferentialPrivacy  # noqa: E402
from fedsl.algorithms.robust import Robust  # noqa: E402
from fedsl.algorithms.server_round import ServerSide, server_update  # noqa: E402

SHAPES = {"w": (2, 3), "b": (1,)}  # d = 7 in two arrays
SIZES = (10, 30, 20, 40, 25)  # n_i: unequal, so that weighting by n_i is exercised
EQUAL = (20,) * 5
LOCAL = LocalTraining(lr=0.05, batch_size=8)  # η_l: q-FedAvg's L = 1/η_l = 20 (the other rules do not read it)
TOL = 1e-12

Model = dict[str, np.ndarray]


class Nodes:
    """The part of a Grid that ``configure_train`` reads: the connected nodes, 1..S."""

    def __init__(self, s: int):
        self.ids = list(range(1, s + 1))

    def get_node_ids(self) -> list[int]:
        return self.ids


def draw(g: np.random.Generator, scale: float = 1.0) -> Model:
    return {n: g.normal(0.0, scale, shape) for n, shape in SHAPES.items()}


def updates(g: np.random.Generator, s: int = 5, outlier: bool = False) -> list[Model]:
    """One round's Δ_i: N(0.05, 0.1²) per coordinate, client i's scaled by 1 + i/2 (and the last ×20: ``outlier``)."""
    out = []
    for i in range(s):
        d = {n: 0.05 + (1 + i / 2) * v for n, v in draw(g, 0.1).items()}
        if outlier and i == s - 1:
            d = {n: 20 * v for n, v in d.items()}
        out.append(d)
    return out


def record(m: Model) -> ArrayRecord:
    return ArrayRecord({n: Array(np.array(v)) for n, v in m.items()})


def numpy_of(rec: ArrayRecord) -> Model:
    return {n: rec[n].numpy() for n in SHAPES}


def plus(x: Model, d: Model) -> Model:
    return {n: x[n] + d[n] for n in SHAPES}


def flower_round(strategy, t: int, x: ArrayRecord, deltas: list[Model], sizes, extra=None) -> ArrayRecord:
    """Round t of a Flower strategy from its model ``x``: the messages it configures, each answered by its node
    (node i + 1 sends x + Δ_i, n_i and ``extra[i]``), then its aggregate, as ``Strategy.start`` runs a round."""
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(t, x, ConfigRecord(), Nodes(len(deltas)))}
    assert sorted(sent) == list(range(1, len(deltas) + 1))
    base = numpy_of(x)
    replies = [Message(RecordDict({"arrays": record(plus(base, d)),
                                   "metrics": MetricRecord({"num-examples": n, **(extra[i] if extra else {})})}),
                       reply_to=sent[i + 1])
               for i, (d, n) in enumerate(zip(deltas, sizes))]
    arrays, _ = strategy.aggregate_train(t, replies)
    return arrays


def fedsl_round(alg, state: RunState, t: int, deltas: list[Model], sizes, losses=()) -> RunState:
    """Round t of fedsl's server half from ``state``: the clients' models x_t + Δ_i (ids 0..S−1, one step each)."""
    x = {n: v.numpy() for n, v in state.x.items()}
    finals = {n: torch.from_numpy(np.stack([x[n] + d[n] for d in deltas])) for n in SHAPES}
    res = ClientResults(finals, list(sizes), (1,) * len(deltas), tuple(range(len(deltas))),
                        {"start_loss": torch.tensor(losses, dtype=torch.float64)} if losses else {})
    new, _ = server_update(alg, state, res, t, ServerSide(len(deltas), 0, None, None))
    return new


def start(alg, x0: Model) -> RunState:
    x = {n: torch.from_numpy(v.copy()) for n, v in x0.items()}
    return RunState(x, alg.rule.init_server_state(x))


def diff(fl: ArrayRecord, st: RunState) -> float:
    """max |Flower's x − fedsl's x| over the 7 coordinates."""
    return max(float(np.abs(fl[n].numpy() - st.x[n].numpy()).max()) for n in SHAPES)


def run_both(alg, strategy, rounds: int, seed: int, sizes=SIZES, s: int = 5, outlier=False, losses=None):
    """``rounds`` rounds of both on the same Δ_i; the largest gap of each round."""
    g = np.random.default_rng(seed)
    x0 = draw(g)
    st, fl, gaps = start(alg, x0), record(x0), []
    for t in range(1, rounds + 1):
        deltas = updates(g, s, outlier)
        loss = losses(g, s) if losses else ()
        extra = [{"train_loss": f} for f in loss] if losses else None
        fl = flower_round(strategy, t, fl, deltas, sizes, extra)
        st = fedsl_round(alg, st, t - 1, deltas, sizes, loss)
        gaps.append(diff(fl, st))
    return gaps


def algorithm(name: str, global_lr: float | None, weighted: bool = False, **kw):
    return make_algorithm(name, LOCAL, global_lr, None, weighted=weighted, **kw)


# ----------------------------------------------------------------------------- where they agree

def test_fedavgm_agrees_with_flower():
    """v ← β v + Δ_t, x ← x + η_g v (Flower: pseudo-gradient −Δ_t, its momentum from round 1), η_g = 0.5, β = 0.9."""
    alg = algorithm("fedavgm", 0.5, weighted=True, momentum=0.9)
    gaps = run_both(alg, flower.FedAvgM(server_learning_rate=0.5, server_momentum=0.9), 5, seed=1)
    assert max(gaps) < TOL, gaps


def test_fedyogi_agrees_with_flower_at_the_shared_defaults():
    """Reddi et al.'s Algorithm 2 with Yogi's v, no bias correction on either side; fedsl's defaults are Flower's."""
    defaults = SPECS["fedyogi"].defaults()
    theirs = flower.FedYogi()
    assert (SPECS["fedyogi"].global_lr, defaults["beta1"], defaults["beta2"], defaults["tau"]) == (
        theirs.eta, theirs.beta_1, theirs.beta_2, theirs.tau) == (0.01, 0.9, 0.99, 1e-3)
    alg = algorithm("fedyogi", 0.01, weighted=True)
    gaps = run_both(alg, flower.FedYogi(), 5, seed=2)
    assert max(gaps) < TOL, gaps


def test_fedadagrad_with_beta1_zero_agrees_with_flower():
    """Flower's FedAdagrad fixes β1 = 0 (m_t = Δ_t): fedsl's with ``algorithm.beta1 = 0`` is it."""
    alg = algorithm("fedadagrad", 0.1, weighted=True, beta1=0.0, tau=1e-3)
    gaps = run_both(alg, flower.FedAdagrad(eta=0.1, tau=1e-3), 5, seed=3)
    assert max(gaps) < TOL, gaps


@pytest.mark.parametrize("s", [5, 6])
@pytest.mark.parametrize("rule", ["krum", "multi_krum", "trimmed_mean", "median"])
def test_robust_rules_agree_with_flower(rule, s):
    """Krum and Multi-Krum (f = 1: S' − f − 2 neighbours; Multi-Krum's m = 3, the plain mean, so equal n_i), the
    β = 0.2-trimmed mean (⌊0.2·S'⌋ = 1 cut at each end) and the coordinate-wise median (S' = 6: the mean of the two
    middle values), one client's update 20 times the others'; fedsl's robust Δ̂ then FedAvg's x_t + Δ̂ (η_g = 1)."""
    robust, strategy = {
        "krum": (Robust("krum", krum_f=1), lambda: flower.Krum(num_malicious_nodes=1)),
        "multi_krum": (Robust("multi_krum", krum_f=1, krum_m=3),
                       lambda: flower.MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3)),
        "trimmed_mean": (Robust("trimmed_mean", trim=0.2), lambda: flower.FedTrimmedAvg(beta=0.2)),
        "median": (Robust("median"), lambda: flower.FedMedian()),
    }[rule]
    sizes = (20,) * s if rule == "multi_krum" else (SIZES + (15,))[:s]
    gaps = run_both(algorithm("fedavg", 1.0, robust=robust), strategy(), 4, seed=4, sizes=sizes, s=s, outlier=True)
    assert max(gaps) < TOL, gaps


def test_multi_krum_weighs_its_picks_by_examples_in_flower():
    """With unequal n_i Flower's Multi-Krum averages its m picks weighted by n_i; Blanchard et al.'s (fedsl's) is their
    plain mean: a departure only where the n_i differ."""
    alg = algorithm("fedavg", 1.0, robust=Robust("multi_krum", krum_f=1, krum_m=3))
    gaps = run_both(alg, flower.MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3), 1, seed=4, outlier=True)
    assert gaps[0] > 1e-3, gaps


def test_qfedavg_agrees_with_flower():
    """Li et al.'s Algorithm 2 with q = 0.5 (and Flower's default 0.1), L = 1/η_l = 20, each client's F_k the same
    number on both sides (fedsl's reply metric ``start-loss``, Flower's ``train_loss``)."""
    for q in (0.5, 0.1):
        alg = algorithm("qfedavg", None, q=q)
        strategy = flower.QFedAvg(client_learning_rate=LOCAL.lr, q=q)
        gaps = run_both(alg, strategy, 3, seed=5, losses=lambda g, s: [float(v) for v in g.uniform(0.2, 3.0, s)])
        assert max(gaps) < TOL, (q, gaps)


# ----------------------------------------------------------------------------- where they differ

def test_flowers_fedadam_scales_eta_by_a_bias_correction():
    """Flower's FedAdam steps η_t = η·√(1 − β2^(t+1)) / (1 − β1^(t+1)) in round t; Reddi et al.'s Algorithm 2 (fedsl)
    steps η. m_t and v_t are the same on both sides (the same Δ_t), so each round's step x_{t+1} − x_t of Flower's is
    fedsl's times that factor: 0.742, 0.636, 0.577, 0.541, 0.516 in rounds 1-5 at η = 0.1, β1 = 0.9, β2 = 0.99,
    τ = 10⁻³ (Flower's defaults, fedsl's); fedsl run with η_g = η_t round by round is Flower's, to 1e-12."""
    rounds, eta, b1, b2 = 5, 0.1, 0.9, 0.99
    factors = [math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1)) for t in range(1, rounds + 1)]
    assert [round(c, 3) for c in factors] == [0.742, 0.636, 0.577, 0.541, 0.516]
    g = np.random.default_rng(6)
    x0 = draw(g)
    strategy = flower.FedAdam()
    assert (strategy.eta, strategy.beta_1, strategy.beta_2, strategy.tau) == (eta, b1, b2, 1e-3)
    paper = algorithm("fedadam", eta, weighted=True)
    assert (paper.rule.beta1, paper.rule.beta2, paper.rule.tau) == (b1, b2, 1e-3)
    st, fl = start(paper, x0), record(x0)
    scaled = start(paper, x0)
    for t, c in enumerate(factors, 1):
        deltas = updates(g)
        before_fl, before_st = numpy_of(fl), {n: v.numpy().copy() for n, v in st.x.items()}
        fl = flower_round(strategy, t, fl, deltas, SIZES)
        st = fedsl_round(paper, st, t - 1, deltas, SIZES)
        for n in SHAPES:
            ratio = (fl[n].numpy() - before_fl[n]) / (st.x[n].numpy() - before_st[n])
            assert np.allclose(ratio, c, rtol=1e-9, atol=0), (t, n, ratio)
        scaled = fedsl_round(algorithm("fedadam", eta * c, weighted=True), scaled, t - 1, deltas, SIZES)
        assert diff(fl, scaled) < TOL


def _clip_runs(rounds: int) -> tuple[list[float], list[float], float]:
    """Adaptive clipping over ``rounds`` rounds: 5 clients whose updates have norms 0.6, 0.8, 1.1, 1.4 and 2.0 (random
    directions, a new draw each round), C_0 = 1, γ = 0.5, η_C = 0.2, z = 0 (no noise on the update or the count), equal
    n_i. Returns Flower's C_t, fedsl's C_t, and the gap of the two models after round 1 (both clipped at C_0)."""
    g = np.random.default_rng(7)
    x0 = draw(g)
    dp = DifferentialPrivacy(clip=1.0, noise_multiplier=0.0, clients_per_round=5,
                             adaptive=AdaptiveClipping(target_quantile=0.5, lr=0.2))
    alg = algorithm("fedavg", 1.0, privacy=dp)
    strategy = flower.DifferentialPrivacyServerSideAdaptiveClipping(
        flower.FedAvg(), noise_multiplier=0.0, num_sampled_clients=5, initial_clipping_norm=1.0,
        target_clipped_quantile=0.5, clip_norm_lr=0.2)
    st, fl, flower_c, fedsl_c, first = start(alg, x0), record(x0), [], [], None
    for t in range(1, rounds + 1):
        deltas = []
        for norm in (0.6, 0.8, 1.1, 1.4, 2.0):
            d = draw(g)
            length = math.sqrt(sum(float((v ** 2).sum()) for v in d.values()))
            deltas.append({n: v * norm / length for n, v in d.items()})
        fl = flower_round(strategy, t, fl, deltas, EQUAL)
        st = fedsl_round(alg, st, t - 1, deltas, EQUAL)
        flower_c.append(strategy.clipping_norm)
        fedsl_c.append(st.clip)
        first = diff(fl, st) if first is None else first
    return flower_c, fedsl_c, first


def test_flowers_adaptive_clip_moves_away_from_the_target_quantile():
    """Andrew et al. 2021, Algorithm 1: C ← C·exp(−η_C (b̄ − γ)), b̄ the fraction of updates with norm ≤ C. Flower's
    DifferentialPrivacyServerSideAdaptiveClipping puts the fraction *clipped* in b̄'s place. With γ = 0.5 and the median
    norm 1.1 (``_clip_runs``): the paper's C rises by e^0.02 a round while 2 of 5 updates fit (b̄ = 0.4) and settles
    about the median, 1.083 after 6 rounds (e^0.08) and within [1.08, 1.11] from then on; Flower's falls by e^−0.02 a
    round (3 of 5 clipped), 0.887 after 6 rounds (e^−0.12), and keeps falling as more are clipped, 0.159 after 30
    (e^−1.84). Round 1 clips at C_0 on both sides: the same model."""
    flower_c, fedsl_c, first = _clip_runs(30)
    assert first < TOL
    assert fedsl_c[5] == pytest.approx(math.exp(0.08), rel=1e-12)
    assert flower_c[5] == pytest.approx(math.exp(-0.12), rel=1e-12)
    assert flower_c[-1] == pytest.approx(math.exp(-1.84), rel=1e-12)
    assert all(1.08 < c < 1.11 for c in fedsl_c[5:])
    assert all(b < a for a, b in zip(flower_c, flower_c[1:]))  # down every round, away from the median norm


def _bulyan_round() -> tuple[list[Model], Model]:
    """15 updates in d = 7: 12 honest ones N(0.5, 0.1²) per coordinate and 3 colluding ones N(−1, 0.01²); and x_t."""
    g = np.random.default_rng(8)
    honest = [{n: 0.5 + v for n, v in draw(g, 0.1).items()} for _ in range(12)]
    byzantine = [{n: -1.0 + v for n, v in draw(g, 0.01).items()} for _ in range(3)]
    return honest + byzantine, draw(g)


def _krum_per_pick(contents: list[RecordDict], f: int, theta: int) -> list[RecordDict]:
    """El Mhamdi et al.'s selection as a Flower ``selection_rule``: θ times, Flower's Krum (one pick) on those left."""
    left, picked = list(contents), []
    for _ in range(theta):
        best = select_multikrum(left, f, 1)[0]
        picked.append(best)
        left = [c for c in left if c is not best]
    return picked


def test_flowers_bulyan_picks_by_one_krum_pass():
    """Bulyan (El Mhamdi et al., ICML 2018) with S' = 15, f = 3 (θ = 9 picks, β = 3 values a coordinate), on
    ``_bulyan_round``. Krum re-run per pick (the paper; fedsl) takes 8 honest updates, then a colluding one: with 7 left
    each scores its S' − f − 2 = 2 nearest, which for a colluder are the other two. One pass over all 15 (Flower) scores
    10 neighbours each and takes 9 honest ones. The coordinate-wise step then drops the colluder's values (both
    aggregates lie within the honest updates' range), yet its median moves and the two aggregates differ by up to 0.205
    in a coordinate (honest spread 0.1); Flower's Bulyan given the per-pick rule is fedsl's, to 1e-12."""
    deltas, x = _bulyan_round()
    sizes = (20,) * 15

    def replies() -> list[RecordDict]:
        return [RecordDict({"arrays": record(plus(x, d)), "metrics": MetricRecord({"num-examples": 20, "id": i})})
                for i, d in enumerate(deltas)]

    one_pass = sorted(int(c["metrics"]["id"]) for c in select_multikrum(replies(), 3, 9))
    per_pick = sorted(int(c["metrics"]["id"]) for c in _krum_per_pick(replies(), 3, 9))
    assert one_pass != per_pick
    assert all(i < 12 for i in one_pass) and sum(i >= 12 for i in per_pick) == 1

    alg = algorithm("fedavg", 1.0, robust=Robust("bulyan", krum_f=3))
    ours = fedsl_round(alg, start(alg, x), 0, deltas, sizes)
    paper = flower_round(flower.Bulyan(num_malicious_nodes=3, selection_rule=_krum_per_pick), 1, record(x), deltas,
                         sizes)
    assert diff(paper, ours) < TOL
    theirs = flower_round(flower.Bulyan(num_malicious_nodes=3), 1, record(x), deltas, sizes)
    for agg in (theirs, paper):  # x_t + Δ̂, Δ̂ within the honest Δ_i coordinate by coordinate
        for n in SHAPES:
            honest = np.stack([d[n] for d in deltas[:12]])
            step = agg[n].numpy() - x[n]
            assert (honest.min(0) <= step + TOL).all() and (step <= honest.max(0) + TOL).all()
    assert diff(theirs, ours) == pytest.approx(0.205, abs=5e-4)
