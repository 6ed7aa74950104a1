"""FedBN (Li et al., ICLR 2021): each client keeps its own BatchNorm layers; every other parameter is federated.

A wrapper of any server rule, as ``ClientOptimizer`` wraps a client half (``model.batchnorm = "local"``):

    client i:  y_0 = x_t with the BatchNorm parameters (γ, β) replaced by client i's own, b_i
               (x_0's until its first round), then the rule's client half from y_0;
               b_i⁺ = its final model's γ, β (kept in its state, ``NORM_STATE``);
               x_i sent back = its final model with x_t's γ, β, so that Δ_i = 0 there
    server:    the rule's update, unchanged: the clients' BatchNorm parameters never reach it (server learning,
               when on, still trains the server's own γ, β on D0)

The statistics a BatchNorm layer normalises by in training are its batch's (``fedsl.models.batchnorm``); a
client's model is evaluated with statistics estimated on its own training samples (``Simulator.evaluate``). FedBN's
paper keeps the running statistics local too; here they are recomputed at evaluation, as every mode does.

This module imports only ``base``: it composes with every rule built on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedsl.algorithms.base import Carry, LocalSGD
from fedsl.core.types import Params, State

NORM_STATE = "local_norm"  # a client's state key for its own BatchNorm parameters


@dataclass(frozen=True)
class LocalNorm(LocalSGD):
    """``rule`` with the parameters ``names`` (the model's BatchNorm γ, β) kept by each client (FedBN).

    Attributes:
        rule: the server rule (its two halves), run as it is on every other parameter.
        names: the parameters each client keeps: not averaged, never sent.
    """

    rule: Any
    names: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:  # the rule's own attributes (name, global_lr, its hyper-parameters)
        if name in ("rule", "names") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.rule, name)

    @property
    def local_loss(self):  # the rule's term of the local loss, differentiated as the rule's
        return self.rule.local_loss

    @property
    def server_gamma(self):
        return self.rule.server_gamma

    @property
    def takes_own_step(self) -> bool:
        """Whether the rule's clients take their own local step (``ClientOptimizer`` then refuses momentum)."""
        return getattr(self.rule, "takes_own_step", type(self.rule).client_step is not LocalSGD.client_step)

    def personal(self, x: Params, client: State) -> Params:
        """x with client's own BatchNorm parameters in place of x's."""
        return {**x, **client[NORM_STATE]}

    def init_server_state(self, x: Params) -> State:
        return self.rule.init_server_state(x)

    def init_client_state(self, x: Params) -> State:
        """The rule's client state, and the client's own γ, β: x_0's until it trains."""
        return {**self.rule.init_client_state(x), NORM_STATE: {n: x[n] for n in self.names}}

    def client_init(self, x: Params, client: State, sent: State) -> tuple[Carry, State]:
        return self.rule.client_init(self.personal(x, client), _rule_part(client), sent)

    def direction(self, carry: Carry, aux: State, g: Params) -> Params:
        return self.rule.direction(carry, aux, g)

    def client_step(self, carry: Carry, aux: State, g: Params, lr) -> Carry:
        return self.rule.client_step(carry, aux, g, lr)

    def client_final(self, x: Params, client: State, sent: State, carry: Carry, steps, lr) -> tuple[Params, State]:
        x_i, new = self.rule.client_final(self.personal(x, client), _rule_part(client), sent, carry, steps, lr)
        own = {n: x_i[n] for n in self.names}
        return {**x_i, **{n: x[n] for n in self.names}}, {**new, NORM_STATE: own}

    def server_update(self, x: Params, state: State, finals: Params, weights, ctx) -> tuple[Params, State]:
        return self.rule.server_update(x, state, finals, weights, ctx)


def _rule_part(client: State) -> State:
    return {k: v for k, v in client.items() if k != NORM_STATE}


def norm_parameters(names: list[str], params: list[str]) -> tuple[str, ...]:
    """The parameters of the BatchNorm layers ``names`` (``FunctionalModel.norm_names``) among the parameter names
    ``params`` (``FunctionalModel.names``)."""
    return tuple(p for p in params if p.rpartition(".")[0] in names)
