"""FedDyn (Acar et al. 2021): dynamic regularisation.

Client i minimises L_i(θ) - <∇L_i, θ> + α/2·‖θ - θ^{t-1}‖², i.e. its local gradient
is g - ∇L_i + α(θ - θ^{t-1}); afterwards ∇L_i ← ∇L_i - α(θ_i - θ^{t-1}).
Server (m = N clients):  h ← h - (α/m) Σ_{i∈S} (θ_i - θ^{t-1});  θ^t = mean_{i∈S} θ_i - h/α.
By construction h = (1/m) Σ_{i∈[N]} ∇L_i at every round (a test checks this identity).
θ^{t-1} is the model the clients received (after server learning, when SL is on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Correction, RoundContext, State, deltas, zeros_like
from fedsl.algorithms.spec import HyperParam, Spec
from fedsl.core.types import Params


@dataclass(frozen=True)
class FedDyn:
    """Attributes: alpha: α, the regularisation weight (paper: 0.01; tuned in {0.01, 0.05, 0.1, 0.5})."""

    alpha: float = 0.01
    name: str = field(default="feddyn", init=False)

    def init_state(self, x: Params, num_clients: int) -> State:
        return {"h": zeros_like(x), "grad_i": zeros_like(x, (num_clients,))}

    def correction(self, x: Params, state: State, ids: torch.Tensor) -> Correction:
        return Correction(prox=self.alpha, linear={n: -state["grad_i"][n][ids] for n in x})

    def client_rows(self, x: Params, finals: Params, ids: torch.Tensor, state: State,
                    ctx: RoundContext) -> State:
        """The clients' new rows ∇L_i⁺ = ∇L_i - α(θ_i - θ^{t-1}): a client computes its own (Flower),
        the server those it sampled."""
        d = deltas(x, finals)
        return {"grad_i": {n: state["grad_i"][n][ids] - self.alpha * d[n] for n in x}}

    def update(self, x: Params, finals: Params, weights: torch.Tensor, ids: torch.Tensor, state: State,
               ctx: RoundContext) -> tuple[Params, State]:
        d = deltas(x, finals)
        grad_i = self.client_rows(x, finals, ids, state, ctx)["grad_i"]
        h, new = {}, {}
        for n in x:
            h[n] = state["h"][n] - self.alpha * d[n].sum(0) / ctx.num_clients
            new[n] = finals[n].mean(0) - h[n] / self.alpha
        # "grad_i" holds the sampled clients' new rows only (see base.ServerRule)
        return new, {"h": h, "grad_i": grad_i}


SPEC = Spec("feddyn", FedDyn,
            (HyperParam("alpha", 0.01, "α", "FedDyn regularisation (paper: 0.01)", gt=0),), global_lr=None,
            local_keys=("alpha",), summary="FedDyn: dynamic regularisation, h = mean ∇L_i")
