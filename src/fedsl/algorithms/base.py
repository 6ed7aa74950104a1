"""An algorithm as data: a client rule, a server rule, and optional server learning.

The engine runs one round as: sample S clients -> LocalSGD on each (``LocalTraining``)
-> ``server_update`` (FedAvg's rule) -> server learning (if any). Variants of the
paper are compositions of these pieces (see ``fedsl.algorithms``):
FSL = FedAvg + incremental server learning; FSL-p = FedAvg + the server as one more
client; DS = FedAvg on D_i ∪ D0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedsl.algorithms import fedavg
from fedsl.algorithms.server_learning import ServerLearning
from fedsl.engine.functional import Params


@dataclass(frozen=True)
class LocalTraining:
    """Client LocalSGD: K steps of SGD with step size η_l on batches of B.

    Attributes:
        lr: η_l, client learning rate.
        batch_size: B.
        epochs: E_c, local epochs (paper: 1); K = E_c·⌈n_i/B⌉.
        steps: K, local steps; overrides ``epochs`` when set.
    """

    lr: float
    batch_size: int
    epochs: int = 1
    steps: int | None = None


@dataclass(frozen=True)
class Algorithm:
    """A federated algorithm (see module docstring).

    Attributes:
        name: "fedavg", "fsl", "fsl_p", "ds" (or a user's name).
        local: the clients' LocalSGD.
        global_lr: η_g, server step size on the mean update (paper: √S).
        weighted: weight Δ_i by n_i instead of the plain mean of Algorithm 1.
        server_learning: SL on D0 after (incremental) or beside (parallel) aggregation.
        share_server_data: DS, clients train on D_i ∪ D0.
    """

    name: str
    local: LocalTraining
    global_lr: float
    weighted: bool = False
    server_learning: ServerLearning | None = None
    share_server_data: bool = False

    def server_update(self, x: Params, client_params: Params, weights: torch.Tensor) -> Params:
        """x̄ = x + η_g Σ w_i Δ_i (FedAvg)."""
        return fedavg.aggregate(x, client_params, weights, self.global_lr)

    @property
    def uses_server_data(self) -> bool:
        return self.share_server_data or (self.server_learning is not None and self.server_learning.active)
