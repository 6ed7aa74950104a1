"""FedAvg's server rule (McMahan et al. 2017; Algorithm 1, lines 8-9 of the FSL paper)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Correction, RoundContext, State, deltas, weighted_mean
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params


def aggregate(x: Params, client_params: Params, weights: torch.Tensor, global_lr: float) -> Params:
    """x̄ = x + η_g · Σ_i w_i Δ_i with Δ_i = x_i - x.

    Args:
        x: the global model x_t.
        client_params: the clients' final models x^{(i)}_{t,K}, stacked on dim 0.
        weights: w_i, summing to 1 (1/S for the plain mean of Algorithm 1, n_i/Σn_j if weighted).
        global_lr: η_g, the server step size (paper default √S).
    """
    mean = weighted_mean(deltas(x, client_params), weights)
    return {n: p + global_lr * mean[n] for n, p in x.items()}


def client_weights(sizes: list[int], weighted: bool) -> torch.Tensor:
    """1/S each (Algorithm 1), or n_i / Σ n_j when ``weighted``."""
    s = torch.tensor(sizes, dtype=torch.float64)
    return s / s.sum() if weighted else torch.full_like(s, 1.0 / len(sizes))


@dataclass(frozen=True)
class FedAvg:
    """x̄ = x + η_g · mean_i Δ_i. Stateless.

    Attributes:
        global_lr: η_g (paper: √S).
    """

    global_lr: float
    name: str = field(default="fedavg", init=False)

    def init_state(self, x: Params, num_clients: int) -> State:
        return {}

    def correction(self, x: Params, state: State, ids: torch.Tensor) -> Correction:
        return Correction()

    def update(self, x: Params, finals: Params, weights: torch.Tensor, ids: torch.Tensor, state: State,
               ctx: RoundContext) -> tuple[Params, State]:
        return aggregate(x, finals, weights, self.global_lr), state


# FSL, FSL-p and DS are FedAvg's rule with server learning or shared data (base.Algorithm).
SPECS = (
    Spec("fedavg", FedAvg, parallel_ok=True, summary="FedAvg: x̄ = x + η_g·mean Δ_i"),
    Spec("fsl", FedAvg, server_learning="incremental", needs_server_data=True, parallel_ok=True,
         summary="FSL (Algorithm 1): FedAvg, then K0 SGD steps on D0 with step γ·η0"),
    Spec("fsl_p", FedAvg, server_learning="parallel", needs_server_data=True, parallel_ok=True,
         summary="FSL-p: the server trains from x_t like one more client, weight w0"),
    Spec("ds", FedAvg, needs_server_data=True, shares_server_data=True,
         summary="data sharing: FedAvg with clients on D_i ∪ D0"),
)
