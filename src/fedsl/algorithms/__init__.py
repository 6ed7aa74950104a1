"""Algorithms, each owning its round: a client half and a server half (see ``base``).

- ``fedavg``: clients' LocalSGD, x̄ = x + η_g·mean Δ_i.
- ``fsl``: FedAvg + K0 server SGD steps on D0 with step γ·η0 (Algorithm 1).
- ``fsl_p``: FedAvg + the server as one more weighted client (non-incremental SL).
- ``ds``: FedAvg where clients train on D_i ∪ D0 (data sharing).
- ``feddu``: FedAvg + line 10 with a step γ_t set each round by FedDU's rule (FedDUAP);
  ``d0_only``: the control that drops the clients' updates and keeps line 10 (``feddu.py``).
- ``feddf``: FedAvg, then the ensemble of the round's client models distilled into their average on unlabelled
  server data (FedDF; ``distillation``); with server learning, line 10 follows (FedDF + FSL).
- ``scaffold``, ``feddyn``, ``fedprox``, ``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``, ``fednova``: the
  baselines;
  any of them composes with server learning (``server_learning``), e.g. SCAFFOLD + SL.
- ``qfedavg``: FedAvg's clients, each also reporting its loss F_k(x_t); the server weighs them by F_k^q (q-FedAvg).
- ``fedclg``: FSL whose server gradient ∇f0(x_t) corrects the clients' steps (FedCLG-C) or the aggregation of their
  updates (FedCLG-S); ``feddum``: FedDU with a global momentum on the aggregated update (FedDUM).
- ``robust``: robust server rules (median, trimmed mean, Krum, Bulyan, norm bounding, FLTrust) in front of any
  rule's mean of the clients' updates.

Each module ends with its ``Spec`` (``spec.py``); ``SPECS`` below is the registry that config
validation, defaults, stacking and Flower read. Server learning (Algorithm 1, line 10), FSL-p
and the γ schedules compose after any rule's server half in ``server_round``. A new
algorithm is one module (its two halves and a spec) and its entry in ``SPECS``.

The modules, from the bottom up (each imports from its own row or the rows above it, never in a loop;
``tests/test_layers.py`` checks that no import, even a type-only one, closes a loop):

- ``base`` (a rule's two halves, the round's state and replies, LocalSGD), ``spec``, ``gamma_schedule``,
  ``label_counts`` (the clients' and D0's class counts): they import nothing of the package;
- ``server_learning`` (γ, η0, B0, K0, FSL or FSL-p), ``robust``, ``privacy``, ``distillation`` (FedDF's settings
  and its distillation loop): settings and aggregates;
- the rules: ``fedavg``, ``fedprox``, ``fedopt``, ``scaffold``, ``feddyn``, ``fednova``, ``moon``,
  ``qfedavg``, ``feddu``, ``feddf``, ``fedclg``, ``feddum`` (which builds on ``feddu``);
- ``algorithm``: ``Algorithm``, a rule composed with the clients' schedule, server learning, a robust rule
  and privacy;
- ``server_round``: the server's round of an ``Algorithm`` (lines 8-10), what the engines and Flower call;
- this registry.

It may import ``core``, ``sources``, ``data`` (the clients' label counts) and ``models``; nothing that runs rounds.
"""

from __future__ import annotations

from dataclasses import replace

from fedsl.algorithms import (
    fedavg,
    fedclg,
    feddf,
    feddu,
    feddum,
    feddyn,
    fednova,
    fedopt,
    fedprox,
    moon,
    qfedavg,
    scaffold,
)
from fedsl.algorithms.algorithm import Algorithm
from fedsl.algorithms.base import (
    ClientResults,
    LocalSGD,
    LocalTraining,
    RoundContext,
    RunState,
    ServerRule,
    State,
    client_update,
)
from fedsl.algorithms.distillation import Distillation
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.feddyn import FedDyn
from fedsl.algorithms.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fedsl.algorithms.fedprox import FedProx
from fedsl.algorithms.gamma_schedule import GammaSchedule
from fedsl.algorithms.privacy import DifferentialPrivacy
from fedsl.algorithms.qfedavg import QFedAvg
from fedsl.algorithms.robust import Robust
from fedsl.algorithms.scaffold import Scaffold
from fedsl.algorithms.server_learning import Pretraining, ServerLearning
from fedsl.algorithms.spec import HyperParam, Spec, registry

# Every algorithm's spec, by name; a new algorithm adds its module here. ``registry`` refuses a name declared twice
# and a config key two rules declare differently (a rule's ``momentum = 0.5`` would change FedAvgM's β).
SPECS: dict[str, Spec] = registry((*fedavg.SPECS, *feddu.SPECS, fedprox.SPEC, *fedopt.SPECS, scaffold.SPEC, feddyn.SPEC,
                                   fednova.SPEC, moon.SPEC, qfedavg.SPEC, feddf.SPEC, *fedclg.SPECS, *feddum.SPECS))
ALGORITHMS = tuple(SPECS)


def spec(name: str) -> Spec:
    """The spec of algorithm ``name``; ValueError naming the known ones otherwise."""
    if name not in SPECS:
        raise ValueError(f"algorithm.name = {name!r}: expected one of {list(ALGORITHMS)}")
    return SPECS[name]


def make_rule(name: str, global_lr: float | None, **hp) -> ServerRule:
    """The server rule of algorithm ``name`` (fsl, fsl_p and ds use FedAvg's); ``hp`` its own
    hyper-parameters (missing ones take the spec's defaults)."""
    sp = spec(name)
    own = _own(sp, hp)
    return sp.make_rule(global_lr, **own) if sp.global_lr is not None else sp.make_rule(**own)


def _own(sp: Spec, hp: dict) -> dict:
    """The spec's hyper-parameters: the given values, the spec's defaults for the rest."""
    return {**sp.defaults(), **{k: v for k, v in hp.items() if k in sp.defaults()}}


def check_server_learning(name: str, learning: str, has_server_data: bool) -> str:
    """The server learning algorithm ``name`` runs with under ``server.learning = learning`` ("auto": the
    spec's own), or a ValueError of one line when they do not compose: the one check of "needs D0" and
    "composes with FSL-p", made by config validation.

    - FSL, FSL-p and DS need D0 (``needs_server_data``), and so does any server learning (``has_server_data``).
    - FSL-p's server "client" joins the mean of updates of the rules marked ``parallel_ok`` only.
    - FSL and FSL-p fix their own mode: ``learning`` may only be "auto" or that mode.
    """
    sp = spec(name)
    if (sp.needs_server_data or learning in ("incremental", "parallel")) and not has_server_data:
        raise ValueError(f"algorithm.name = {name!r} with server.learning = {learning!r} needs server data: "
                         "expected data.server_size > 0 or data.server_source = "
                         "'clients' / 'dataset' / 'other_ids'")
    if learning == "parallel" and not sp.parallel_ok:
        ok = ", ".join(n for n, s in SPECS.items() if s.parallel_ok and s.server_learning == "off")
        raise ValueError(f"server.learning = 'parallel' (FSL-p) composes with {ok}; not algorithm.name = {name!r}")
    if sp.server_learning != "off" and learning not in ("auto", sp.server_learning):
        raise ValueError(f"server.learning = {learning!r} contradicts algorithm.name = {name!r}: expected 'auto'")
    return sp.server_mode(learning)


def check_client_optimizer(name: str, momentum: float) -> None:
    """A ValueError of one line when algorithm ``name`` cannot take the clients' heavy-ball momentum μ_c
    (``algorithm.client_momentum``; its spec's ``momentum_refused``): the one check, made by config validation and
    by ``make_algorithm``. Weight decay composes with every rule (it is part of the gradient)."""
    sp = spec(name)
    if momentum and sp.momentum_refused:
        raise ValueError(f"algorithm.client_momentum = {momentum!r} with algorithm.name = {name!r}: {sp.display} "
                         f"{sp.momentum_refused}: expected algorithm.client_momentum = 0")


def make_algorithm(name: str, local: LocalTraining, global_lr: float, server: ServerLearning | None,
                   weighted: bool = False, robust: Robust | None = None, privacy: DifferentialPrivacy | None = None,
                   distillation: Distillation | None = None, **hp) -> Algorithm:
    """Build algorithm ``name``.

    - fsl: FedAvg + ``server`` as incremental SL (Algorithm 1); fsl_p: FedAvg + ``server``
      as parallel SL (FSL-p), whatever ``server.mode`` says. Both require ``server``.
    - ds: FedAvg with clients training on D_i ∪ D0 (Zhao et al. 2018).
    - any other rule: ``server``, when given, runs after its server update (e.g. SCAFFOLD + SL).
    - ``robust``: a robust aggregate of the clients' updates before any rule's mean (``robust.py``).
    ``hp`` holds the rules' own hyper-parameters (their specs' ``hyperparams``: mu, momentum, beta1,
    beta2, tau, alpha, rho; the spec's defaults for those not given). Whether ``server`` composes with
    the rule is ``check_server_learning``'s question, asked once at config validation; here it is assumed.
    ``privacy``: DP-FedAvg's clipped, noised mean of the clients' updates before the rule reads them (None: off).
    ``distillation``: FedDF's settings, for a rule whose spec ``distills`` (default: ``Distillation()``'s); it
    reads each client's model, so it takes no robust rule or privacy (config validation refuses them).
    ``local``'s momentum μ_c must compose with the rule (``check_client_optimizer``; ValueError otherwise).
    """
    sp = spec(name)
    check_client_optimizer(name, local.momentum)
    rule = make_rule(name, global_lr, **hp)
    if sp.server_learning != "off":
        assert server is not None, f"{name} needs server learning (check_server_learning)"
        server = replace(server, mode=sp.server_learning)
    assert server is None or server.mode != "parallel" or sp.parallel_ok, f"FSL-p with {name}: check_server_learning"
    robust = robust if robust is not None and robust.active else None
    if sp.distills:
        assert robust is None and privacy is None, f"{name} reads each client's model: no robust rule or DP"
        distillation = distillation or Distillation()
    else:
        assert distillation is None, f"{name} does not distil"
    return Algorithm(name, local, rule, weighted, server_learning=server, share_server_data=sp.shares_server_data,
                     spec=sp, robust=robust, privacy=privacy, distillation=distillation)


__all__ = ["ALGORITHMS", "SPECS", "HyperParam", "Spec", "spec", "Algorithm", "ClientResults", "DifferentialPrivacy",
           "Distillation",
           "LocalSGD",
           "RunState", "client_update", "FedAdagrad", "FedAdam", "FedAvg", "FedAvgM", "FedDyn", "FedProx", "FedYogi",
           "GammaSchedule",
           "LocalTraining", "Pretraining", "QFedAvg", "Robust", "RoundContext", "Scaffold", "ServerLearning",
           "ServerRule", "State", "make_algorithm", "make_rule",
           "check_server_learning", "check_client_optimizer"]
