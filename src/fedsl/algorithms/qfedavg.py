"""q-FedAvg (Li, Sanjabi, Beirami & Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020, Algorithm 2):
FedAvg's clients, a server step that weighs each client by a power of its loss.

Client k ∈ S_t trains from x_t as FedAvg's (LocalSGD) and reports, beside x_k, F_k = F_k(x_t): its mean loss on its
data at the model it received, before training (the authors' code, ``fair_flearn``'s qffedavg: the loss on the
client's whole training data at the global model). With L = 1/η_l (the authors' estimate of the Lipschitz constant,
the inverse of the local step size), the server computes

    Δw_k = L (x_t − x_k)
    Δ_k  = F_k^q Δw_k
    h_k  = q F_k^(q−1) ‖Δw_k‖² + L F_k^q
    x_{t+1} = x_t − Σ_k Δ_k / Σ_k h_k

(F_k + 1e-10 in the powers, as the authors' code and Flower's QFedAvg, so that F_k = 0 with q < 1 stays finite).
q = 0 is FedAvg with η_g = 1 (h_k = L for every k: x_t + mean_k (x_k − x_t)); a larger q moves the model toward the
clients of larger loss (the q-FFL objective Σ_k p_k F_k^(q+1)/(q+1)). fedsl samples clients uniformly (Algorithm 1 of
the FSL paper), so p_k = 1/N here, where the q-FFL paper samples them with probability n_k/n; ``algorithm.weighted``
is not read (the rule's weights are its own).

Defaults: q = 0.1 (Flower's QFedAvg; the paper tunes q per dataset, e.g. q = 5 on Vehicle in the authors' README,
and has no default). L = 1/η_l as the authors' code and Flower's ``client_learning_rate``. Which choices are ours:
the loss F_k is the model's cross-entropy on D_i without dropout (the evaluation's forward pass), reported by each
client (Flower's legacy QFedAvg used one server-side loss for every client, its message-API one the clients'
training loss).

What it composes with: server learning after the step (line 10, ``server.learning = 'incremental'``) and the robust
rules before it (every row x_t + Δ̂, each client's F_k kept). Not: FSL-p (the server's row has no F_0), SecAgg+
(the step needs each client's ‖Δw_k‖² and F_k), DP-FedAvg (F_k is not protected), an open Flower federation (stock
clients report no F_k(x_t)): each refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsl.algorithms.base import LocalSGD, RoundContext, deltas, weighted_mean
from fedsl.algorithms.spec import HyperParam, Range, Spec
from fedsl.core.types import Params, State

LOSS_FLOOR = 1e-10  # added to F_k in its powers (the authors' code and Flower's)


@dataclass(frozen=True)
class QFedAvg(LocalSGD):
    """The server step of q-FedAvg (module docstring); the clients are FedAvg's.

    Attributes: q: the fairness exponent (0: FedAvg with η_g = 1; default ``SPEC``'s).
    """

    q: float
    name: str = field(default="qfedavg", init=False)

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        assert "start_loss" in ctx.extra, "q-FedAvg reads each client's F_k(x_t): RoundContext.extra['start_loss']"
        lip = 1.0 / ctx.local_lr  # L = 1/η_l
        d = deltas(x, finals)  # x_k − x_t = −Δw_k / L
        loss = ctx.extra["start_loss"].to(torch.float64) + LOSS_FLOOR
        sq = sum((v.to(torch.float64) ** 2).flatten(1).sum(1) for v in d.values())  # ‖x_k − x_t‖², [S]
        fq = loss ** self.q
        h = self.q * loss ** (self.q - 1) * lip ** 2 * sq + lip * fq  # h_k, with ‖Δw_k‖² = L²‖x_k − x_t‖²
        step = weighted_mean(d, lip * fq / h.sum())  # −Σ Δ_k / Σ h = Σ_k L F_k^q (x_k − x_t) / Σ h
        return {n: p + step[n] for n, p in x.items()}, state


SPEC = Spec("qfedavg", QFedAvg, (HyperParam("q", 0.1, "q", "q-FedAvg fairness exponent (0: FedAvg)", ge=0,
                                                  search=Range(0.0, 5.0, hard_low=True)),),
            global_lr=None, reply=("start_loss",), title="q-FedAvg",
            secagg_refused="weights each client's update by its own loss F_k(x_t)^q over Σ h_k, which needs each "
                           "client's update norm",
            momentum_refused="reads L·(x_t − x_k), L = 1/η_l, as the client's gradient, plain SGD's scale, which "
                             "momentum changes by up to 1/(1 − μ_c)",
            summary="q-FedAvg: clients weighted by F_k(x_t)^q, step 1/Σ h_k (fair resource allocation)")
