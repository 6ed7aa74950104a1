"""FedDUM, FedDU with server momentum (Liu et al., "Efficient Federated Learning Using Dynamic Update and Adaptive
Pruning with Momentum on Shared Server Data", FedDUMAP, arXiv 2408.05678, TIST 2024).

FedDU's round (``feddu``: FedAvg, then line 10 on D0 with a step γ_t set from the non-IID degrees and acc_t) whose
aggregation carries a global momentum M:

    M_t     = β·M_{t−1} + (1 − β)·η_g·Σ_i w_i Δ_i           M_{−1} = 0
    x̄_t     = x_t + M_t
    x_{t+1} = LocalSGD(x̄_t, γ_t·η0, K0, D0)                 FedDU's line 10, γ_t = γ·min(1, τ_eff/K0)

What is the paper's and what is ours. We could not read the paper's method section here (its abstract: "the global
momentum on the server and each local device"). The rule above is the authors' code's global momentum (PaddleFL,
``fedDUAP``'s ``central.py``: M ← 0.9·M + 0.1·Δ, w = w_t + M, after the devices' aggregation): an exponential
average, so that a constant update moves the model as far per round as FedDU's does once M has built up. Ours:
- β is ``algorithm.feddum_beta`` (default 0.9, the code's); η_g (default √S) scales the mean update as in FedDU.
- The devices' momentum (the code sends M to the devices, whose own rule is missing from the code) and the code's
  second use of M after the server's step are not built: fedsl's FedDUM is FedDU's clients and line 10 with the
  server's momentum between them. At β = 0 it is FedDU exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import RoundContext, deltas, weighted_mean, zeros_like
from fedsl.algorithms.feddu import DECAY_PARAM, FedDU
from fedsl.algorithms.spec import HyperParam, Range, Spec
from fedsl.core.types import Params, State

BETA = 0.9  # the authors' code's global momentum


@dataclass(frozen=True)
class FedDUM(FedDU):
    """FedDU whose aggregation keeps a global momentum M (module docstring).

    Attributes: global_lr: η_g; feddu_decay: FedDU's decay; feddum_beta: β, the momentum's weight on M_{t−1}.
    """

    feddum_beta: float  # the spec's default, BETA
    name: str = field(default="feddum", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.feddum_beta, (int, float)) and 0 <= self.feddum_beta < 1):
            raise ValueError(f"algorithm.feddum_beta = {self.feddum_beta!r}: expected a number in [0, 1) (0 = FedDU)")

    def init_server_state(self, x: Params) -> State:
        return {"m": zeros_like(x)}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        mean = weighted_mean(deltas(x, finals), weights)
        b = self.feddum_beta
        m = {n: b * state["m"][n] + (1 - b) * self.global_lr * mean[n] for n in x}
        return {n: p + m[n] for n, p in x.items()}, {"m": m}


SPECS = (
    Spec("feddum", FedDUM, (DECAY_PARAM,
                            HyperParam("feddum_beta", BETA, "β", "FedDUM's global momentum (0: FedDU)", ge=0, lt=1,
                                       search=Range(0.0, 0.99, hard_low=True, hard_high=True))),
         server_learning="incremental", needs_server_data=True, title="FedDUM", server_lr="local_lr",
         sets_gamma=True, reads_label_counts=True,
         summary="FedDUM (FedDUMAP): FedDU with a global momentum on the aggregated update"),
)
