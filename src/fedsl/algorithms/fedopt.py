"""Server optimisers on the mean client update (Hsu et al. 2019; Reddi et al. 2021).

The pseudo-gradient is -Δ_t with Δ_t = Σ w_i Δ_i. FedAvgM keeps a momentum buffer v,
FedAdam the Adam moments m, v. Their state is measured from the clients' updates only:
server learning moves the model after the optimiser step, and that move is *not* fed
back into momentum, so SL acts as a correction the next round's clients start from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import LocalSGD, RoundContext, deltas, weighted_mean, zeros_like
from fedsl.algorithms.spec import HyperParam, Spec
from fedsl.core.types import Params, State


@dataclass(frozen=True)
class FedAvgM(LocalSGD):
    """v ← β v + Δ_t; x ← x + η_g v.

    Attributes (defaults: ``SPECS`` below):
        global_lr: η_g.
        momentum: β.
    """

    global_lr: float
    momentum: float
    name: str = field(default="fedavgm", init=False)

    def init_server_state(self, x: Params) -> State:
        return {"v": zeros_like(x)}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        d = weighted_mean(deltas(x, finals), weights)
        v = {n: self.momentum * state["v"][n] + d[n] for n in x}
        return {n: p + self.global_lr * v[n] for n, p in x.items()}, {"v": v}


@dataclass(frozen=True)
class FedAdam(LocalSGD):
    """m ← β1 m + (1-β1) Δ_t; v ← β2 v + (1-β2) Δ_t²; x ← x + η_g m / (√v + τ) (Reddi et al., no bias correction).

    Attributes (defaults: ``SPECS`` below):
        global_lr: η_g.
        beta1, beta2: moment decays.
        tau: τ, adaptivity.
    """

    global_lr: float
    beta1: float
    beta2: float
    tau: float
    name: str = field(default="fedadam", init=False)

    def init_server_state(self, x: Params) -> State:
        return {"m": zeros_like(x), "v": zeros_like(x)}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        d = weighted_mean(deltas(x, finals), weights)
        m = {n: self.beta1 * state["m"][n] + (1 - self.beta1) * d[n] for n in x}
        v = {n: self.beta2 * state["v"][n] + (1 - self.beta2) * d[n] ** 2 for n in x}
        new = {n: p + self.global_lr * m[n] / (v[n].sqrt() + self.tau) for n, p in x.items()}
        return new, {"m": m, "v": v}


# η_g of these baselines is not the paper's √S: FedAvgM (Hsu et al. 2019) steps with η_g = 1 on a
# momentum buffer; FedAdam (Reddi et al. 2021) tunes η_g around 0.1.
SPECS = (
    Spec("fedavgm", FedAvgM, (HyperParam("momentum", 0.9, "β", "FedAvgM server momentum", ge=0, lt=1),), global_lr=1.0,
         parallel_ok=True, summary="FedAvgM: server momentum on the mean update"),
    Spec("fedadam", FedAdam, (HyperParam("beta1", 0.9, "β1", "FedAdam first-moment decay", ge=0, lt=1),
                              HyperParam("beta2", 0.99, "β2", "FedAdam second-moment decay", ge=0, lt=1),
                              HyperParam("tau", 1e-3, "τ", "FedAdam adaptivity", gt=0)),
         global_lr=0.1, parallel_ok=True, summary="FedAdam: Adam on the mean update"),
)
