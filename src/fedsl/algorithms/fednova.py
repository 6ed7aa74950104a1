"""FedNova (Wang et al. 2020, "Tackling the objective inconsistency problem in heterogeneous
federated optimization"): normalised averaging.

Clients that take different numbers of local steps τ_i pull FedAvg toward the minimiser of
Σ p_i τ_i f_i instead of Σ p_i f_i. FedNova divides each update by its client's steps and
rescales by the effective number of steps (plain local SGD: a_i = τ_i):
    x ← x + η_g · τ_eff · Σ_i p_i Δ_i / τ_i,    τ_eff = Σ_i p_i τ_i.
With equal τ_i this is FedAvg exactly. τ_i are the steps each client really took (a client
with fewer samples takes fewer steps at the same local epochs), which the engine reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Correction, RoundContext, State, deltas, weighted_mean
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params


def normalised_update(x: Params, finals: Params, weights: torch.Tensor, steps: torch.Tensor,
                      global_lr: float) -> Params:
    """x + η_g · τ_eff · Σ_i p_i Δ_i / τ_i (``weights`` = p_i, ``steps`` = τ_i)."""
    tau = steps.to(weights.device, torch.float64)
    p = weights.to(torch.float64)
    tau_eff = float((p * tau).sum())
    mean = weighted_mean(deltas(x, finals), p / tau)  # Σ p_i Δ_i / τ_i
    return {n: v + global_lr * tau_eff * mean[n] for n, v in x.items()}


@dataclass(frozen=True)
class FedNova:
    """Attributes: global_lr: η_g (FedNova's paper: 1)."""

    global_lr: float = 1.0
    name: str = field(default="fednova", init=False)

    def init_state(self, x: Params, num_clients: int) -> State:
        return {}

    def correction(self, x: Params, state: State, ids: torch.Tensor) -> Correction:
        return Correction()

    def update(self, x: Params, finals: Params, weights: torch.Tensor, ids: torch.Tensor, state: State,
               ctx: RoundContext) -> tuple[Params, State]:
        return normalised_update(x, finals, weights, ctx.steps, self.global_lr), state


SPEC = Spec("fednova", FedNova, global_lr=1.0, parallel_ok=False,
            summary="FedNova: updates normalised by each client's local steps τ_i")
