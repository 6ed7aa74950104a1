"""FedNova (Wang et al. 2020, "Tackling the objective inconsistency problem in heterogeneous
federated optimization"): normalised averaging, with optional local momentum ρ.

Clients that take different numbers of local steps τ_i pull FedAvg toward the minimiser of
Σ p_i τ_i f_i instead of Σ p_i f_i. FedNova divides each update by the norm a_i of its
client's accumulated step coefficients and rescales by τ_eff = Σ_i p_i τ_i:
    x ← x + η_g · τ_eff · Σ_i p_i Δ_i / a_i,
    a_i = τ_i (local SGD);  a_i = [τ_i - ρ(1 - ρ^τ_i)/(1 - ρ)] / (1 - ρ) (heavy-ball momentum ρ).
With equal τ_i and ρ = 0 this is FedAvg exactly. τ_i are the steps each client really took
(a client with fewer samples takes fewer steps at the same local epochs).

The momentum clients carry a buffer v through their steps (``client_step``), which a gradient
correction alone cannot express; the whole algorithm is this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Carry, RoundContext, deltas, weighted_mean
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.spec import HyperParam, Spec
from fedsl.core.types import Params, State


def step_norm(steps: torch.Tensor, rho: float) -> torch.Tensor:
    """a_i: τ_i for local SGD; [τ_i - ρ(1 - ρ^τ_i)/(1 - ρ)]/(1 - ρ) with heavy-ball momentum ρ."""
    tau = steps.to(torch.float64)
    if rho == 0:
        return tau
    return (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)


def normalised_update(x: Params, finals: Params, weights: torch.Tensor, steps: torch.Tensor,
                      global_lr: float, rho: float) -> Params:
    """x + η_g · τ_eff · Σ_i p_i Δ_i / a_i (``weights`` = p_i, ``steps`` = τ_i, ``rho`` = ρ)."""
    p = weights.to(torch.float64)
    steps = steps.to(p.device)
    # τ_eff stays a (0-d, float64) tensor: float() of it would make the host wait for the GPU every round
    tau_eff = (p * steps.to(torch.float64)).sum()
    mean = weighted_mean(deltas(x, finals), p / step_norm(steps, rho))  # Σ p_i Δ_i / a_i
    return {n: v + global_lr * tau_eff * mean[n] for n, v in x.items()}


@dataclass(frozen=True)
class FedNova(FedAvg):
    """Clients: local SGD with heavy-ball momentum ρ (v ← ρ v + g; y ← y - η_l v, v = 0 at each round's
    start; ρ = 0 is LocalSGD exactly). Server: normalised averaging (FedAvg's stateless rule otherwise).

    Attributes: global_lr: η_g; rho: ρ, the clients' local momentum (defaults: ``SPEC``; η_g as FedNova's paper).
    """

    global_lr: float
    rho: float
    name: str = field(default="fednova", init=False)

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        return {"y": x, "v": {n: torch.zeros_like(p) for n, p in x.items()}}, {}

    def client_step(self, carry: Carry, aux: State, g: Params, lr) -> Carry:
        v = {n: self.rho * carry["v"][n] + g[n] for n in g}
        return {"y": {n: p - lr * v[n] for n, p in carry["y"].items()}, "v": v}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        return normalised_update(x, finals, weights, ctx.steps, self.global_lr, self.rho), state


SPEC = Spec("fednova", FedNova, (HyperParam("rho", 0.0, "ρ", "FedNova clients' local momentum", ge=0, lt=1),),
            global_lr=1.0, local_keys=("rho",),
            secagg_refused="normalises each client's update by its own local steps (Δ_i / a_i) before averaging",
            momentum_refused="takes its own heavy-ball client step, whose momentum ρ its normalisation a_i accounts "
                             "for (set algorithm.rho instead)",
            summary="FedNova: updates normalised by each client's local steps (and momentum)")
