"""SCAFFOLD (Karimireddy et al. 2020), option II control variates.

Client i, from y = x with its c_i and the server's c:
    K_i steps  y ← y - η_l (g(y) + c - c_i)
    c_i⁺ = c_i - c + (x - y_i) / (K_i η_l)            (option II)
Server:  x ← x + η_g · mean_i (y_i - x);  c ← c + (1/N) Σ_{i∈S} (c_i⁺ - c_i)
where c_i⁺ - c_i = -c + (x - y_i)/(K_i η_l) needs no c_i: the server computes it from y_i and K_i,
and each client keeps its own c_i. The paper uses η_g = √S. Sending c down doubles the
communication (the original also sends Δc_i up; here the server derives it). The control
variates are measured from the model the clients received: with server learning that is the
post-SL model x_{t+1}, so SL's move is part of the reference point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Carry, LocalSGD, RoundContext, deltas, weighted_mean, zeros_like
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params, State


def _column(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-client vector [S] shaped to broadcast against stacked [S, ...] parameters."""
    return v.reshape(-1, *([1] * (like.dim() - 1)))


@dataclass(frozen=True)
class Scaffold(LocalSGD):
    """Attributes: global_lr: η_g (paper: √S)."""

    global_lr: float
    name: str = field(default="scaffold", init=False)

    def init_server_state(self, x: Params) -> State:
        return {"c": zeros_like(x)}

    def init_client_state(self, x: Params) -> State:
        return {"c_i": zeros_like(x)}

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        return {"y": x}, {"correction": {n: sent["c"][n] - client["c_i"][n] for n in x}}

    def direction(self, carry: Carry, aux: State, g: Params) -> Params:
        corr = aux["correction"]
        return {n: g[n] + corr[n] for n in carry["y"]}

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr) -> tuple[Params, State]:
        y, scale = carry["y"], 1.0 / (steps * lr)  # 1/(K_i η_l)
        return y, {"c_i": {n: client["c_i"][n] - sent["c"][n] - scale * (y[n] - x[n]) for n in x}}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        d = deltas(x, finals)
        scale = 1.0 / (ctx.steps.to(weights.device, torch.float64) * ctx.local_lr)  # 1/(K_i η_l)
        c = {}
        for n, v in state["c"].items():
            dc = -v - _column(scale.to(v.dtype), d[n]) * d[n]  # c_i⁺ - c_i
            c[n] = v + dc.sum(0) / ctx.num_clients
        mean = weighted_mean(d, weights)
        new = {n: p + self.global_lr * mean[n] for n, p in x.items()}
        return new, {"c": c}


# comm_factor 2: x and c down, Δy (and, in the original, Δc) up
SPEC = Spec("scaffold", Scaffold, sends=("c",), client_state=("c_i",), comm_factor=2,
            secagg_refused="updates its control variate c with each client's update scaled by 1/(K_i·η_l), and "
                           "sends c with x_t, which Flower's SecAgg+ train message (one array list) cannot carry",
            momentum_refused="derives its option-II control variates c_i⁺ = c_i − c + (x − y_i)/(K_i·η_l) from plain "
                             "SGD's displacement, which momentum scales by up to 1/(1 − μ_c)",
            summary="SCAFFOLD: control variates c - c_i correct local gradients")
