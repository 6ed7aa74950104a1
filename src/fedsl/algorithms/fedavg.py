"""FedAvg (McMahan et al. 2017; the FSL paper's Algorithm 1 without line 10): LocalSGD clients, x̄ = x + η_g·mean Δ_i."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import LocalSGD, RoundContext, client_weights, deltas, weighted_mean
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params, State

__all__ = ["FedAvg", "client_weights", "fedavg_step"]


def fedavg_step(x: Params, client_params: Params, weights: torch.Tensor, global_lr: float) -> Params:
    """x̄ = x + η_g · Σ_i w_i Δ_i with Δ_i = x_i - x.

    Args:
        x: the global model x_t.
        client_params: the clients' final models x^{(i)}_{t,K}, stacked on dim 0.
        weights: w_i, summing to 1 (1/S for the plain mean of Algorithm 1, n_i/Σn_j if weighted).
        global_lr: η_g, the server step size (paper default √S).
    """
    mean = weighted_mean(deltas(x, client_params), weights)
    return {n: p + global_lr * mean[n] for n, p in x.items()}


@dataclass(frozen=True)
class FedAvg(LocalSGD):
    """Clients: LocalSGD (Algorithm 1, lines 4-6). Server: x̄ = x + η_g · mean_i Δ_i (lines 8-9). Stateless.

    Attributes:
        global_lr: η_g (paper: √S).
    """

    global_lr: float
    name: str = field(default="fedavg", init=False)

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        return fedavg_step(x, finals, weights, self.global_lr), state


# FSL, FSL-p and DS are FedAvg's rule with server learning or shared data (algorithm.Algorithm).
SPECS = (
    Spec("fedavg", FedAvg, parallel_ok=True, summary="FedAvg: x̄ = x + η_g·mean Δ_i"),
    Spec("fsl", FedAvg, server_learning="incremental", needs_server_data=True, parallel_ok=True,
         summary="FSL (Algorithm 1): FedAvg, then K0 SGD steps on D0 with step γ·η0"),
    Spec("fsl_p", FedAvg, server_learning="parallel", needs_server_data=True, parallel_ok=True,
         summary="FSL-p: the server trains from x_t like one more client, weight w0"),
    Spec("ds", FedAvg, needs_server_data=True, shares_server_data=True,
         summary="data sharing: FedAvg with clients on D_i ∪ D0"),
)
