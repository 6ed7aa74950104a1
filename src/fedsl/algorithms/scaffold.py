"""SCAFFOLD (Karimireddy et al. 2020), option II control variates.

Clients correct every local gradient by c - c_i; after K_i steps from x to y_i:
    c_i⁺ = c_i - c + (x - y_i) / (K_i η_l)            (option II)
Server:  x ← x + η_g · mean_i (y_i - x);  c ← c + (1/N) Σ_{i∈S} (c_i⁺ - c_i)
(the paper uses η_g = √S). Sending c down and Δc_i up doubles the communication.
The control variates are measured from the model the clients received: with server
learning that is the post-SL model x_{t+1}, so SL's move is part of the reference point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Correction, RoundContext, State, deltas, weighted_mean, zeros_like
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params


@dataclass(frozen=True)
class Scaffold:
    """Attributes: global_lr: η_g (paper: √S)."""

    global_lr: float
    name: str = field(default="scaffold", init=False)

    def init_state(self, x: Params, num_clients: int) -> State:
        return {"c": zeros_like(x), "c_i": zeros_like(x, (num_clients,))}

    def correction(self, x: Params, state: State, ids: torch.Tensor) -> Correction:
        return Correction(linear={n: state["c"][n] - state["c_i"][n][ids] for n in x})

    def client_rows(self, x: Params, finals: Params, ids: torch.Tensor, state: State,
                    ctx: RoundContext) -> State:
        """The clients' new rows c_i⁺ = c_i - c + (x - y_i)/(K_i η_l), from what each holds (its c_i,
        the c it received, its x_i): a client computes its own (Flower), the server those it sampled."""
        d = deltas(x, finals)
        scale = 1.0 / (ctx.steps.to(next(iter(x.values())).dtype) * ctx.local_lr)  # 1/(K_i η_l)
        c_i = {}
        for n in x:
            s = scale.reshape(-1, *([1] * x[n].dim()))
            c_i[n] = state["c_i"][n][ids] - state["c"][n] - s * d[n]
        return {"c_i": c_i}

    def update(self, x: Params, finals: Params, weights: torch.Tensor, ids: torch.Tensor, state: State,
               ctx: RoundContext) -> tuple[Params, State]:
        d = deltas(x, finals)
        c_i = self.client_rows(x, finals, ids, state, ctx)["c_i"]
        c = {n: state["c"][n] + (c_i[n] - state["c_i"][n][ids]).sum(0) / ctx.num_clients for n in x}
        mean = weighted_mean(d, weights)
        # "c_i" holds the sampled clients' new rows only (see base.ServerRule)
        return {n: p + self.global_lr * mean[n] for n, p in x.items()}, {"c": c, "c_i": c_i}


# comm_factor 2: x and c down, Δy and Δc up
SPEC = Spec("scaffold", Scaffold, sends=("c",), comm_factor=2,
            summary="SCAFFOLD: control variates c - c_i correct local gradients")
