"""Robust server rules: the round's client updates through a Byzantine-robust aggregate, before any rule's mean.

One pure step, ``robust_results(x_t, results, robust, g0)``, between the clients' replies and the rule's
server update (``server_round.aggregate``). It reads the updates Δ_i = x_i − x_t and returns the replies
with every client's model replaced by x_t + Δ̂, Δ̂ the robust aggregate, ids, sizes and K_i kept. Whatever
mean the rule then takes of the Δ_i (FedAvg's x̄ = x_t + η_g·Σ_i w_i Δ_i, weighted or not; SCAFFOLD's;
FedAdam's pseudo-gradient) is then Δ̂, and line 10 (server learning on D0) runs after it unchanged.

Aggregators (``robust.aggregator``; S' = the replies that reached the server, d = the model's size):

- ``median``: coordinate-wise median of the Δ_i (Yin, Chen, Ramchandran & Bartlett, "Byzantine-robust
  distributed learning: towards optimal statistical rates", ICML 2018); for an even S' the mean of the
  two middle values. O(S' d log S').
- ``trimmed_mean``: coordinate-wise β-trimmed mean (Yin et al. 2018): drop the k = ⌊β·S'⌋ largest and k
  smallest values of each coordinate, average the S' − 2k others. O(S' d log S').
- ``krum``, ``multi_krum``: Blanchard, El Mhamdi, Guerraoui & Stainer, "Machine learning with adversaries:
  Byzantine tolerant gradient descent", NeurIPS 2017: score(i) = Σ of the squared distances ‖Δ_i − Δ_j‖²
  to its S' − f − 2 nearest other updates (f = assumed Byzantine count); Krum takes the Δ_i of the lowest
  score, Multi-Krum the plain mean of the m lowest. O(S'² d).
- ``bulyan``: El Mhamdi, Guerraoui & Rouault, "The hidden vulnerability of distributed learning in Byzantium",
  ICML 2018: Krum (with f) picks an update from the remaining ones, which leaves them, θ = S' − 2f times; then
  each coordinate is the mean of the β = θ − 2f of the θ picked values closest to their median. It needs
  S' ≥ 4f + 3 (f: ``robust.krum_f``, default ⌊(S' − 3)/4⌋, at least 0, the largest f it tolerates; Flower's
  Bulyan defaults to f = 0). A round with fewer replies than 4f + 3 (stragglers dropped, availability) runs
  with the largest f its S' allows, ⌊(S' − 3)/4⌋, as Krum clamps its neighbours; at f = 0 Bulyan is the mean.
  O(S'³ d).
- ``norm_bound``: each Δ_i clipped to norm τ, Δ_i · min(1, τ/‖Δ_i‖) (Sun, Kairouz, Suresh & McMahan,
  "Can you really backdoor federated learning?", arXiv:1911.07963, 2019), then the rule's own mean: the
  one aggregator that keeps a row per client (the clipped Δ_i), so weighted means stay weighted. O(S' d).
- ``fltrust``: Cao, Fang, Liu & Gong, "FLTrust: Byzantine-robust federated learning via trust
  bootstrapping", NDSS 2021 (its Algorithm 1): the server's own update g0 on D0 from x_t (``root``);
  trust scores TS_i = ReLU(cos(Δ_i, g0)); each Δ_i rescaled to ‖g0‖, Δ̄_i = (‖g0‖/‖Δ_i‖)·Δ_i;
  Δ̂ = Σ_i TS_i Δ̄_i / Σ_i TS_i, and Δ̂ = 0 when every TS_i is 0 (or g0 = 0). O(S' d) plus g0's local steps.

Bucketing (``robust.bucket`` = s > 1; Karimireddy, He & Jaggi, "Byzantine-robust learning on heterogeneous
datasets via bucketing", ICLR 2022, Algorithm 1): before median, trimmed_mean, krum or multi_krum, the S'
updates are put in a random order (drawn from (seed, t), so a resumed run draws it again) and averaged in
consecutive buckets of s, the last one smaller when s does not divide S'; the rule then runs on the ⌈S'/s⌉
bucket means. Averaging shrinks the honest clients' disagreement, which those rules mistake for an attack on
non-IID data, while a Byzantine update still moves at most one bucket per s clients (its weight 1/s).

Norms, distances and cosines are over the whole model (all parameters flattened into one vector of d).
A zero update Δ_i = 0 has cosine 0 with g0 (no trust) and is not rescaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedsl.algorithms.base import ClientResults, LocalTraining
from fedsl.core import rng
from fedsl.core.types import Params

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_bound", "fltrust")
BUCKETED = ("median", "trimmed_mean", "krum", "multi_krum")  # the rules that robust.bucket > 1 may precede
# robust.KEY -> the rules that read it (another rule's, changed, is refused by the config: it would change nothing);
# robust.bucket is checked with the run's S, whose buckets it counts
READS = {"trim": ("trimmed_mean",), "krum_f": ("krum", "multi_krum", "bulyan"), "krum_m": ("multi_krum",),
         "norm_bound": ("norm_bound",), "trust_lr": ("fltrust",), "trust_steps": ("fltrust",)}


@dataclass(frozen=True)
class Robust:
    """A robust server rule (see the module docstring).

    Attributes:
        aggregator: one of ``AGGREGATORS``; "mean" is the rule's own aggregation (no robust step).
        trim: β of trimmed_mean, in [0, 0.5).
        krum_f: f, the Byzantine count Krum and Bulyan assume (None: Krum's ⌊(S' − 3)/2⌋, at least 0, the largest
            f with S' > 2f + 2, Blanchard et al.'s condition; Bulyan's ⌊(S' − 3)/4⌋, the largest with S' ≥ 4f + 3).
        krum_m: m, the updates Multi-Krum averages (None: S' − f).
        norm_bound: τ of norm_bound.
        root: FLTrust's server update g0: LocalSGD on D0 with this schedule (η, B, K) from x_t.
        bucket: s, the updates averaged per bucket before a rule of ``BUCKETED`` (1: no bucketing).
        seed: the run's seed, from which round t's bucket order is drawn (``rng.BUCKETS``).
    """

    aggregator: str = "mean"
    trim: float = 0.1
    krum_f: int | None = None
    krum_m: int | None = None
    norm_bound: float | None = None
    root: LocalTraining | None = None
    bucket: int = 1
    seed: int = 0

    @property
    def active(self) -> bool:
        """Whether there is a robust step at all ("mean": the rule's own aggregation, today's arithmetic)."""
        return self.aggregator != "mean"


# ----------------------------------------------------------------------------- flat updates

def flat_deltas(x: Params, finals: Params) -> torch.Tensor:
    """The updates Δ_i = x_i − x_t as rows of one [S, d] matrix (parameters in ``x``'s order, flattened)."""
    return torch.cat([(finals[n] - p).reshape(finals[n].shape[0], -1) for n, p in x.items()], dim=1)


def unflatten(vec: torch.Tensor, x: Params) -> Params:
    """[..., d] back to parameters shaped as ``x``'s (leading dimensions kept)."""
    out, at = {}, 0
    for n, p in x.items():
        out[n] = vec[..., at:at + p.numel()].reshape((*vec.shape[:-1], *p.shape))
        at += p.numel()
    return out


# ----------------------------------------------------------------------------- aggregators on [S, d]

def bucket_count(s: int, size: int) -> int:
    """⌈S'/s⌉: the rows a bucketed rule sees (Krum's f and m count these)."""
    return -(-s // size)


def bucket_means(deltas: torch.Tensor, size: int, order: torch.Tensor) -> torch.Tensor:
    """The means of consecutive buckets of ``size`` rows of ``deltas[order]`` [S, d] -> [⌈S/size⌉, d]; the last
    bucket holds the S mod size rows left over, if any (Karimireddy et al., ICLR 2022, Algorithm 1)."""
    shuffled = deltas[order]
    return torch.stack([shuffled[i:i + size].mean(dim=0) for i in range(0, shuffled.shape[0], size)])


def bucket_order(seed: int, t: int, s: int) -> torch.Tensor:
    """Round t's random order of the S' updates before bucketing, drawn from (seed, t) alone."""
    return torch.from_numpy(rng.rng(seed, t, rng.BUCKETS).permutation(s))


def median(deltas: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of the rows of ``deltas`` [S, d] (an even S: the mean of the two middle values)."""
    s = deltas.shape[0]
    ordered = deltas.sort(dim=0).values
    return (ordered[(s - 1) // 2] + ordered[s // 2]) / 2


def trimmed_mean(deltas: torch.Tensor, trim: float) -> torch.Tensor:
    """Coordinate-wise β-trimmed mean: each coordinate's k = ⌊β·S⌋ largest and k smallest values dropped.

    Args:
        deltas: the updates Δ_i as rows [S, d].
        trim: β in [0, 0.5) (S − 2k ≥ 1 always).
    """
    s = deltas.shape[0]
    k = math.floor(trim * s + 1e-9)  # the guard: β·S a rounding error below an integer (0.29·100) still floors to it
    return deltas.sort(dim=0).values[k:s - k].mean(dim=0)


def default_krum_f(s: int) -> int:
    """Krum's f when ``robust.krum_f`` is unset: the largest f with S' > 2f + 2, i.e. ⌊(S' − 3)/2⌋, at least 0."""
    return max(0, (s - 3) // 2)


def krum_neighbours(s: int, f: int) -> int:
    """How many nearest updates a Krum score sums: S' − f − 2, clamped to [1, S' − 1] (fewer replies than
    the config's S, e.g. with stragglers, may leave S' − f − 2 < 1; one reply: 0, its score is 0)."""
    return max(1, min(s - f - 2, s - 1)) if s > 1 else 0


def krum_scores(deltas: torch.Tensor, f: int) -> torch.Tensor:
    """score(i) = Σ of ‖Δ_i − Δ_j‖² over the ``krum_neighbours(S', f)`` nearest j ≠ i (Blanchard et al. 2017).

    Args:
        deltas: the updates Δ_i as rows [S', d].
        f: the assumed Byzantine count.
    Returns:
        the scores [S'] (float64).
    """
    s = deltas.shape[0]
    k = krum_neighbours(s, f)
    d = deltas.double()
    dist = torch.stack([((d - d[i]) ** 2).sum(dim=1) for i in range(s)])  # [S', S'], a row at a time: S'·d memory
    dist.fill_diagonal_(float("inf"))  # a client is not its own neighbour
    return dist.sort(dim=1).values[:, :k].sum(dim=1) if k else torch.zeros(s, dtype=torch.float64)


def krum_select(scores: torch.Tensor, m: int) -> torch.Tensor:
    """The m clients of lowest score, in increasing score (ties: the lower row first)."""
    return torch.argsort(scores, stable=True)[:m]


def krum(deltas: torch.Tensor, f: int, m: int = 1) -> torch.Tensor:
    """Krum (m = 1): the update of lowest score; Multi-Krum: the plain mean of the m lowest."""
    chosen = krum_select(krum_scores(deltas, f), m)
    return deltas[chosen].mean(dim=0)


def default_bulyan_f(s: int) -> int:
    """Bulyan's f when ``robust.krum_f`` is unset: the largest f with S' ≥ 4f + 3, i.e. ⌊(S' − 3)/4⌋, at least 0."""
    return max(0, (s - 3) // 4)


def bulyan(deltas: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan (El Mhamdi et al., ICML 2018): θ = S' − 2f updates picked one at a time by Krum with f from those not
    yet picked (lowest score; ties: the lower row); each coordinate of Δ̂ the mean of the β = θ − 2f picked values
    closest to the picked values' median (ties: the earlier pick).

    Args:
        deltas: the updates Δ_i as rows [S', d].
        f: the assumed Byzantine count.
    Raises:
        ValueError: S' < 4f + 3, in one line naming both.
    """
    s = deltas.shape[0]
    if s < 4 * f + 3:
        raise ValueError(f"robust.aggregator = 'bulyan' with f = {f} needs S' >= 4f + 3 = {4 * f + 3} updates, "
                         f"got {s}")
    theta, beta = s - 2 * f, s - 4 * f
    left, picked = list(range(s)), []
    for _ in range(theta):
        picked.append(left.pop(int(krum_select(krum_scores(deltas[left], f), 1)[0])))
    chosen = deltas[picked]  # [θ, d], in the order picked
    closest = (chosen - median(chosen)).abs().argsort(dim=0, stable=True)[:beta]  # [β, d]
    return chosen.gather(0, closest).mean(dim=0)


def clip(deltas: torch.Tensor, tau: float) -> torch.Tensor:
    """Each row Δ_i · min(1, τ/‖Δ_i‖): updates longer than τ cut to norm τ (Sun et al. 2019)."""
    norms = deltas.norm(dim=1, keepdim=True)
    return deltas * torch.clamp(tau / norms.clamp_min(torch.finfo(deltas.dtype).tiny), max=1.0)


def trust_scores(deltas: torch.Tensor, g0: torch.Tensor) -> torch.Tensor:
    """FLTrust's TS_i = ReLU(cos(Δ_i, g0)) (0 where Δ_i or g0 is zero)."""
    norms = deltas.norm(dim=1) * g0.norm()
    cos = torch.where(norms > 0, deltas @ g0 / norms.clamp_min(torch.finfo(deltas.dtype).tiny),
                      torch.zeros_like(norms))
    return torch.relu(cos)


def fltrust(deltas: torch.Tensor, g0: torch.Tensor) -> torch.Tensor:
    """FLTrust's Δ̂ = Σ_i TS_i·(‖g0‖/‖Δ_i‖)·Δ_i / Σ_i TS_i (Cao et al., NDSS 2021, Algorithm 1); 0 when Σ TS_i = 0.

    Args:
        deltas: the clients' updates Δ_i as rows [S', d].
        g0: the server's update on its root data D0, from the same x_t [d].
    """
    ts = trust_scores(deltas, g0)
    total = ts.sum()
    if not total > 0:
        return torch.zeros_like(g0)
    norms = deltas.norm(dim=1)
    rescale = torch.where(norms > 0, g0.norm() / norms.clamp_min(torch.finfo(deltas.dtype).tiny),
                          torch.zeros_like(norms))
    return ((ts * rescale) @ deltas) / total


# ----------------------------------------------------------------------------- the step

def robust_delta(robust: Robust, deltas: torch.Tensor, g0: torch.Tensor | None = None, t: int = 0) -> torch.Tensor:
    """The robust aggregate Δ̂ [d] of the updates ``deltas`` [S', d], or for norm_bound the clipped rows [S', d];
    ``t``: the round, which draws the bucket order when ``robust.bucket`` > 1."""
    kind = robust.aggregator
    if robust.bucket > 1 and kind in BUCKETED:  # Krum's f, m and the checks below count buckets, not clients
        deltas = bucket_means(deltas, robust.bucket, bucket_order(robust.seed, t, deltas.shape[0]))
    s = deltas.shape[0]
    if kind == "median":
        return median(deltas)
    if kind == "trimmed_mean":
        return trimmed_mean(deltas, robust.trim)
    if kind in ("krum", "multi_krum"):
        f = robust.krum_f if robust.krum_f is not None else default_krum_f(s)
        m = 1 if kind == "krum" else min(s, robust.krum_m) if robust.krum_m is not None else max(1, s - f)
        return krum(deltas, f, m)
    if kind == "bulyan":  # f of the config, or the largest this round's S' allows (module docstring)
        f = min(robust.krum_f, default_bulyan_f(s)) if robust.krum_f is not None else default_bulyan_f(s)
        return bulyan(deltas, f)
    if kind == "norm_bound":
        assert robust.norm_bound is not None, "norm_bound needs τ (config validation checks it)"
        return clip(deltas, robust.norm_bound)
    if kind == "fltrust":
        assert g0 is not None, "fltrust needs the server's update g0 (server_round.aggregate passes it)"
        return fltrust(deltas, g0)
    raise ValueError(f"robust.aggregator = {kind!r}: expected one of {', '.join(AGGREGATORS)}")


def robust_results(x: Params, results: ClientResults, robust: Robust, root: Params | None = None,
                   t: int = 0) -> ClientResults:
    """The round's replies with every client's model x_t + Δ̂ (norm_bound: x_t + its clipped Δ_i), so that
    any rule's mean of the updates is the robust aggregate (see the module docstring).

    Args:
        x: x_t, the model the clients started from.
        results: the replies that reached the server (ids, n_i, K_i and what else each reported are kept).
        robust: the rule (``robust.active``).
        root: FLTrust's server model after its local steps on D0 from x_t (g0 = root − x_t); None otherwise.
        t: the round (the bucket order of ``robust.bucket`` > 1 is drawn from it).
    """
    deltas = flat_deltas(x, results.params)
    g0 = flat_deltas(x, {n: v.unsqueeze(0) for n, v in root.items()})[0] if root is not None else None
    agg = robust_delta(robust, deltas, g0, t)
    s = deltas.shape[0]
    rows = agg if agg.dim() == 2 else agg.unsqueeze(0).expand(s, -1)
    upd = unflatten(rows, x)
    finals = {n: p.unsqueeze(0) + upd[n] for n, p in x.items()}
    return ClientResults(finals, list(results.sizes), tuple(results.steps), tuple(results.ids), dict(results.extra))
