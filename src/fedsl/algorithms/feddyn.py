"""FedDyn (Acar et al. 2021): dynamic regularisation.

Client i minimises L_i(θ) - <∇L_i, θ> + α/2·‖θ - θ^{t-1}‖², i.e. it steps on the gradient
g - ∇L_i + α(θ - θ^{t-1}); afterwards ∇L_i ← ∇L_i - α(θ_i - θ^{t-1}) (its own state).
Server (m = N clients):  h ← h - (α/m) Σ_{i∈S} (θ_i - θ^{t-1});  θ^t = mean_{i∈S} θ_i - h/α.
By construction h = (1/m) Σ_{i∈[N]} ∇L_i at every round (a test checks this identity).
θ^{t-1} is the model the clients received (after server learning, when SL is on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Carry, LocalSGD, RoundContext, deltas, zeros_like
from fedsl.algorithms.spec import HyperParam, Range, Spec
from fedsl.core.types import Params, State


@dataclass(frozen=True)
class FedDyn(LocalSGD):
    """Attributes: alpha: α, the regularisation weight (default: ``SPEC``'s, the paper's; tuned there in
    {0.01, 0.05, 0.1, 0.5})."""

    alpha: float
    name: str = field(default="feddyn", init=False)

    def init_server_state(self, x: Params) -> State:
        return {"h": zeros_like(x)}

    def init_client_state(self, x: Params) -> State:
        return {"grad_i": zeros_like(x)}

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        return {"y": x}, {"anchor": x, "linear": {n: -v for n, v in client["grad_i"].items()}}

    def direction(self, carry: Carry, aux: State, g: Params) -> Params:
        anchor, lin = aux["anchor"], aux["linear"]
        return {n: g[n] + self.alpha * (p - anchor[n]) + lin[n] for n, p in carry["y"].items()}

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr) -> tuple[Params, State]:
        y = carry["y"]
        return y, {"grad_i": {n: client["grad_i"][n] - self.alpha * (y[n] - x[n]) for n in x}}

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        d = deltas(x, finals)
        h = {n: state["h"][n] - self.alpha * d[n].sum(0) / ctx.num_clients for n in x}
        return {n: finals[n].mean(0) - h[n] / self.alpha for n in x}, {"h": h}


SPEC = Spec("feddyn", FedDyn,
            (HyperParam("alpha", 0.01, "α", "FedDyn regularisation (paper: 0.01)", gt=0,
                        search=Range(1e-4, 1.0, log=True)),), global_lr=None,
            client_state=("grad_i",), local_keys=("alpha",), plain_mean=True,
            summary="FedDyn: dynamic regularisation, h = mean ∇L_i")
