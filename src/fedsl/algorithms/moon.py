"""MOON (Li, He and Song, CVPR 2021, 'Model-Contrastive Federated Learning'): FedAvg whose clients add a
model-contrastive term to their local loss.

Client i, from y = x_t, minimises on each batch (weights w_j = 1/b)
    CE(y) + μ · Σ_j w_j ℓ_con,j,
    ℓ_con = -log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )
where z is y's representation of sample j (the model's ``features``: the input of its last linear
layer), z_glob that of the round's global model x_t, z_prev that of the client's previous local
model (its final model of its last participation, a row of an [N, d] table like SCAFFOLD's c_i) and
sim the cosine similarity. z_glob and z_prev come from frozen models: no dropout, no gradient.
The server averages as FedAvg, x ← x + η_g · mean_i (y_i - x); MOON averages the models (η_g = 1).

Choices where the paper is silent or differs from this engine:
- first participation: z_prev is x_t's representation (no previous model yet), so z_prev = z_glob,
  ℓ_con = log 2 for every y and the term has no gradient (the paper's code has no previous model in
  round 1 either, and its term is 0 there); afterwards the client's own last model.
- the representation is the model's own penultimate layer (``fedsl.models.cnn.Classifier``); the paper
  adds a projection head to its networks, which would change the models fedsl shares with FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fedsl.algorithms.base import Carry, LocalBatch, zeros_like
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.spec import HyperParam, Range, Spec
from fedsl.core.types import Params, State


@dataclass(frozen=True)
class Moon(FedAvg):
    """FedAvg's server; clients add μ·ℓ_con (module docstring) to the cross-entropy.

    Attributes:
        global_lr: η_g (MOON: 1, the mean of the clients' models).
        moon_mu: μ, the weight of the contrastive term (μ = 0 is FedAvg).
        moon_tau: τ, the temperature of the similarities.
    """

    moon_mu: float  # defaults: SPEC
    moon_tau: float
    name: str = field(default="moon", init=False)

    def init_client_state(self, x: Params) -> State:
        # prev: the client's last local model; seen: 1 once it has one (before: x_t stands in for it)
        first = next(iter(x.values()))
        return {"prev": zeros_like(x), "seen": {"flag": torch.zeros((), dtype=first.dtype, device=first.device)}}

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        seen = client["seen"]["flag"] > 0
        prev = {n: torch.where(seen, client["prev"][n], p) for n, p in x.items()}
        return {"y": x}, {"global": x, "prev": prev}

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr) -> tuple[Params, State]:
        y = carry["y"]
        return y, {"prev": y, "seen": {"flag": torch.ones_like(client["seen"]["flag"])}}

    def local_loss(self, y: Params, aux: State, batch: LocalBatch) -> torch.Tensor:
        """μ · Σ_j w_j ℓ_con,j, with ℓ_con = log(e^{s_g/τ} + e^{s_p/τ}) - s_g/τ (the paper's -log softmax)."""
        if batch.features is None:  # the runner refuses such a config before any work; this guards direct use
            raise ValueError("algorithm 'moon' reads the model's representation z: expected a model with methods "
                             "features(x) -> z and head(z) -> logits (fedsl.models.has_representation)")
        z = batch.features.flatten(1)
        glob = F.cosine_similarity(z, batch.represent(aux["global"]).flatten(1), dim=-1) / self.moon_tau
        prev = F.cosine_similarity(z, batch.represent(aux["prev"]).flatten(1), dim=-1) / self.moon_tau
        return self.moon_mu * ((torch.logaddexp(glob, prev) - glob) * batch.weights).sum()


SPEC = Spec("moon", Moon, (HyperParam("moon_mu", 1.0, "μ", "MOON contrastive-loss weight (paper: 1)", ge=0,
                                      search=Range(0.01, 10.0, log=True)),
                           HyperParam("moon_tau", 0.5, "τ", "MOON temperature (paper: 0.5)", gt=0)),
            global_lr=1.0, parallel_ok=True, local_keys=("moon_mu", "moon_tau"), needs_representation=True,
            # seen: one number per client, counted as d (memory plans err on the safe side)
            client_state=("prev", "seen"),
            summary="MOON: FedAvg with a model-contrastive term μ·ℓ_con on the representations in the local loss")
