"""FedProx (Li et al. 2020): clients minimise f_i(y) + μ/2·‖y - x_t‖²; the server averages as FedAvg."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedsl.algorithms.base import Carry
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.spec import HyperParam, Range, Spec
from fedsl.core.types import Params, State


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg's server with clients stepping on g + μ(y - x_t).

    Attributes:
        global_lr: η_g.
        mu: μ, the proximal weight (μ = 0 is FedAvg exactly; default: ``SPEC``).
    """

    mu: float
    name: str = field(default="fedprox", init=False)

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        return {"y": x}, {"anchor": x}

    def direction(self, carry: Carry, aux: State, g: Params) -> Params:
        return {n: g[n] + self.mu * (p - aux["anchor"][n]) for n, p in carry["y"].items()}


SPEC = Spec("fedprox", FedProx, (HyperParam("mu", 0.01, "μ", "FedProx proximal weight", ge=0,
                                                  search=Range(1e-4, 1.0, log=True)),), parallel_ok=True,
            local_keys=("mu",), summary="FedProx: FedAvg with μ(y - x_t) added to local gradients")
