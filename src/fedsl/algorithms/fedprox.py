"""FedProx (Li et al. 2020): clients minimise f_i(y) + μ/2·‖y - x_t‖²; the server averages as FedAvg."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Correction, State
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.spec import HyperParam, Spec
from fedsl.core.types import Params


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg's server rule with the proximal term μ(y - x_t) added to every local gradient.

    Attributes:
        global_lr: η_g.
        mu: μ, the proximal weight (μ = 0 is FedAvg exactly).
    """

    mu: float = 0.01
    name: str = field(default="fedprox", init=False)

    def correction(self, x: Params, state: State, ids: torch.Tensor) -> Correction:
        return Correction(prox=self.mu)


SPEC = Spec("fedprox", FedProx, (HyperParam("mu", 0.01, "μ", "FedProx proximal weight", ge=0),), parallel_ok=True,
            local_keys=("mu",), summary="FedProx: FedAvg with μ(y - x_t) added to local gradients")
