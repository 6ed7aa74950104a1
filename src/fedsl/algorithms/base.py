"""An algorithm owns its round: a client half and a server half, pure functions over explicit state.

One round of any algorithm here (FedJAX's ``fed_avg.py`` shape; the paper's Algorithm 1):

    client i ∈ S:  (x_i, client_state_i⁺) = client_update(x_t, client_state_i, sent, batches of D_i)
    server:        x̄, server_state⁺       = rule.server_update(x_t, server_state, {x_i}, weights, ctx)
                   x_{t+1}                 = K0 SGD steps on D0 from x̄ (server_round.py, line 10)

The client half is three pure functions so that an engine can run it for one client (a loop, as
``client_update`` below does; a Flower ClientApp) or for many at once (``torch.func.vmap`` over
stacked clients and runs, padded steps masked):

- ``client_init(x, client_state, sent) -> (carry, aux)``: the local model y (``carry["y"]``) and
  optimiser buffers that change every step, and what stays fixed over the round (``aux``: a
  control-variate correction, a proximal anchor).
- ``client_step(carry, aux, g, lr) -> carry``: one local step, given the gradient g of the batch
  loss at ``carry["y"]`` (computed by the engine from the model) and η_l. LocalSGD's is
  y ← y - η_l·d with d = ``direction(carry, aux, g)``: g plus the rule's correction (FedProx's
  μ(y - x_t), SCAFFOLD's c - c_i), so that a rule which only corrects the gradient overrides
  ``direction`` and the clients' optimiser (``ClientOptimizer``: momentum, weight decay) wraps it.
- ``client_final(x, client_state, sent, carry, steps, lr) -> (x_i, client_state⁺)``: the model sent
  back and the client's new state (SCAFFOLD's c_i⁺, FedDyn's ∇L_i⁺), after ``steps`` = K_i steps.

The server half is ``server_update``; it reads the clients' models, never their state (each client
keeps its own: a row of an [N, ...] table in the simulator, ``context.state`` on a Flower node).
``sent`` is the part of the server state the clients read (the spec's ``sends``: SCAFFOLD's c).

A rule may also change the loss a client differentiates: ``local_loss(y, aux, batch) -> term``
(None by default) is added by the engine to the batch's cross-entropy inside the function it takes
the gradient of (vmapped over clients, captured in CUDA graphs like the rest of a step). It is a
pure function of the local model y, what ``client_init`` fixed for the round (``aux``: x_t, the
client's state, ``sent``) and the batch with the model's outputs on it (``LocalBatch``: logits,
representation z, and z of the same inputs under other parameters, e.g. x_t). MOON is one.

A rule may also set line 10's step size from the round itself: ``server_gamma(γ_t, x̄_t, results, t,
server_learning, n0, label_counts, d0_accuracy) -> γ_t'`` (None by default: line 10 takes the γ schedule's
γ_t as it is). The server's round (``server_round``) calls it after the rule's update; FedDU is one.

``LocalSGD`` is the paper's client (plain SGD, no state); rules inherit it and override what
differs. Variants of the paper are compositions: FSL = FedAvg + incremental server learning;
FSL-p = FedAvg + the server as one more client; DS = FedAvg on D_i ∪ D0; server learning composes
with SCAFFOLD, FedDyn, FedProx, FedAvgM, FedAdam and FedNova alike (``algorithm.Algorithm`` composes them).

This module is the bottom of ``fedsl.algorithms``: of the package it imports only ``defaults`` (the paper's
default values, which import nothing), so that the rules,
the robust and private aggregates and the composed ``Algorithm`` all build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from fedsl.algorithms.defaults import LOCAL_EPOCHS
from fedsl.core.types import Params, State

Carry = dict[str, Params]  # what a client's local steps change: {"y": local model, ...optimiser buffers}


@dataclass
class RunState:
    """What carries from one round to the next (and is checkpointed).

    Attributes:
        x: the global model x_t.
        algo: the server rule's state (SCAFFOLD's c, FedDyn's h, momentum, ...).
        gamma: the adaptive γ schedule's current γ_t (None for schedules that are functions of t).
        clients: the clients' states as [N, ...] tables, one row per client (SCAFFOLD's c_i, FedDyn's
            ∇L_i), or a sparse store of the rows of the clients sampled so far (``fedsl.engine.client_state``,
            which the engine reads and writes); empty for stateless clients and on a deployment's server (clients
            keep their own).
        clip: DP's clip norm C_t under adaptive clipping (``fedsl.algorithms.privacy``), once a round has adapted it;
            None: ``privacy.clip`` (C_0, or the fixed C), or no DP.
    """

    x: Params
    algo: State = field(default_factory=dict)
    gamma: float | None = None
    clients: State = field(default_factory=dict)
    clip: float | None = None

    def server_part(self) -> "RunState":
        """The state less the clients' tables: what a deployment's server keeps (its clients keep theirs) and what a
        checkpoint of a run that nothing resumes holds."""
        return replace(self, clients={})

    def with_x(self, x: Params) -> "RunState":
        """The same state at another model x (x_0 given to a deployment, a layout for the engine)."""
        return replace(self, x=x)

    def moved(self, to: Callable[[torch.Tensor], torch.Tensor], clients: State | None = None) -> "RunState":
        """The state with ``to`` applied to every tensor of x and of the rule's state (a device, a dtype), and the
        clients' tables ``clients`` (None: none)."""
        def tree(d: dict) -> dict:
            return {k: tree(v) if isinstance(v, dict) else to(v) for k, v in d.items()}
        return replace(self, x=tree(self.x), algo=tree(self.algo), clients=clients or {})


@dataclass
class RoundContext:
    """What a server rule may need besides the models."""

    local_lr: float | torch.Tensor  # η_l (a 0-d tensor when an engine vmaps the rule over stacked runs)
    steps: torch.Tensor  # K_i, real local steps of each client whose model is aggregated [S]
    num_clients: int  # N
    # what the rule's spec declares beyond the models: each client's ``reply`` (one row per client: [S] float64, or
    # stacked like x) and the server's ``server_measures`` at x_t (shaped like x), by name
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientResults:
    """The clients' replies of one round, in client-id order (what a server update reads).

    Attributes:
        params: the final models x_i, stacked [S, ...].
        sizes: n_i, the clients' data sizes (D_i ∪ D0 for DS), for weighted means and FSL-p's w0.
        steps: K_i, the local steps each client took.
        ids: the clients' ids i (FedDU reads their label counts; empty where the caller does not say).
        extra: what the clients of a rule whose spec declares a ``reply`` send beside x_i, by the measure's name
            (``spec.CLIENT_MEASURES``): one number each ([S] float64: q-FedAvg's F_i(x_t)) or a tensor shaped like
            x each (stacked [S, ...]: FedCLG-S's ∇F_i(x_t)); empty otherwise.
    """

    params: Params
    sizes: list[int]
    steps: tuple[int, ...]
    ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def stack_reply(values: list, device: torch.device | str | None = None):
    """One declared reply field of S clients stacked as ``ClientResults.extra`` holds it: numbers as [S] float64,
    parameters (dicts of tensors shaped like x) as [S, ...] per name."""
    if values and isinstance(values[0], dict):
        return {n: torch.stack([v[n] for v in values]).to(device) for n in values[0]}
    return torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)


@dataclass
class LocalBatch:
    """One batch as a rule's ``local_loss`` sees it (built by the engine at every local step).

    Attributes:
        inputs: the batch's inputs [b, ...].
        labels: their labels [b].
        weights: w_j = 1/b on real samples, 0 on padding: a term Σ_j w_j ℓ_j is the batch mean,
            weighted as the cross-entropy is.
        logits: the local model y's outputs [b, classes] (training mode: the step's dropout mask).
        features: y's representation z [b, ...] (the model's ``features``; None for a model without one).
        represent: z of the same inputs under other parameters (e.g. x_t), without dropout (a frozen
            model, as MOON evaluates its global and previous models); None for a model without one.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor
    logits: torch.Tensor
    features: torch.Tensor | None = None
    represent: Callable[[Params], torch.Tensor] | None = None


def sgd(y: Params, g: Params, lr) -> Params:
    """y - η·g."""
    return {n: p - lr * g[n] for n, p in y.items()}


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


def client_weights(sizes: list[int], weighted: bool) -> torch.Tensor:
    """w_i: 1/S each (Algorithm 1), or n_i / Σ n_j when ``weighted``."""
    s = torch.tensor(sizes, dtype=torch.float64)
    return s / s.sum() if weighted else torch.full_like(s, 1.0 / len(sizes))


class LocalSGD:
    """The paper's client (Algorithm 1, lines 4-6): K steps y ← y - η_l·g(y) from y = x_t; no state.

    Server rules inherit it and override what differs (their own server state, a corrected
    step, a client state, a term of the local loss); see the module docstring for the three client
    functions and ``local_loss``.
    """

    # A rule's term of the local loss, ``local_loss(y, aux, batch: LocalBatch) -> 0-d tensor``, or None: the
    # model's cross-entropy alone (see the module docstring). A method in the rules that have one (MOON).
    local_loss: Callable[[Params, State, LocalBatch], torch.Tensor] | None = None
    # A rule's γ_t for line 10 from the round, ``server_gamma(gamma, x_bar, results, t, sl, n0, counts,
    # d0_accuracy) -> float``, or None: the γ schedule's γ_t (see the module docstring). A method in the rules
    # that have one (FedDU); its arguments are typed there (``feddu.FedDU.server_gamma``), since this module sits
    # below server learning's settings and the label counts.
    server_gamma: Callable[..., float] | None = None

    def init_server_state(self, x: Params) -> State:
        """The server's state at round 0 (default: none)."""
        return {}

    def init_client_state(self, x: Params) -> State:
        """One client's state at round 0 (default: none); the simulator keeps N of them."""
        return {}

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        return {"y": x}, {}

    def direction(self, carry: Carry, aux: State, g: Params) -> Params:
        """d, what a local step descends along: the batch gradient g at ``carry["y"]`` plus the rule's correction
        (none here; FedProx's μ(y - x_t), SCAFFOLD's c - c_i). A rule that only corrects the gradient overrides
        this, not ``client_step``, so that the clients' momentum (``ClientOptimizer``) composes with it."""
        return g

    def client_step(self, carry: Carry, aux: State, g: Params, lr) -> Carry:
        return {"y": sgd(carry["y"], self.direction(carry, aux, g), lr)}

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr) -> tuple[Params, State]:
        return carry["y"], {}


LOCAL_SGD = LocalSGD()  # the server's own SGD on D0 (line 10, pretraining) is this client's


def client_update(client: LocalSGD, x: Params, state: State, sent: State, batches: Iterable[Any],
                  grad: Callable[[Params, Any], Params], lr) -> tuple[Params, State, dict[str, int]]:
    """One client's round: ``client_init``, a ``client_step`` per batch, ``client_final``.

    Args:
        client: the algorithm (its client half).
        x: x_t, the model the server sent.
        state: this client's state (its row of the tables; {} for stateless clients).
        sent: the server state the clients read (SCAFFOLD's c).
        batches: the client's batches of D_i, in order (K_i of them).
        grad: the gradient of the client's loss on a batch at y, ``grad(y, batch, aux)`` (the engine's: the
            model's cross-entropy plus the rule's ``local_loss`` term, which reads ``aux``).
        lr: η_l.
    Returns:
        (x_i, the client's new state, metrics: ``steps`` = K_i).
    """
    carry, aux = client.client_init(x, state, sent)
    steps = 0
    for batch in batches:
        carry = client.client_step(carry, aux, grad(carry["y"], batch, aux), lr)
        steps += 1
    x_i, new_state = client.client_final(x, state, sent, carry, steps, lr)
    return x_i, new_state, {"steps": steps}


class ServerRule(Protocol):
    """An algorithm's two halves (``LocalSGD`` gives the client half of the paper's client)."""

    name: str
    local_loss: Callable[[Params, State, LocalBatch], torch.Tensor] | None
    server_gamma: Callable[..., float] | None

    def init_server_state(self, x: Params) -> State: ...

    def init_client_state(self, x: Params) -> State: ...

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]: ...

    def client_step(self, carry: Carry, aux: State, g: Params, lr) -> Carry: ...

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr
                     ) -> tuple[Params, State]: ...

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]: ...


@dataclass(frozen=True)
class LocalTraining:
    """Client LocalSGD: K steps of SGD with step size η_l on batches of B.

    Attributes:
        lr: η_l, client learning rate.
        batch_size: B.
        epochs: E_c, local epochs (paper: 1); K = E_c·⌈n_i/B⌉.
        steps: K, local steps; overrides ``epochs`` when set.
        momentum: μ_c, the clients' heavy-ball momentum (``algorithm.client_momentum``; 0: the paper's plain SGD);
            its buffer lives within a round (``ClientOptimizer``).
        weight_decay: λ, L2 weight decay added to the clients' gradients (``algorithm.weight_decay``; 0: none).
    """

    lr: float
    batch_size: int
    epochs: int = LOCAL_EPOCHS
    steps: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0

    def client(self, rule: LocalSGD) -> LocalSGD:
        """The client half the engines run for ``rule``: the rule itself with plain SGD (μ_c = λ = 0, the paper's,
        the same objects and operations as before these settings existed), else wrapped in ``ClientOptimizer``."""
        if self.momentum == 0 and self.weight_decay == 0:
            return rule
        return ClientOptimizer(rule, self.momentum, self.weight_decay)


MOMENTUM_BUFFER = "momentum_buffer"  # the carry's heavy-ball buffer (torch.optim.SGD's state name)


@dataclass(frozen=True)
class ClientOptimizer(LocalSGD):
    """A rule's client half whose local steps are PyTorch's SGD with momentum and weight decay.

    At each local step, from the batch gradient g at y (``torch.optim.SGD`` with ``dampening = 0``,
    ``nesterov = False``; its documented update):

        g' = g + λ·y                            weight decay, added first, as torch.optim.SGD does
        d  = rule.direction(carry, aux, g')     the rule's correction (FedProx's μ(y - x_t), SCAFFOLD's c - c_i)
        b  ← μ_c·b + d                          the heavy-ball buffer, b = 0 before the round's first step
        y  ← y - η_l·b

    The buffer lives in the carry, so it starts at 0 at each round's first local step and is dropped after the last:
    no client state across rounds, as a client that builds a fresh ``torch.optim.SGD`` each round (Flower's PyTorch
    clients) has (its first step sets b = d, which μ_c·0 + d is). With μ_c = 0 the step is the rule's own
    ``client_step`` on g' (FedNova's heavy-ball ρ then takes g + λ·y, as PyTorch would).

    Attributes:
        rule: the algorithm's client half (``LocalSGD`` or a rule built on it).
        momentum: μ_c ∈ [0, 1).
        weight_decay: λ ≥ 0.
    Raises:
        ValueError: a value out of range, or μ_c > 0 with a rule that takes its own step (overrides
            ``client_step``, as FedNova's heavy-ball clients do): its arithmetic has no place for a second buffer.
    """

    rule: LocalSGD
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        mu, wd = self.momentum, self.weight_decay
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 <= mu < 1:
            raise ValueError(f"algorithm.client_momentum = {mu!r}: expected a number in [0, 1)")
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not 0 <= wd < float("inf"):
            raise ValueError(f"algorithm.weight_decay = {wd!r}: expected a finite number >= 0")
        if mu and getattr(self.rule, "takes_own_step", type(self.rule).client_step is not LocalSGD.client_step):
            raise ValueError(f"algorithm.client_momentum = {mu!r}: {type(self.rule).__name__}'s clients take their own "
                             "local step, which has no place for the momentum buffer: expected 0")

    @property
    def name(self) -> str:
        return getattr(self.rule, "name", type(self.rule).__name__)

    @property
    def local_loss(self):  # the rule's term of the local loss: the engine differentiates it as the rule's
        return self.rule.local_loss

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        carry, aux = self.rule.client_init(x, client, sent)
        if self.momentum:
            carry = {**carry, MOMENTUM_BUFFER: {n: torch.zeros_like(p) for n, p in x.items()}}
        return carry, aux

    def decayed(self, y: Params, g: Params) -> Params:
        """g + λ·y (g itself when λ = 0)."""
        if not self.weight_decay:
            return g
        return {n: g[n] + self.weight_decay * p for n, p in y.items()}

    def direction(self, carry: Carry, aux: State, g: Params) -> Params:
        return self.rule.direction(carry, aux, self.decayed(carry["y"], g))

    def client_step(self, carry: Carry, aux: State, g: Params, lr) -> Carry:
        if not self.momentum:
            return self.rule.client_step(carry, aux, self.decayed(carry["y"], g), lr)
        d = self.direction(carry, aux, g)
        buf = {n: self.momentum * carry[MOMENTUM_BUFFER][n] + d[n] for n in carry["y"]}
        return {**carry, "y": sgd(carry["y"], buf, lr), MOMENTUM_BUFFER: buf}

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr) -> tuple[Params, State]:
        own = {k: v for k, v in carry.items() if k != MOMENTUM_BUFFER}  # the rule's carry, as it made it
        return self.rule.client_final(x, client, sent, own, steps, lr)
