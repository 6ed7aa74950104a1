"""Server optimisers on the mean client update (Hsu et al. 2019; Reddi et al. 2021).

The pseudo-gradient is -Δ_t with Δ_t = Σ w_i Δ_i. FedAvgM keeps a momentum buffer v,
FedAdam, FedYogi and FedAdagrad the moments m, v of Reddi, Charles, Zaheer, Garrett, Rush, Konečný,
Kumar & McMahan, "Adaptive Federated Optimization", ICLR 2021, Algorithm 2 (no bias correction):

    m_t = β1 m_{t-1} + (1-β1) Δ_t                          all three
    v_t = v_{t-1} + Δ_t²                                   FedAdagrad
    v_t = v_{t-1} - (1-β2) Δ_t² sign(v_{t-1} - Δ_t²)       FedYogi
    v_t = β2 v_{t-1} + (1-β2) Δ_t²                         FedAdam
    x_{t+1} = x_t + η_g m_t / (√v_t + τ)

m and v start at 0 (Flower's FedOpt strategies do the same; Algorithm 2 allows any v_{-1} ≥ τ²): v stays ≥ 0
under all three updates, so √v is defined. Their state is measured from the clients' updates only:
server learning moves the model after the optimiser step, and that move is *not* fed
back into momentum, so SL acts as a correction the next round's clients start from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import LocalSGD, RoundContext, deltas, weighted_mean, zeros_like
from fedsl.algorithms.spec import HyperParam, Range, Spec
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


class AdaptiveServer:
    """The FedOpt family's server step (Reddi et al. 2021, Algorithm 2) from the mean update Δ_t:
    m ← β1 m + (1-β1) Δ_t, v ← the rule's ``second_moment(v, Δ_t)``, x ← x + η_g m / (√v + τ).
    The rule supplies ``global_lr``, ``beta1``, ``tau`` and ``second_moment``."""

    def init_server_state(self, x: Params) -> State:
        return {"m": zeros_like(x), "v": zeros_like(x)}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        d = weighted_mean(deltas(x, finals), weights)
        m = {n: self.beta1 * state["m"][n] + (1 - self.beta1) * d[n] for n in x}
        v = {n: self.second_moment(state["v"][n], d[n]) for n in x}
        new = {n: p + self.global_lr * m[n] / (v[n].sqrt() + self.tau) for n, p in x.items()}
        return new, {"m": m, "v": v}


@dataclass(frozen=True)
class FedAdam(AdaptiveServer, LocalSGD):
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

    def second_moment(self, v: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t-1} and Δ_t: Adam's β2 v + (1-β2) Δ_t²."""
        return self.beta2 * v + (1 - self.beta2) * d ** 2


@dataclass(frozen=True)
class FedYogi(FedAdam):
    """FedAdam with Yogi's second moment: v ← v - (1-β2) Δ_t² sign(v - Δ_t²) (Reddi et al. 2021, Algorithm 2).

    v moves toward Δ_t² by at most (1-β2) Δ_t² a round, additively, where Adam's moves by (1-β2)(Δ_t² - v):
    a large v decays slower after the updates shrink. Attributes and defaults: as FedAdam's (``SPECS`` below).
    """

    name: str = field(default="fedyogi", init=False)

    def second_moment(self, v: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        d2 = d ** 2
        return v - (1 - self.beta2) * d2 * torch.sign(v - d2)


@dataclass(frozen=True)
class FedAdagrad(AdaptiveServer, LocalSGD):
    """m ← β1 m + (1-β1) Δ_t; v ← v + Δ_t²; x ← x + η_g m / (√v + τ) (Reddi et al. 2021, Algorithm 2).

    Attributes (defaults: ``SPECS`` below):
        global_lr: η_g.
        beta1: first-moment decay (0: m = Δ_t, as Flower's FedAdagrad fixes it).
        tau: τ, adaptivity.
    """

    global_lr: float
    beta1: float
    tau: float
    name: str = field(default="fedadagrad", init=False)

    def second_moment(self, v: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t-1} and Δ_t: Adagrad's v + Δ_t²."""
        return v + d ** 2


# The moment decays and τ of the three adaptive rules: one config key each, one default (FedAdam's, which Flower's
# FedYogi shares: β1 = 0.9, β2 = 0.99, τ = 1e-3).
BETA1 = HyperParam("beta1", 0.9, "β1", "first-moment decay (FedAdam, FedYogi, FedAdagrad)", ge=0, lt=1)
BETA2 = HyperParam("beta2", 0.99, "β2", "second-moment decay (FedAdam, FedYogi)", ge=0, lt=1)
TAU = HyperParam("tau", 1e-3, "τ", "adaptivity (FedAdam, FedYogi, FedAdagrad)", gt=0,
                search=Range(1e-5, 1e-1, log=True))  # Reddi et al. tune τ, η_l and η_g over decades, β fixed

# Reddi et al. search the adaptive rules' η_g over decades below 1 (their grid: 10^-3 .. 10^0.5)
ADAPTIVE_ETA_G = Range(1e-3, 1.0, log=True)

# η_g of these baselines is not the paper's √S: FedAvgM (Hsu et al. 2019) steps with η_g = 1 on a
# momentum buffer; FedAdam (Reddi et al. 2021) tunes η_g around 0.1; FedYogi's 0.01 and FedAdagrad's 0.1 are
# Flower's strategies' defaults (Reddi et al. tune η_g per task). Flower's FedAdagrad fixes β1 = 0 (m_t = Δ_t);
# here β1 is the key the three share, default 0.9 (Algorithm 2's m_t): algorithm.beta1 = 0 is Flower's FedAdagrad.
SPECS = (
    Spec("fedavgm", FedAvgM, (HyperParam("momentum", 0.9, "β", "FedAvgM server momentum", ge=0, lt=1,
                                   search=Range(0.0, 0.99, hard_low=True, hard_high=True)),), global_lr=1.0,
         parallel_ok=True, summary="FedAvgM: server momentum on the mean update"),
    Spec("fedadam", FedAdam, (BETA1, BETA2, TAU), global_lr=0.1, parallel_ok=True, global_lr_search=ADAPTIVE_ETA_G,
         summary="FedAdam: Adam on the mean update"),
    Spec("fedyogi", FedYogi, (BETA1, BETA2, TAU), global_lr=0.01, parallel_ok=True, title="FedYogi",
         global_lr_search=ADAPTIVE_ETA_G,
         summary="FedYogi: Yogi's additive second moment on the mean update"),
    Spec("fedadagrad", FedAdagrad, (BETA1, TAU), global_lr=0.1, parallel_ok=True, title="FedAdagrad",
         global_lr_search=ADAPTIVE_ETA_G,
         summary="FedAdagrad: Adagrad's summed second moment on the mean update"),
)
