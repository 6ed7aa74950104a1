"""A federated algorithm: a rule's two halves composed with the clients' schedule and the server's steps.

``Algorithm`` is what the engines and the Flower apps run: the rule (``base.ServerRule``: FedAvg, SCAFFOLD,
FedDyn, ...), the clients' LocalSGD schedule (η_l, B, E_c or K), and what the server's round
(``server_round``) puts around the rule's ``server_update``: a robust aggregate (``robust``) and DP-FedAvg's
private aggregate (``privacy``) before it, server learning on D0 after it (``server_learning``: K0 steps of
γ_t·η0, FSL) or beside it (FSL-p), and FedDF's ensemble distillation on unlabelled data between the two
(``distillation``). The paper's variants are compositions: FSL = FedAvg + incremental server
learning; FSL-p = FedAvg + the server as one more client; DS = FedAvg on D_i ∪ D0 (``share_server_data``).
``fedsl.algorithms.make_algorithm`` builds one from its name and ``Spec``.

It sits above the pieces it composes (``base``, ``spec``, ``server_learning``, ``robust``, ``privacy``,
``distillation``) and below the server's round that runs it (``server_round``), so none of those pieces needs to
know it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsl.algorithms.base import LocalSGD, LocalTraining, ServerRule
from fedsl.algorithms.distillation import Distillation
from fedsl.algorithms.privacy import DifferentialPrivacy
from fedsl.algorithms.robust import Robust
from fedsl.algorithms.server_learning import ServerLearning
from fedsl.algorithms.spec import Spec


@dataclass(frozen=True)
class Algorithm:
    """A federated algorithm: a rule and what composes with it (see the module docstring).

    Attributes:
        name: e.g. "fedavg", "fsl", "scaffold", "feddyn+sl".
        local: the clients' LocalSGD schedule (η_l, B, E, K) and optimiser (momentum μ_c, weight decay λ).
        rule: the algorithm's two halves (FedAvg, SCAFFOLD, FedDyn, FedProx, FedAvgM, FedAdam, FedNova).
        weighted: weight Δ_i by n_i instead of the plain mean of Algorithm 1.
        server_learning: SL on D0 after (incremental) or beside (parallel) aggregation.
        share_server_data: DS, clients train on D_i ∪ D0.
        privacy: DP-FedAvg's clipped, noised mean of the clients' updates before the rule reads them
            (``fedsl.algorithms.privacy``; None: off).
        spec: what outside the arithmetic depends on the algorithm (stacking, Flower, defaults).
        robust: a robust aggregate of the clients' updates before the rule's mean (``robust.robust_results``);
            None: the rule's own aggregation.
        distillation: FedDF's ensemble distillation of the round's client models into x̄_t on unlabelled server
            data, before server learning (``distillation``; None: off).
    """

    name: str
    local: LocalTraining
    rule: ServerRule
    weighted: bool = False
    server_learning: ServerLearning | None = None
    share_server_data: bool = False
    privacy: DifferentialPrivacy | None = None
    spec: Spec | None = None  # the algorithm's spec (fedsl.algorithms.spec); set by make_algorithm
    robust: Robust | None = None  # a robust server rule (fedsl.algorithms.robust); None or "mean": none
    distillation: Distillation | None = None  # FedDF's fusion (fedsl.algorithms.distillation); None: off

    @property
    def client(self) -> LocalSGD:
        """The client half the engines run: the rule's, with the clients' momentum and weight decay of ``local``
        (``LocalTraining.client``; the rule itself when both are 0)."""
        return self.local.client(self.rule)

    @property
    def global_lr(self) -> float | None:
        """η_g of the rule (None for rules without one, e.g. FedDyn)."""
        return getattr(self.rule, "global_lr", None)
