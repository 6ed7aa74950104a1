"""From a config and its federation to the algorithm it names: every hyper-parameter the config left unset
follows the paper's rules (``fedsl.algorithms.defaults``), and each one is noted with where its value came
from, for the printed table and summary.json."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from fedsl.algorithms import (
    Algorithm,
    DifferentialPrivacy,
    Distillation,
    GammaSchedule,
    LocalTraining,
    Pretraining,
    Robust,
    ServerLearning,
    defaults,
    make_algorithm,
    spec,
)
from fedsl.algorithms.distillation import ORIGIN
from fedsl.algorithms.robust import bucket_count, default_bulyan_f, default_krum_f
from fedsl.algorithms.server_learning import round_steps
from fedsl.config.schema import ConfigError, RunConfig
from fedsl.core import privacy_accounting
from fedsl.core.privacy_accounting import AccountingUnavailable, Budget, CalibrationError
from fedsl.data.federation import Federation


@dataclass
class Setting:
    """One row of the printed hyper-parameter table: a paper symbol, its value and where the value came from
    (a rule's declared hyper-parameters themselves are ``fedsl.algorithms.spec.HyperParam``)."""

    symbol: str
    meaning: str
    value: float | int | None
    source: str  # "set", "paper default", "derived"


def given(table: BaseModel, key: str) -> Any:
    """``table``'s ``key`` when the config gives it (a preset's, a file's or a ``--set`` value), else None: the
    printed table labels it ``[set]``, else by the default it took."""
    return getattr(table, key) if key in table.model_fields_set else None


def resolve(cfg: RunConfig, fed: Federation) -> tuple[Algorithm, Pretraining | None, list[Setting]]:
    """Apply the paper's default rules to every hyper-parameter the config left unset."""
    a, s = cfg.algorithm, cfg.server
    hp: list[Setting] = []

    def note(symbol: str, meaning: str, value, given, rule: str = "paper default"):
        hp.append(Setting(symbol, meaning, value, "set" if given is not None else rule))
        return value


    N, S, n, n0 = fed.num_clients, a.clients_per_round, fed.n, fed.n0
    smallest = int(fed.clients.sizes.min())
    if a.batch_size > smallest:
        raise ConfigError(f"algorithm.batch_size = {a.batch_size}: expected at most the smallest client's "
                          f"n_i = {smallest}")
    note("N", "clients", N, given(cfg.data, "num_clients") if N == cfg.data.num_clients else True, "default")
    note("S", "clients per round", S, given(a, "clients_per_round"), "default")
    note("n_i", "samples per client (mean)", round(n / N, 2), None, "derived")
    note("η_l", "client learning rate", a.local_lr, given(a, "local_lr"), "default")
    note("B", "client batch size", a.batch_size, given(a, "batch_size"), "default")
    note("E_c", "client epochs", a.local_epochs, a.local_epochs if a.local_epochs != defaults.LOCAL_EPOCHS else None)
    k = a.mean_steps(n, N)
    note("K", "client steps per round (mean client)", k, a.local_steps, "derived: E_c·⌈n_i/B⌉")
    sp = spec(a.name)
    eta_g = None  # rules without a server step size (FedDyn)
    if sp.global_lr is not None:
        eta_g = note("η_g", "server step size", a.global_lr or sp.default_global_lr(S), a.global_lr,
                     "paper default √S" if sp.global_lr == "sqrt_s" else f"default for {a.name}")
    rule_hp = {h.key: getattr(a, h.key) for h in sp.hyperparams}
    for h in sp.hyperparams:
        note(h.symbol, h.meaning, rule_hp[h.key], given(a, h.key), f"default for {sp.display}")
    # the clients' optimiser: listed when set away from plain SGD (a table without them is the paper's)
    if a.client_momentum:
        note("μ_c", "client momentum (heavy-ball, within a round)", a.client_momentum, True)
    if a.weight_decay:
        note("λ", "client weight decay (L2, on the local gradients)", a.weight_decay, True)
    local = LocalTraining(a.local_lr, a.batch_size, a.local_epochs, a.local_steps, a.client_momentum, a.weight_decay)

    server = None
    mode = sp.server_mode(s.learning)
    if mode != "off":
        b0 = cfg.server_batch_size
        if b0 > n0:
            raise ConfigError(f"server.batch_size = {b0}: expected at most data.server_size n0 = {n0}")
        note("n0", "server samples |D0|", n0, True)
        note("γ", "server loss weight", s.gamma, s.gamma if s.gamma != defaults.GAMMA else None)
        note("B0", "server batch size", b0, s.batch_size, "paper default B")
        e_s = s.epochs or defaults.server_epochs(n, N, n0, a.local_epochs)
        if s.steps is None:  # server.steps fixes K0 itself: E_s is then not read, and not listed as if it were
            note("E_s", "server epochs per round", e_s, s.epochs, "paper default ⌈n/(N·n0)·E_c⌉")
        k0 = round_steps(s.steps, e_s, n0, b0)
        note("K0", "server steps per round", k0, s.steps, "derived: E_s·⌈n0/B0⌉")
        if sp.server_lr == "local_lr":  # the rule's server steps take the clients' step size (FedDU)
            eta0 = note("η0", "server base step size", or_local_lr(cfg, s.lr), s.lr, f"{sp.display} default η_l")
        else:
            eta0 = s.lr or (defaults.server_lr(S, a.local_lr, k, k0) if k0 > 0 else 0.0)
            note("η0", "server base step size", eta0, s.lr, "paper default √S·η_l·K/K0")
        note("γ·η0", "server learning rate", s.gamma * eta0, None, "derived")
        if mode == "parallel":
            note("w0", "FSL-p server weight", s.weight, s.weight, "n0/(n0+Σn_i)")
        schedule = GammaSchedule(s.gamma_schedule, s.gamma_final, s.gamma_every, s.gamma_factor,
                                 cfg.rounds, s.gamma_threshold, s.gamma_shrink)
        if s.gamma_schedule != "constant":
            note("γ_t", "γ schedule", s.gamma_schedule, True)
        server = ServerLearning(s.gamma, eta0, b0, e_s, s.steps, mode=mode, weight=s.weight, schedule=schedule,
                                log_angle=s.log_angle)
    if sp.shares_server_data:
        note("n0", "shared samples |D0|", n0, True)
    robust = robust_rule(cfg, fed, k, note)
    budget = privacy_budget(cfg, fed)
    privacy = None
    if budget is not None:
        p = cfg.privacy
        note("C_clip", "clip norm of each client's update (DP)", p.clip, True)
        note("z", "noise multiplier (DP)", budget.noise_multiplier, p.noise_multiplier,
             "" if p.target_epsilon is None else f"calibrated to ε = {p.target_epsilon:g} after T rounds")
        note("δ", "DP's δ", budget.delta, p.delta, "default min(1e-5, 1/N^1.1)")
        note("q", "client sampling rate S/N (DP accounting)", round(budget.q, 6), None, "derived")
        privacy = DifferentialPrivacy(p.clip, budget.noise_multiplier, S, p.adaptive_clipping())
        if privacy.adaptive is not None:  # privacy_budget checked that z_Δ exists
            note("γ_C", "adaptive clipping: quantile of the update norms C follows", p.target_quantile,
                 given(p, "target_quantile"), "default")
            note("η_C", "adaptive clipping: step of C's geometric update", p.clip_lr, given(p, "clip_lr"), "default")
            note("σ_b", "adaptive clipping: noise on the count of unclipped updates", privacy.count_stddev,
                 p.count_stddev, "default S/20 (0 without noise)")
            note("z_Δ", "the update's noise multiplier (with σ_b's, z)", privacy.update_noise_multiplier, None,
                 "derived: (z^-2 − (2σ_b)^-2)^-1/2")
    distillation = distill_settings(cfg, fed, note) if sp.distills else None
    # validation checked it all
    algorithm = make_algorithm(a.name, local, eta_g, server, a.weighted, robust, privacy, distillation, **rule_hp)

    if s.finetune_epochs:
        note("E_ft", "fine-tuning epochs on D0 after round T", s.finetune_epochs, True)
        note("η_ft", "fine-tuning step size", finetune_lr(cfg), s.finetune_lr, "default η_l")
    pretrain = None
    if s.pretrain:
        pb = s.pretrain_batch_size or a.batch_size
        pretrain = Pretraining(s.pretrain_epochs, s.pretrain_lr, min(pb, n0))
        note("pretrain", "server pretraining epochs on D0", s.pretrain_epochs, given(s, "pretrain_epochs"))
    return algorithm, pretrain, hp


# FedDF's settings in the printed table: key of [distill] -> (symbol, meaning)
DISTILL_ROWS = {"lr": ("η_kd", "distillation: Adam's step size"), "temperature": ("T_kd", "distillation temperature"),
                "steps": ("K_kd", "distillation steps per round (at most)"),
                "batch_size": ("B_kd", "distillation batch size (unlabelled)"),
                "eval_every": ("every_kd", "distillation: steps between validations"),
                "patience": ("pat_kd", "distillation: early-stopping patience (steps)"),
                "val_fraction": ("val_kd", "distillation: held-out share of U"),
                "schedule": ("sched_kd", "distillation: step-size schedule"),
                "clip": ("clip_kd", "distillation: gradient norm clip")}


def distill_settings(cfg: RunConfig, fed: Federation, note: Callable[..., Any]) -> Distillation:
    """FedDF's distillation settings (``[distill]``), each noted with where its default comes from (the paper, the
    authors' code, ours: ``distillation.ORIGIN``); U, the server's unlabelled data, must not be empty."""
    n = len(fed.unlabelled)
    if n == 0:
        raise ConfigError(f"algorithm.name = {cfg.algorithm.name!r} distils on the server's unlabelled data: "
                          f"data.unlabelled = {cfg.data.unlabelled!r} gave none")
    note("|U|", "server's unlabelled samples", n, True)
    dc, default = cfg.distill, Distillation()
    for key, (symbol, meaning) in DISTILL_ROWS.items():
        value = getattr(dc, key)
        note(symbol, meaning, value, value if value != getattr(default, key) else None, f"default: {ORIGIN[key]}")
    return dc.settings()


def or_local_lr(cfg: RunConfig, lr: float | None) -> float:
    """A server-side step size that defaults to the clients' η_l (FedDU's η0, the fine-tuning's, FLTrust's): ``lr``
    when set, else ``algorithm.local_lr``."""
    return lr if lr is not None else cfg.algorithm.local_lr


def finetune_lr(cfg: RunConfig) -> float:
    """η_ft, the step size of the 'fine-tune on D0 after round T' control: ``server.finetune_lr``, default η_l."""
    return or_local_lr(cfg, cfg.server.finetune_lr)


def robust_rule(cfg: RunConfig, fed: Federation, k: int, note: Callable[..., Any]) -> Robust | None:
    """The ``[robust]`` rule (None for 'mean'); FLTrust's server update g0 takes the clients' schedule by default
    (η_l, K = ``k`` the mean client's steps, batches of min(B, n0)), as Cao et al. (NDSS 2021) train it, so that
    ‖g0‖, to which every update is rescaled, is a client update's size."""
    r, a = cfg.robust, cfg.algorithm
    if r.aggregator == "mean":
        return None
    note("robust", "robust server rule", r.aggregator, True)
    root = None
    if r.aggregator == "fltrust":
        if fed.n0 == 0:
            raise ConfigError("robust.aggregator = 'fltrust' needs server data: D0 came out empty")
        lr = note("η_tr", "FLTrust server update: step size", or_local_lr(cfg, r.trust_lr), r.trust_lr, "default η_l")
        steps = note("K_tr", "FLTrust server update: steps on D0", r.trust_steps or k, r.trust_steps,
                     "default K (the clients')")
        root = LocalTraining(lr, min(a.batch_size, fed.n0), steps=steps)
    elif r.aggregator == "trimmed_mean":
        note("β", "trimmed-mean fraction", r.trim, given(r, "trim"), "default")
    elif r.aggregator == "norm_bound":
        note("τ", "norm bound of each update", r.norm_bound, True)
    elif r.aggregator in ("krum", "multi_krum"):
        # the defaults are per round, of the S' replies that arrive; shown here for S' = S
        n = bucket_count(a.clients_per_round, r.bucket)  # the rows Krum scores: replies or bucket means
        f = note("f", "Krum's assumed Byzantine count", r.krum_f if r.krum_f is not None else default_krum_f(n),
                 r.krum_f, "default ⌊(S' − 3)/2⌋ of the S' replies (or bucket means)")
        if r.aggregator == "multi_krum":
            note("m", "Multi-Krum's averaged updates", r.krum_m or n - f, r.krum_m,
                 "default S' − f")
    elif r.aggregator == "bulyan":  # per round, of the S' replies; shown for S' = S
        note("f", "Bulyan's assumed Byzantine count", r.krum_f if r.krum_f is not None
             else default_bulyan_f(a.clients_per_round), r.krum_f, "default ⌊(S' − 3)/4⌋ of the S' replies")
    if r.bucket > 1:
        note("s", "bucket size (updates averaged per bucket before the rule)", r.bucket, given(r, "bucket"), "default")
    return Robust(r.aggregator, r.trim, r.krum_f, r.krum_m, r.norm_bound, root, r.bucket, cfg.seed)


def privacy_budget(cfg: RunConfig, fed: Federation) -> Budget | None:
    """The run's DP accounting (``privacy.clip`` set; None: off): q = S/N, z (given, or calibrated so that ε after
    ``rounds`` rounds is at most ``privacy.target_epsilon``), δ (default ``privacy_accounting.default_delta``).
    A missing dp-accounting package or a target that asks for no noise is a ConfigError of one line."""
    p = cfg.privacy
    if not p.enabled:
        return None
    n = fed.num_clients
    q = cfg.algorithm.clients_per_round / n
    delta = p.delta if p.delta is not None else privacy_accounting.default_delta(n)
    try:
        privacy_accounting.library()
        z = p.noise_multiplier
        if z is None:
            z = privacy_accounting.calibrate(q, cfg.rounds, p.target_epsilon, delta, p.accountant)
    except (AccountingUnavailable, CalibrationError) as e:
        raise ConfigError(str(e)) from None
    adaptive = None
    if p.adaptive:  # the update's noise multiplier z_Δ that, with the count's σ_b, composes to the z accounted
        dp = DifferentialPrivacy(p.clip, z, cfg.algorithm.clients_per_round, p.adaptive_clipping())
        try:
            adaptive = {"initial_clip": p.clip, "target_quantile": p.target_quantile, "clip_lr": p.clip_lr,
                        "count_stddev": dp.count_stddev, "update_noise_multiplier": dp.update_noise_multiplier}
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return Budget(q, z, delta, p.accountant, p.clip, adaptive)


def format_hparams(hp: list[Setting]) -> str:
    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)
    return "\n".join(f"  {h.symbol:<9}{fmt(h.value):>12}   {h.meaning} [{h.source}]" for h in hp)
