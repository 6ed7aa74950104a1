"""Central differential privacy of the clients' updates: DP-FedAvg's clipped, noised mean.

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018
(Algorithm 1, DP-FedAvg with the fixed-denominator estimator f̃_f). Round t, sampled clients i ∈ S_t:

    Δ_i   = x_i − x_t                                      each client's update (the whole model's vector)
    Δ̄_i   = Δ_i · min(1, C / ‖Δ_i‖₂)                        clipped to norm C (the sum's sensitivity is C)
    Δ̂_t   = (Σ_i Δ̄_i + N(0, z²C² I)) / S                   the private aggregate

S is the configured clients per round (McMahan et al.'s qW: the expected count, a public constant), not
the number of updates that arrived: dividing by a count that one client's presence changes would change
the sensitivity. When all S arrive, Δ̂_t = mean_i Δ̄_i + N(0, (zC/S)² I). The noise is drawn from
(seed, t, ``rng.DP_NOISE``), so a resumed run draws what the uninterrupted one drew.

``privatize`` returns the round's replies with every client's model replaced by x_t + Δ̂_t: whatever the
rule then does with the models (FedAvg's x̄ = x_t + η_g·mean Δ_i = x_t + η_g·Δ̂_t; SCAFFOLD's c; FedNova's
normalisation; FSL-p's server row beside them) reads Δ̂_t only, so the whole server half, server learning
on the server's own D0 included, is post-processing of the private aggregate and costs no further privacy.
Accounting the rounds (ε after t rounds at δ): ``fedsl.core.privacy_accounting``.

Adaptive clipping (``DifferentialPrivacy.adaptive``; Andrew, Thakkar, McMahan & Ramaswamy, "Differentially
Private Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1): the clip norm C_t follows the γ-quantile of
the update norms. Round t clips at C_t (C_0 = ``privacy.clip``), and besides Δ̂_t releases the noised fraction

    b̄_t     = (Σ_i (b_i − 1/2) + N(0, σ_b²)) / S + 1/2,    b_i = 1[‖Δ_i‖₂ ≤ C_t]
    C_{t+1} = C_t · exp(−η_C (b̄_t − γ))

b_i − 1/2 (the paper's centring: one client moves the sum by 1/2) over the fixed S, as Δ̂_t's; with all S arrived
b̄_t = (Σ_i b_i + N(0, σ_b²))/S. The count's noise is drawn from (seed, t, ``rng.DP_COUNT_NOISE``).

Accounting: each round now releases two Gaussian mechanisms on the same sampled clients, the clipped sum (sensitivity
C_t, noise z_Δ·C_t) and the centred count (sensitivity 1/2, noise σ_b). Their pair is one Gaussian mechanism of
noise multiplier z with z^(−2) = z_Δ^(−2) + (2σ_b)^(−2) (Andrew et al., Sec. 3), so the update's noise is raised to
z_Δ = (z^(−2) − (2σ_b)^(−2))^(−1/2) and the ledger composes the same sampled Gaussian events of multiplier z as with
a fixed clip: ε is unchanged. C_{t+1} is a function of released values only (post-processing). This needs z < 2σ_b
(``update_noise_multiplier`` refuses it otherwise, in one line); σ_b defaults to S/20, the paper's recommendation
(expected clients per round / 20). Nothing else about the clients is released, so nothing else is left out of the
ledger; sampling is accounted as for DP-FedAvg (Poisson at q = S/N, ``fedsl.core.privacy_accounting``).

Defaults: γ = 0.5 and η_C = 0.2 (Andrew et al.'s recommendation, the defaults of Flower's
``DifferentialPrivacyServerSideAdaptiveClipping``); σ_b = S/20 with noise (0 with z = 0: clipping only). Ours, where
Flower differs: the count is centred and divided by the fixed S (Flower divides the raw count by the replies that
arrived), and round t's update noise is z_Δ·C_t at the C_t it clipped with (Flower noises with the C_{t+1} it just
computed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from fedsl.algorithms.base import ClientResults, deltas, weighted_mean
from fedsl.core import rng
from fedsl.core.types import Params


@dataclass(frozen=True)
class AdaptiveClipping:
    """Adaptive clipping's settings (Andrew et al., NeurIPS 2021; module docstring). The defaults are written here once.

    Attributes:
        target_quantile: γ, the fraction of the updates C_t should leave unclipped.
        lr: η_C, the step of the geometric update of C.
        count_stddev: σ_b, the noise's standard deviation on the count of unclipped updates (None: S/20 when z > 0,
            0 when z = 0).
    """

    target_quantile: float = 0.5
    lr: float = 0.2
    count_stddev: float | None = None


def update_noise_multiplier(z: float, count_stddev: float) -> float:
    """z_Δ = (z^(−2) − (2σ_b)^(−2))^(−1/2): the update's noise multiplier that, with the count's σ_b, composes to z (0
    when z = 0).

    Raises:
        ValueError: z > 0 and z >= 2σ_b (no z_Δ does), in one line naming both.
    """
    if z == 0:
        return 0.0
    if z >= 2 * count_stddev:
        raise ValueError(f"privacy.adaptive = true with noise multiplier z = {z:g} needs z < 2·σ_b = "
                         f"{2 * count_stddev:g} (σ_b = privacy.count_stddev, default S/20): the update's and the "
                         "count's noise must compose to z; expected a larger privacy.count_stddev or a smaller z")
    return (z ** -2 - (2 * count_stddev) ** -2) ** -0.5


@dataclass(frozen=True)
class DifferentialPrivacy:
    """DP-FedAvg's mechanism (McMahan et al., ICLR 2018, Algorithm 1), with adaptive clipping when ``adaptive``.

    Attributes:
        clip: C, the bound on each client's update norm ‖Δ_i‖₂ (S in McMahan et al.); C_0 with adaptive clipping.
        noise_multiplier: z, the noise's standard deviation in units of C (σ = zC on the sum; 0: clipping only): the
            multiplier the accountant composes (with adaptive clipping, the update's and the count's together).
        clients_per_round: S, the aggregate's fixed denominator (McMahan et al.'s qW).
        adaptive: adaptive clipping's γ, η_C, σ_b (None: C fixed).
    """

    clip: float
    noise_multiplier: float
    clients_per_round: int
    adaptive: AdaptiveClipping | None = None

    @property
    def count_stddev(self) -> float:
        """σ_b: the noise's standard deviation on the count of unclipped updates (adaptive clipping; 0 without it)."""
        a = self.adaptive
        if a is None:
            return 0.0
        if a.count_stddev is not None:
            return a.count_stddev
        return self.clients_per_round / 20 if self.noise_multiplier > 0 else 0.0

    @property
    def update_noise_multiplier(self) -> float:
        """z_Δ, the update's noise multiplier: z with a fixed clip; ``update_noise_multiplier(z, σ_b)`` with an
        adaptive one."""
        if self.adaptive is None:
            return self.noise_multiplier
        return update_noise_multiplier(self.noise_multiplier, self.count_stddev)

    @property
    def noise_std(self) -> float:
        """z_Δ·C/S: the standard deviation of each coordinate of the noise on the aggregate Δ̂ (at C_0 when adaptive)."""
        return self.noise_std_at(self.clip)

    def noise_std_at(self, clip: float) -> float:
        """z_Δ·C_t/S at the clip norm ``clip``."""
        return self.update_noise_multiplier * clip / self.clients_per_round


def update_norms(updates: Params) -> torch.Tensor:
    """‖Δ_i‖₂ of each client over all of the model's parameters (``updates``: Δ_i stacked), float64 [S]."""
    return torch.sqrt(sum((v.double() ** 2).flatten(1).sum(1) for v in updates.values()))


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, C/‖Δ_i‖₂) per client (1 for a zero update), float64 [S]."""
    return torch.where(norms > clip, clip / norms.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(norms))


def clipped_mean(x: Params, finals: Params, clip: float, denominator: int) -> Params:
    """Σ_i Δ_i·min(1, C/‖Δ_i‖₂) / S: the clipped sum (add/remove-one-client sensitivity C) over the fixed S.

    Computed as ``weighted_mean`` with w_i = min(1, C/‖Δ_i‖₂)/S, so that with nothing clipped and all S
    arrived it is FedAvg's mean Δ (w_i = 1/S) bit for bit.
    """
    d = deltas(x, finals)
    return weighted_mean(d, clip_factors(update_norms(d), clip) / denominator)


def gaussian_noise(x: Params, std: float, seed: int, t: int) -> Params:
    """N(0, std²) per coordinate, shaped as x, from rng(seed, t, DP_NOISE): the parameters in name order,
    one float64 draw cast to x's dtype (a float32 and a float64 run see the same noise, rounded)."""
    g = rng.rng(seed, t, rng.DP_NOISE)
    out = {}
    for n in sorted(x):
        p = x[n]
        draw = g.standard_normal(p.numel()) * std
        out[n] = torch.from_numpy(draw).reshape(p.shape).to(device=p.device, dtype=p.dtype)
    return {n: out[n] for n in x}


def private_update(x: Params, results: ClientResults, dp: DifferentialPrivacy, seed: int, t: int,
                   clip: float | None = None) -> Params:
    """Δ̂_t = (Σ_i clip_C(Δ_i) + N(0, z_Δ²C² I)) / S = clipped mean + N(0, (z_ΔC/S)² I) (module docstring).

    Args:
        x: x_t, the model the clients started from.
        results: the round's replies (their final models x_i); those that arrived.
        dp: C, z and S (and adaptive clipping's settings).
        seed: the run's seed, and
        t: the round: together the noise's stream.
        clip: C_t, the round's clip norm under adaptive clipping (None: ``dp.clip``).
    """
    c = dp.clip if clip is None else clip
    mean = clipped_mean(x, results.params, c, dp.clients_per_round)
    if dp.noise_multiplier == 0:
        return mean
    noise = gaussian_noise(x, dp.noise_std_at(c), seed, t)
    return {n: v + noise[n] for n, v in mean.items()}


def next_clip(x: Params, results: ClientResults, dp: DifferentialPrivacy, clip: float, seed: int, t: int) -> float:
    """C_{t+1} = C_t·exp(−η_C (b̄_t − γ)), b̄_t the noised fraction of round t's updates with ‖Δ_i‖₂ ≤ C_t (module
    docstring: centred, over the fixed S; its noise from (seed, t, DP_COUNT_NOISE)).

    Args:
        x: x_t; results: the replies that arrived; dp: S and adaptive clipping's γ, η_C, σ_b; clip: C_t.
    """
    a = dp.adaptive
    assert a is not None, "next_clip is adaptive clipping's (DifferentialPrivacy.adaptive)"
    unclipped = update_norms(deltas(x, results.params)) <= clip
    centred = float(unclipped.double().sum()) - unclipped.numel() / 2  # Σ_i (b_i − 1/2)
    sigma = dp.count_stddev
    noise = float(rng.rng(seed, t, rng.DP_COUNT_NOISE).standard_normal()) * sigma if sigma > 0 else 0.0
    fraction = (centred + noise) / dp.clients_per_round + 0.5  # b̄_t
    return clip * math.exp(-a.lr * (fraction - a.target_quantile))


def privatize(x: Params, results: ClientResults, dp: DifferentialPrivacy, seed: int, t: int,
              clip: float | None = None) -> ClientResults:
    """The round's replies with every client's model replaced by x_t + Δ̂_t (ids, n_i and K_i kept), so that
    the rule's server update reads the private aggregate only (module docstring); ``clip``: C_t (None: ``dp.clip``)."""
    update = private_update(x, results, dp, seed, t, clip)
    count = len(results.sizes)
    finals = {n: (p + update[n]).unsqueeze(0).expand(count, *p.shape).contiguous() for n, p in x.items()}
    return replace(results, params=finals)
