"""An algorithm as data: the clients' LocalSGD, a server rule, and optional server learning.

The engine runs one round as: sample S clients -> LocalSGD on each, with the rule's
gradient correction (``Correction``) -> the rule's ``update`` (aggregation and server
state) -> server learning on D0 (if any). Variants of the paper are compositions:
FSL = FedAvg + incremental server learning; FSL-p = FedAvg + the server as one more
client; DS = FedAvg on D_i ∪ D0; and server learning composes with SCAFFOLD, FedDyn,
FedProx, FedAvgM and FedAdam alike.

A server rule is a small frozen dataclass with three pure methods, in the spirit of
FedJAX's init/apply: ``init_state`` (server and per-client state, client state stacked
for all N clients), ``correction`` (what the sampled clients add to each local gradient)
and ``update`` (new global model and state from the clients' final models).

Per-client tables are the state entries whose name ends in ``_i`` ([N, ...]). ``update``
returns only the sampled clients' new rows for them ([S, ...]); the engine writes those
rows into the tables at the end of the round. Copying an N×d table every round would
cost more than the round (N = 1000 CIFAR clients: 2 GB). A rule with tables also has
``client_rows`` (the new rows alone, from what each client holds), which a deployed client
calls to keep its own row (Flower) and ``update`` uses for the sampled ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from fedsl.algorithms.server_learning import ServerLearning
from fedsl.algorithms.spec import Spec
from fedsl.core.types import Params, State


@dataclass
class Correction:
    """Added to every local gradient g of a sampled client: g + prox·(y - x_t) + linear_i.

    FedProx: prox = μ. SCAFFOLD: linear_i = c - c_i. FedDyn: prox = α, linear_i = -∇L_i.
    """

    prox: float = 0.0
    linear: Params | None = None  # stacked over the sampled clients [S, ...]

    @property
    def active(self) -> bool:
        return self.prox != 0.0 or self.linear is not None


@dataclass
class RoundContext:
    """What a server rule may need besides the models."""

    local_lr: float  # η_l
    steps: torch.Tensor  # K_i, real local steps of each sampled client [S]
    num_clients: int  # N


class ClientOptimizer(Protocol):
    """A client's local optimiser other than plain SGD (heavy-ball momentum, local Adam, ...).

    Pure functions over explicit per-client state, which the engine vmaps over clients (and
    stacked runs): ``init`` gives the state at the start of a round from the client's starting
    parameters (shape-agnostic: it may receive them stacked); ``step`` takes the (corrected)
    gradient g of one batch and returns the new parameters and state. A padded step (a
    batch of zero weight) is made a no-op by the engine.
    """

    def init(self, params: Params) -> Params: ...

    def step(self, params: Params, g: Params, state: Params, lr) -> tuple[Params, Params]: ...


class ServerRule(Protocol):
    name: str

    def init_state(self, x: Params, num_clients: int) -> State: ...

    def correction(self, x: Params, state: State, ids: torch.Tensor) -> Correction: ...

    def update(self, x: Params, finals: Params, weights: torch.Tensor, ids: torch.Tensor, state: State,
               ctx: RoundContext) -> tuple[Params, State]: ...


def is_client_table(key: str) -> bool:
    """Whether state entry ``key`` is a per-client table ([N, ...], one row per client): by the
    convention of this module's docstring, its name ends in ``_i`` (SCAFFOLD's c_i, FedDyn's grad_i)."""
    return key.endswith("_i")


def deltas(x: Params, finals: Params) -> Params:
    """Δ_i = x_i - x, stacked."""
    return {n: finals[n] - p for n, p in x.items()}


def weighted_mean(stacked: Params, weights: torch.Tensor) -> Params:
    """Σ_i w_i v_i over the leading dimension."""
    out = {}
    for n, v in stacked.items():
        out[n] = (weights.to(v.dtype).reshape(-1, *([1] * (v.dim() - 1))) * v).sum(0)
    return out


def zeros_like(x: Params, lead: tuple[int, ...] = ()) -> Params:
    return {n: torch.zeros(*lead, *p.shape, dtype=p.dtype, device=p.device) for n, p in x.items()}


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
        name: e.g. "fedavg", "fsl", "scaffold", "feddyn+sl".
        local: the clients' LocalSGD.
        rule: the server rule (FedAvg, SCAFFOLD, FedDyn, FedProx, FedAvgM, FedAdam).
        weighted: weight Δ_i by n_i instead of the plain mean of Algorithm 1.
        server_learning: SL on D0 after (incremental) or beside (parallel) aggregation.
        share_server_data: DS, clients train on D_i ∪ D0.
        spec: what outside the arithmetic depends on the algorithm (stacking, Flower, defaults).
        client_optimizer: the clients' local optimiser when it is not plain SGD (the
            correction, if any, is added to the gradient it receives).
    """

    name: str
    local: LocalTraining
    rule: ServerRule
    weighted: bool = False
    server_learning: ServerLearning | None = None
    share_server_data: bool = False
    spec: Spec | None = None  # the algorithm's spec (fedsl.algorithms.spec); set by make_algorithm
    client_optimizer: ClientOptimizer | None = None  # None: LocalSGD, the paper's client

    @property
    def global_lr(self) -> float | None:
        """η_g of the rule (None for rules without one, e.g. FedDyn)."""
        return getattr(self.rule, "global_lr", None)
