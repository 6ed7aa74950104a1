"""FedCLG (Bian, Wang, Yang, Shen & Xu, "Accelerating Hybrid Federated Learning Convergence under Partial
Participation", arXiv 2304.05397): FSL's round whose server gradient on D0 also corrects the clients' drift, either
in their local steps (FedCLG-C) or in the server's aggregation (FedCLG-S).

Round t, with g_s = ∇f0(x_t) (the server's gradient on D0) and g_i = ∇F_i(x_t) (client i's gradient on D_i), both
over all of the data at the model the clients receive:

    FedCLG-C   client i:  K_i steps  y ← y − η_l (∇f_i(y; batch) − g_i + g_s)         (g_s sent with x_t)
               server:    x̄_t = x_t + η_g · Σ_i w_i Δ_i
    FedCLG-S   client i:  K_i plain steps (FedAvg's), Δ_i and g_i sent back
               server:    x̄_t = x_t + η_g · Σ_i w_i (Δ_i − K_i η_l (g_s − g_i))
    both       x_{t+1} = LocalSGD(x̄_t, γ_t·η0, K0, D0)                                 (line 10, FSL's)

The correction replaces the client's own full gradient in its steps by the server's: SCAFFOLD's control variates
with c = g_s and c_i = g_i measured afresh each round (no state kept between rounds, so it suits partial
participation). FedCLG-S applies the same correction after the fact: to first order in η_l its Δ_i − K_i η_l (g_s −
g_i) is FedCLG-C's Δ_i.

What is the paper's and what is ours. We could not read the paper's method section here (only its abstract: the
server's gradient "guides the participated clients' training" (C) and "the server's aggregation" (S), after the
server's own training steps on its data, as CLG-SGD), so the equations above are our reading, checked against a
third-party reimplementation of both variants, which corrects the same way. Our choices, each written once here:
- g_s and g_i are full gradients over D0 and D_i (D_i ∪ D0 for DS) at x_t, dropout off (the evaluation's forward
  pass): deterministic, so Flower replays the simulator bit for bit. The reimplementation uses one minibatch each.
- FedCLG-S scales the correction by each client's real K_i (its local steps), which makes it exact to first order;
  the reimplementation uses the number of local epochs.
- η_g defaults to √S and line 10 to FSL's (K0 = E_s·⌈n0/B0⌉ steps of γ·η0): FedCLG is FSL plus the correction, so
  the comparison with FSL isolates it.
- Communication: FedCLG-C sends g_s down beside x_t, FedCLG-S sends g_i up beside Δ_i: 3d per client and round,
  ``comm_factor`` 1.5.
What the engines do for it, from the specs alone: each client measures ∇F_i(x_t) (``measures``/``reply``:
``start_grad``), the server ∇f0(x_t) (``sends``/``server_measures``: ``server_grad``); in Flower, g_s travels in the
train message's ``server-state`` and g_i in the reply's ArrayRecord ``start-grad``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import Carry, RoundContext, deltas, weighted_mean
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.scaffold import Scaffold
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params, State


@dataclass(frozen=True)
class FedCLGC(FedAvg):
    """FedCLG-C: each local step corrected by g_s − g_i (module docstring); the server is FedAvg's, then line 10.

    Attributes: global_lr: η_g (default √S).
    """

    name: str = field(default="fedclg_c", init=False)

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        g_s, g_i = sent["server_grad"], sent["start_grad"]
        return {"y": x}, {"correction": {n: g_s[n] - g_i[n] for n in x}}

    direction = Scaffold.direction  # d = g + correction: SCAFFOLD's corrected direction, c − c_i = g_s − g_i


@dataclass(frozen=True)
class FedCLGS(FedAvg):
    """FedCLG-S: FedAvg's clients; the server corrects each Δ_i by K_i η_l (g_s − g_i) before the mean (module
    docstring), then line 10.

    Attributes: global_lr: η_g (default √S).
    """

    name: str = field(default="fedclg_s", init=False)

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        g_s, g_i = ctx.extra["server_grad"], ctx.extra["start_grad"]  # [..] and stacked [S, ..]
        d = deltas(x, finals)
        scale = ctx.steps.to(weights.device, torch.float64) * ctx.local_lr  # K_i η_l, [S]
        corrected = {n: v - scale.to(v.dtype).reshape(-1, *([1] * (v.dim() - 1))) * (g_s[n] - g_i[n])
                     for n, v in d.items()}
        mean = weighted_mean(corrected, weights)
        return {n: p + self.global_lr * mean[n] for n, p in x.items()}, state


SPECS = (
    Spec("fedclg_c", FedCLGC, server_learning="incremental", needs_server_data=True, sends=("server_grad",),
         measures=("start_grad",), comm_factor=1.5, title="FedCLG-C",
         summary="FedCLG-C: FSL whose clients' steps are corrected by the server's gradient, g_s − g_i"),
    Spec("fedclg_s", FedCLGS, server_learning="incremental", needs_server_data=True, reply=("start_grad",),
         server_measures=("server_grad",), comm_factor=1.5, title="FedCLG-S",
         secagg_refused="corrects each client's update by its own K_i·η_l·(g_s − g_i), which needs each client's "
                        "gradient and steps",
         momentum_refused="corrects each Δ_i by K_i·η_l·(g_s − g_i), plain SGD's displacement under a constant "
                          "gradient, which momentum scales by up to 1/(1 − μ_c)",
         summary="FedCLG-S: FSL whose aggregation corrects each Δ_i by K_i η_l (g_s − g_i)"),
)
