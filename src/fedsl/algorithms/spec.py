"""One spec per algorithm: what config validation, defaults, stacking and Flower need to know.

Each algorithm file ends with its ``SPEC`` (or several: ``fedavg.py`` holds FedAvg, FSL,
FSL-p and DS, which share FedAvg's rule); ``fedsl.algorithms.SPECS`` collects them. A new
algorithm is one file with its two halves (``base``) and a spec, plus its module in
``algorithms/__init__.py``'s registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal


@dataclass(frozen=True)
class HyperParam:
    """A rule's own hyper-parameter: its config key (``algorithm.KEY``), default, paper symbol,
    and the bounds config validation applies (``ge``/``gt`` below, ``lt``/``le`` above; None = none).

    ``default`` is the only place the default is written: the rule's dataclass has none (``make_rule``
    fills it in from here) and config's ``[algorithm]`` field takes it from here."""

    key: str
    default: float
    symbol: str
    meaning: str
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    le: float | None = None


@dataclass(frozen=True)
class Spec:
    """Everything outside the rule's arithmetic that depends on the algorithm.

    Attributes:
        name: ``algorithm.name``.
        make_rule: the server rule from η_g and the hyper-parameters (keyword arguments).
        hyperparams: the rule's own hyper-parameters (config keys, defaults, symbols).
        global_lr: the default η_g: "sqrt_s" (the paper's √S), a number, or None when the
            rule has no server step size (FedDyn); the only place it is written.
        server_learning: "incremental" (FSL: Algorithm 1's server step after aggregation),
            "parallel" (FSL-p: the server as one more client), or "off" unless
            ``server.learning`` turns it on.
        needs_server_data: D0 is required (FSL, FSL-p, DS).
        shares_server_data: DS: clients train on D_i ∪ D0.
        parallel_ok: FSL-p's server "client" may join this rule's mean of updates (``server.learning =
            'parallel'``; read for rules whose ``server_learning`` is "off": FSL and FSL-p fix their own).
        sends: server state the clients read (``sent`` of the client functions), sent with the
            model in a deployment (Flower): SCAFFOLD's c (for c - c_i).
        client_state: the state each client keeps between its rounds (``init_client_state``'s keys), one
            table of N × d numbers each: SCAFFOLD's c_i, FedDyn's ∇L_i; () = stateless clients.
        local_keys: hyper-parameters that enter the clients' steps (stacked runs must share
            them: one vmapped step takes one value).
        comm_factor: parameters moved per client and direction, in units of d (SCAFFOLD: 2).
        needs_representation: the rule's ``local_loss`` reads the model's representation z (MOON): a
            model without one (``fedsl.models.has_representation``) is a configuration error.
    """

    name: str
    make_rule: Callable[..., Any]
    hyperparams: tuple[HyperParam, ...] = ()
    global_lr: Literal["sqrt_s"] | float | None = "sqrt_s"
    server_learning: Literal["off", "incremental", "parallel"] = "off"
    needs_server_data: bool = False
    shares_server_data: bool = False
    parallel_ok: bool = False
    sends: tuple[str, ...] = ()
    client_state: tuple[str, ...] = ()
    local_keys: tuple[str, ...] = ()
    comm_factor: int = 1
    needs_representation: bool = False
    summary: str = field(default="", compare=False)

    def default_global_lr(self, clients_per_round: int) -> float | None:
        """η_g when the config leaves it unset."""
        if self.global_lr == "sqrt_s":
            return math.sqrt(clients_per_round)
        return self.global_lr

    def defaults(self) -> dict[str, float]:
        return {h.key: h.default for h in self.hyperparams}

    def server_mode(self, learning: str) -> str:
        """The server learning this rule runs with under ``server.learning = learning``: "auto" is the
        spec's own (FSL: "incremental", FSL-p: "parallel", the others "off"). Whether the two compose is
        ``fedsl.algorithms.check_server_learning``'s question (config validation asks it)."""
        return self.server_learning if learning == "auto" else learning
