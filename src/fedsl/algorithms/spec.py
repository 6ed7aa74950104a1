"""One spec per algorithm: what config validation, defaults, stacking and Flower need to know.

Each algorithm file ends with its ``SPEC`` (or several: ``fedavg.py`` holds FedAvg, FSL,
FSL-p and DS, which share FedAvg's rule); ``fedsl.algorithms.SPECS`` collects them. A new
algorithm is one file with its two halves (``base``) and a spec, plus its module in
``algorithms/__init__.py``'s registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from fedsl.algorithms import defaults


@dataclass(frozen=True)
class Range:
    """Where a tuning study searches a hyper-parameter: [low, high], on a log scale (step sizes, weights spanning
    decades) or a linear one, real or integer (``fedsl tune``, Optuna's ``suggest_float``/``suggest_int``)."""

    low: float
    high: float
    log: bool = False
    integer: bool = False
    # an edge the hyper-parameter cannot or may not pass (a probability's 0, β < 1, a minimum the rule needs, a
    # budget such as a CPU's cap on steps): a choice there is reported, not widened (``tune.edge_widenings``)
    hard_low: bool = False
    hard_high: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError(f"search range [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}: expected "
                             "low < high" + (", both > 0 on a log scale" if self.log else ""))


# The search ranges of the keys every rule reads (a study's defaults; ``fedsl.config.tune_space``): η_l over
# three decades around the paper's values (0.01 to 0.1), γ over three around the paper's 1 (two, [0.1, 10], left
# tuned choices at 9.8). A study widens a range whose best choice lies at an edge (``tune.edge_widenings``).
LOCAL_LR_SEARCH = Range(1e-3, 1.0, log=True)
GAMMA_SEARCH = Range(0.03, 30.0, log=True)
# η_g of a rule whose default is the paper's √S: two decades centred on it, [√S/10, 10·√S] (a fixed [0.1, 10] put
# √S itself at the top edge for S = 100)
SQRT_S_SPREAD = 10.0


@dataclass(frozen=True)
class Measure:
    """A quantity at x_t an engine measures for a rule that declares it (``Spec.measures``, ``Spec.reply``,
    ``Spec.server_measures``, ``Spec.sends``): the rule names it, the engines compute it, and a deployment carries it
    by its name (a Flower metric when it is one number, an array record when it is shaped like x).

    Attributes:
        name: the key the rule reads it under (``sent[name]``, ``ClientResults.extra[name]``, ``RoundContext.extra``).
        meaning: what it is, in the paper's symbols (for messages and docs).
        per_parameter: a tensor per parameter, shaped like x (a gradient); else one number (a loss), float64.
    """

    name: str
    meaning: str
    per_parameter: bool

    @property
    def record(self) -> str:
        """Its name in a Flower message: a metric (``start-loss``) or an array record (``start-grad``)."""
        return self.name.replace("_", "-")


# What a client can measure at x_t on its own data before its local steps (D_i, or D_i ∪ D0 for DS; the evaluation's
# forward pass, dropout off), for its rule's client half or to send back beside x_i.
CLIENT_MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("start_loss", "F_i(x_t), the client's mean loss on its data at the model it received", False),
    Measure("start_grad", "∇F_i(x_t), the gradient of the client's mean loss over all of its data at the model it "
            "received", True),
)}
# What the server can measure at x_t on D0 at the round's start (the evaluation's forward pass, dropout off).
SERVER_MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("server_grad", "∇f0(x_t), the gradient of the server's mean loss over D0", True),
)}


@dataclass(frozen=True)
class HyperParam:
    """A rule's own hyper-parameter: its config key (``algorithm.KEY``), default, paper symbol,
    and the bounds config validation applies (``ge``/``gt`` below, ``lt``/``le`` above; None = none).

    ``default`` is the only place the default is written: the rule's dataclass has none (``make_rule``
    fills it in from here) and config's ``[algorithm]`` field takes it from here. ``search``: the range a tuning
    study searches it in by default (None: kept at its value unless a ``[tune.space]`` table names it), chosen
    where the rule's paper or the field's practice tunes it."""

    key: str
    default: float
    symbol: str
    meaning: str
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    le: float | None = None
    search: Range | None = None


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
        sends: what the clients read of the server (``sent`` of the client functions), sent with the model in a
            deployment (Flower): keys of the server state (SCAFFOLD's c, for c - c_i) or server measures at x_t
            (``SERVER_MEASURES``: FedCLG-C's ∇f0(x_t)).
        client_state: the state each client keeps between its rounds (``init_client_state``'s keys), one
            table of N × d numbers each: SCAFFOLD's c_i, FedDyn's ∇L_i; () = stateless clients.
        local_keys: hyper-parameters that enter the clients' steps (stacked runs must share
            them: one vmapped step takes one value).
        comm_factor: parameters moved per client and direction, in units of d (SCAFFOLD: 2; FedCLG: 1.5, one extra d
            in one direction).
        needs_representation: the rule's ``local_loss`` reads the model's representation z (MOON): a
            model without one (``fedsl.models.has_representation``) is a configuration error.
        title: the rule's name as its paper writes it ("FedDU"), for messages and the printed
            hyper-parameter table; "" = ``name``.
        server_lr: η0 when ``server.lr`` is unset: "paper" (√S·η_l·K/K0, ``defaults.server_lr``) or
            "local_lr" (η_l: the rule's server steps take the clients' step size, as FedDU's authors train
            the server).
        sets_gamma: the rule sets line 10's γ_t itself each round (FedDU, from the round's non-IID degrees
            and acc_t): an adaptive γ schedule, which sets γ_t from cos θ_t, cannot run with it.
        reads_label_counts: the rule's γ_t reads the sampled clients' label counts (FedDU): DP does not
            protect them, and the clients of an open Flower federation do not report them.
        measures: what each sampled client measures at x_t before its steps for the rule's client half to read
            (``CLIENT_MEASURES``' names; in ``sent[name]`` of ``client_init``/``client_final``; FedCLG-C's ∇F_i(x_t)).
        reply: what each client sends back beside x_i for the server half to read (``CLIENT_MEASURES``' names; in
            ``ClientResults.extra`` and ``RoundContext.extra``, one row per client: q-FedAvg's F_i(x_t), FedCLG-S's
            ∇F_i(x_t)). The simulator computes them, fedsl's ClientApp reports them by name (``Measure.record``); DP
            does not protect them, SecAgg+ cannot carry them, and the clients of an open federation do not report
            them.
        server_measures: what the server measures at x_t on D0 for the rule's server update (``SERVER_MEASURES``'
            names; in ``RoundContext.extra``: FedCLG-S's ∇f0(x_t)). ``sends`` may name one too: it is then measured at
            the round's start and sent to the clients with x_t (FedCLG-C's ∇f0(x_t)).
        plain_mean: the server half averages the clients' models plainly, whatever ``algorithm.weighted``
            says (FedDyn): under SecAgg+, whose sum is weighted by n_i when weighted = true, the two would
            differ.
        secagg_refused: why the server half cannot run on the sum of the clients' models that SecAgg+
            leaves the server (SCAFFOLD, FedNova), as a message's clause; "" = it can (a rule that
            ``sends`` server state is refused for that, too).
        momentum_refused: why the rule cannot take the clients' heavy-ball momentum (``algorithm.client_momentum``,
            ``base.ClientOptimizer``), as a message's clause: its arithmetic reads a client's update as plain SGD's
            (SCAFFOLD's c_i⁺ from (x - y_i)/(K_i·η_l)) or takes its own heavy-ball step (FedNova); "" = it composes
            (the rule's correction is added to the gradient before the momentum). Weight decay composes with every rule.
        global_lr_search: the range a tuning study searches η_g in (None: a rule without η_g); log scale.
        distills: the server distils the ensemble of the round's client models into x̄_t on unlabelled server data
            (FedDF, ``distillation``): it reads each client's model, so a robust rule or DP-FedAvg in front of the
            rule (which replace those models) cannot run with it, and it needs unlabelled data (``data.unlabelled``).
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
    comm_factor: float = 1
    needs_representation: bool = False
    title: str = ""
    server_lr: Literal["paper", "local_lr"] = "paper"
    sets_gamma: bool = False
    reads_label_counts: bool = False
    measures: tuple[str, ...] = ()
    reply: tuple[str, ...] = ()
    server_measures: tuple[str, ...] = ()
    plain_mean: bool = False
    secagg_refused: str = ""
    momentum_refused: str = ""
    distills: bool = False
    global_lr_search: Range | None = Range(0.1, 10.0, log=True)
    summary: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for what, names, known in (("measures", self.measures, CLIENT_MEASURES), ("reply", self.reply, CLIENT_MEASURES),
                                   ("server_measures", self.server_measures, SERVER_MEASURES)):
            for n in names:
                if n not in known:
                    raise ValueError(f"algorithm {self.name!r} declares {what} = {names!r}: {n!r} is not a "
                                     f"measure the engines make (expected one of {list(known)})")

    @property
    def client_measures(self) -> tuple[str, ...]:
        """What each client measures at x_t: for its own half (``measures``) and to send back (``reply``)."""
        return tuple(dict.fromkeys(self.measures + self.reply))

    @property
    def sent_measures(self) -> tuple[str, ...]:
        """The server measures sent to the clients with x_t (``sends`` naming one of ``SERVER_MEASURES``)."""
        return tuple(k for k in self.sends if k in SERVER_MEASURES)

    @property
    def sent_state(self) -> tuple[str, ...]:
        """The keys of the server state sent to the clients with x_t (``sends`` less the server measures)."""
        return tuple(k for k in self.sends if k not in SERVER_MEASURES)

    @property
    def secagg_reason(self) -> str:
        """Why the server half cannot run on the sum of the models SecAgg+ leaves the server, as a clause; "" = it
        can. Derived: the rule's own ``secagg_refused``, else what it sends with x_t, else what its clients reply."""
        if self.secagg_refused:
            return self.secagg_refused
        if self.sends:
            return (f"sends {', '.join(self.sends)} with x_t, which Flower's SecAgg+ train message (one array list) "
                    "cannot carry")
        if self.reply:
            return (f"reads each client's {', '.join(CLIENT_MEASURES[k].record for k in self.reply)} beside x_i, which "
                    "SecAgg+ (the sum of the models alone) does not carry")
        return ""

    def default_global_lr(self, clients_per_round: int) -> float | None:
        """η_g when the config leaves it unset ("sqrt_s": the paper's rule, ``defaults.global_lr``)."""
        if self.global_lr == "sqrt_s":
            return defaults.global_lr(clients_per_round)
        return self.global_lr

    @property
    def display(self) -> str:
        """The rule's name in messages: its ``title``, else ``name``."""
        return self.title or self.name

    def defaults(self) -> dict[str, float]:
        return {h.key: h.default for h in self.hyperparams}

    def server_mode(self, learning: str) -> str:
        """The server learning this rule runs with under ``server.learning = learning``: "auto" is the
        spec's own (FSL: "incremental", FSL-p: "parallel", the others "off"). Whether the two compose is
        ``fedsl.algorithms.check_server_learning``'s question (config validation asks it)."""
        return self.server_learning if learning == "auto" else learning


def registry(specs: Iterable[Spec]) -> dict[str, Spec]:
    """The specs by name, checked: names are unique, and a config key two rules declare (FedAdam's and FedYogi's
    ``beta1``) means one setting, with one default, symbol, meaning and bounds in every rule that declares it.

    A rule's hyper-parameters are ``algorithm.KEY`` fields of the config, one field per key: a new rule that
    declared ``momentum = 0.5`` beside FedAvgM's β = 0.9 would otherwise change FedAvgM's default in every config
    that leaves it unset. Such a rule is refused in one line: it takes its own key (``moon_mu`` beside FedProx's
    ``mu``) or the same setting."""
    out: dict[str, Spec] = {}
    declared: dict[str, tuple[str, HyperParam]] = {}
    for s in specs:
        if s.name in out:
            raise ValueError(f"algorithm {s.name!r} is declared twice: expected one spec per algorithm.name")
        out[s.name] = s
        for h in s.hyperparams:
            first = declared.setdefault(h.key, (s.name, h))
            if first[1] != h:
                raise ValueError(f"algorithm {s.name!r} declares algorithm.{h.key} as {_shown(h)}, but {first[0]!r} "
                                 f"declares it as {_shown(first[1])}: expected a key of its own "
                                 f"for {s.name!r} (e.g. {s.name}_{h.key}) or the same default, symbol, meaning and "
                                 "bounds")
    return out


def _shown(h: HyperParam) -> str:
    bounds = ", ".join(f"{b} {v:g}" for b, v in (("ge", h.ge), ("gt", h.gt), ("lt", h.lt), ("le", h.le))
                       if v is not None)
    return f"{h.symbol} = {h.default:g} ({h.meaning}{'; ' + bounds if bounds else ''})"
