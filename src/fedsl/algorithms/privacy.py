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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fedsl.algorithms.base import ClientResults, deltas, weighted_mean
from fedsl.core import rng
from fedsl.core.types import Params


@dataclass(frozen=True)
class DifferentialPrivacy:
    """DP-FedAvg's mechanism (McMahan et al., ICLR 2018, Algorithm 1).

    Attributes:
        clip: C, the bound on each client's update norm ‖Δ_i‖₂ (S in McMahan et al.).
        noise_multiplier: z, the noise's standard deviation in units of C (σ = zC on the sum; 0: clipping only).
        clients_per_round: S, the aggregate's fixed denominator (McMahan et al.'s qW).
    """

    clip: float
    noise_multiplier: float
    clients_per_round: int

    @property
    def noise_std(self) -> float:
        """zC/S: the standard deviation of each coordinate of the noise on the aggregate Δ̂."""
        return self.noise_multiplier * self.clip / self.clients_per_round


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


def private_update(x: Params, results: ClientResults, dp: DifferentialPrivacy, seed: int, t: int) -> Params:
    """Δ̂_t = (Σ_i clip_C(Δ_i) + N(0, z²C² I)) / S = clipped mean + N(0, (zC/S)² I) (module docstring).

    Args:
        x: x_t, the model the clients started from.
        results: the round's replies (their final models x_i); those that arrived.
        dp: C, z and S.
        seed, t: the run's seed and the round: the noise's stream.
    """
    mean = clipped_mean(x, results.params, dp.clip, dp.clients_per_round)
    if dp.noise_multiplier == 0:
        return mean
    noise = gaussian_noise(x, dp.noise_std, seed, t)
    return {n: v + noise[n] for n, v in mean.items()}


def privatize(x: Params, results: ClientResults, dp: DifferentialPrivacy, seed: int, t: int) -> ClientResults:
    """The round's replies with every client's model replaced by x_t + Δ̂_t (ids, n_i and K_i kept), so that
    the rule's server update reads the private aggregate only (module docstring)."""
    update = private_update(x, results, dp, seed, t)
    count = len(results.sizes)
    finals = {n: (p + update[n]).unsqueeze(0).expand(count, *p.shape).contiguous() for n, p in x.items()}
    return replace(results, params=finals)
