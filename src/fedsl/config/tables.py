"""The config's tables beside [data] and the run's own keys: [model], [algorithm] (with each rule's own
hyper-parameters, made from the specs), [server], [attack], [robust], [distill], [client_state], [privacy], and the
[[claims]] that ``fedsl report`` judges. Each takes its defaults from the dataclass it configures."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from fedsl.algorithms import ALGORITHMS, SPECS, defaults
from fedsl.algorithms.base import LocalTraining
from fedsl.algorithms.distillation import SCHEDULES as DISTILL_SCHEDULES
from fedsl.algorithms.distillation import Distillation
from fedsl.algorithms.gamma_schedule import GammaSchedule
from fedsl.algorithms.gamma_schedule import Kind as GammaKind
from fedsl.algorithms.privacy import AdaptiveClipping
from fedsl.algorithms.robust import AGGREGATORS, Robust
from fedsl.config.base import (
    BATCH_MAX,
    CLIENTS_MAX,
    EPOCHS_MAX,
    ROUNDS_MAX,
    SAMPLES_MAX,
    STEPS_MAX,
    _Strict,
)
from fedsl.core.attacks import DEFAULT_SCALE, KINDS, Attack
from fedsl.core.participation import PATTERNS, STRAGGLER_MODES, Participation
from fedsl.engine.client_state import STORE_DTYPES, STORES, StoreSettings
from fedsl.models.batchnorm import BATCHNORM_CLIENTS, BATCHNORM_SAMPLES

# Tables that configure one of fedsl's dataclasses take their defaults from it, where they are written once:
# γ's schedule (server.gamma_*), the robust rule ([robust]), the Byzantine clients ([attack]) and participation
# (algorithm.availability, straggler_*), as the rules' own hyper-parameters take theirs from their specs.
_SCHEDULE, _ROBUST, _ATTACK, _PARTICIPATION = GammaSchedule(), Robust(), Attack(), Participation()
_ADAPTIVE = AdaptiveClipping()  # [privacy]'s adaptive clipping (fedsl.algorithms.privacy)
_DISTILL = Distillation()  # FedDF's [distill] table
_STORE = StoreSettings()  # the clients' states' store ([client_state]; fedsl.engine.client_state)
_LOCAL = LocalTraining(lr=1.0, batch_size=1)  # the clients' optimiser's defaults (client_momentum, weight_decay)


class ModelConfig(_Strict):
    name: str = Field("small_cnn", description="model: the paper's emnist_cnn / cifar_cnn, small_cnn, mlp, linear, "
                                                "logreg (FedProx's for synthetic_fedprox), char_lstm / "
                                                "char_lstm_small (text: LEAF's 2 x 256 LSTM, a 2 x 64 one), "
                                                "or 'package.module:factory' for your own torch.nn.Module (runs that "
                                                "code: only with FEDSL_ALLOW_IMPORT=1 in the environment)")
    init: Literal["auto", "keras", "torch"] = Field(
        "auto", description="initialisation: 'keras' (Glorot-uniform kernels, zero biases, as the paper's Keras "
                            "models), 'torch' (PyTorch's layer defaults), 'auto' (keras for the built-in models, "
                            "an imported factory's own init)")
    import_dir: str | None = Field(
        None, min_length=1, description="an imported factory's folder: put first on the Python path while "
                                        "model.name's module is imported (a module beside the config wins over one "
                                        "of the same name elsewhere), then kept at the path's end, so that worker "
                                        "processes can load the model. Default: the config file's own folder when "
                                        "model.name (or a variant's, or a swept value) is an import path (`fedsl run "
                                        "my.toml`: my.toml's folder; a preset has none). Relative: from the config "
                                        "file's folder (from the working directory when given by --set or from "
                                        "Python); kept absolute. Read only for an import path")
    batchnorm: Literal["auto", "batch", "clients", "server", "local"] = Field(
        "auto", description="a model with BatchNorm layers: the statistics they normalise by when the model is "
                            "evaluated (in training, always their batch's real samples, padding left out). "
                            "'clients': estimated at each evaluation, under the evaluated model, on "
                            "model.batchnorm_samples of the clients' training samples (drawn once), what "
                            "averaging the clients' statistics by their sizes gives; 'server': on D0; 'batch': each "
                            "evaluated batch's own (BatchNorm without running statistics); 'local': FedBN (Li et "
                            "al. 2021), each client keeps its own γ, β, and the accuracy is the mean over "
                            "model.batchnorm_clients clients of each one's own model, normalised by its own "
                            "samples' statistics, on the test set weighted by its label mix. 'auto': 'clients' for "
                            "layers that track running statistics, else 'batch'. Read only for a model with "
                            "BatchNorm (fedsl.models.batchnorm)")
    batchnorm_samples: int = Field(
        BATCHNORM_SAMPLES, ge=1, le=SAMPLES_MAX,
        description="model.batchnorm = 'clients': how many of the clients' training samples the statistics are "
                    "estimated on")
    batchnorm_clients: int = Field(
        BATCHNORM_CLIENTS, ge=1, le=CLIENTS_MAX,
        description="model.batchnorm = 'local': how many clients (drawn once) each evaluation scores with their own "
                    "models")

    @model_validator(mode="after")
    def _known_or_import_path(self) -> "ModelConfig":
        from fedsl.models import MODELS, import_problem
        if self.name not in MODELS and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.name):
            raise ValueError(f"model.name = {self.name!r}: expected one of {', '.join(MODELS)} "
                             "or an import path 'package.module:factory'")
        if self.name not in MODELS and (problem := import_problem(self.name)):
            raise ValueError(problem)  # an import path runs code: only where the user opted in
        if self.import_dir is not None and not Path(self.import_dir).expanduser().is_absolute():
            # absolute from here on: a run resumed or run by a worker in another folder imports the same module
            self.import_dir = str(Path(self.import_dir).expanduser().resolve())
        return self


ALGORITHM_NAMES = ALGORITHMS  # from the algorithms' specs
_HP = {h.key: h for s in SPECS.values() for h in s.hyperparams}  # rules' own hyper-parameters, by config key


class AlgorithmConfig(_Strict):
    name: Literal[ALGORITHM_NAMES] = Field(description="algorithm: " + ", ".join(ALGORITHM_NAMES))
    clients_per_round: int = Field(5, ge=1, le=CLIENTS_MAX, description="S, clients sampled per round "
                                                                          f"(at most {CLIENTS_MAX:,})")
    local_lr: float = Field(0.01, gt=0, description="η_l, client learning rate")
    batch_size: int = Field(50, ge=1, le=BATCH_MAX, description="B, client batch size (at most 10^6)")
    local_epochs: int = Field(defaults.LOCAL_EPOCHS, ge=1, le=EPOCHS_MAX, description="E_c, client epochs per round "
                                                                                      "(paper: 1; at most 10,000)")
    local_steps: int | None = Field(None, ge=1, le=STEPS_MAX, description="K, client steps per round (overrides "
                                                                          "local_epochs; at most 10^6)")
    # the clients' optimiser (fedsl.algorithms.base.ClientOptimizer): torch.optim.SGD's momentum and weight decay;
    # 0 is the paper's plain SGD, with the code path and numbers it always had
    client_momentum: float = Field(
        _LOCAL.momentum, ge=0, lt=1,
        description="μ_c, the clients' heavy-ball momentum (torch.optim.SGD's: buffer b ← μ_c·b + g, step η_l·b; b = 0 "
                    "at each round's first local step, so no client state across rounds); 0 = the paper's plain SGD. "
                    "Server learning's steps on D0 stay plain SGD. Refused by "
                    + ", ".join(n for n, s in SPECS.items() if s.momentum_refused)
                    + ", which read a client's update as plain SGD's or step their own")
    weight_decay: float = Field(
        _LOCAL.weight_decay, ge=0,
        description="λ, L2 weight decay on the clients' local steps: λ·y added to the batch gradient before any "
                    "momentum (torch.optim.SGD's weight_decay); 0 = none. Server learning's steps on D0 take none")
    global_lr: float | None = Field(None, gt=0, description="η_g, server step size (paper: √S)")
    weighted: bool = Field(False, description="weight client updates by n_i (Algorithm 1: plain mean)")
    # partial participation and stragglers (fedsl.core.participation); the defaults are the paper's setting
    availability: float = Field(_PARTICIPATION.availability, gt=0, le=1, description="p, probability that a client "
                                "is available in a round (S are sampled among the available ones; 1 = always, the "
                                "paper)")
    availability_pattern: Literal[PATTERNS] = Field(
        _PARTICIPATION.pattern, description="availability: 'bernoulli' (each round afresh, probability p) or 'fixed' "
                                            "(each client in an evenly spread fraction p of the rounds, its phase "
                                            "seeded)")
    straggler_fraction: float = Field(_PARTICIPATION.straggler_fraction, ge=0, lt=1, description="f, fraction of the "
                                      "sampled clients that straggle each round (0 = none)")
    straggler_mode: Literal[STRAGGLER_MODES] = Field(
        _PARTICIPATION.straggler_mode, description="stragglers: 'partial' (a seeded uniform part of their K_i "
                                                   "steps, at least 1) or 'drop' (they train, but their update never "
                                                   "reaches the server)")

    def mean_steps(self, n: int, num_clients: int) -> int:
        """K of the mean client: ``local_steps``, or E_c·⌈n_i/B⌉ with n_i = n / N."""
        return self.local_steps or self.local_epochs * math.ceil((n / max(1, num_clients)) / self.batch_size)


# The rules' own hyper-parameters (μ, β, α, ...) are fields of [algorithm] made from their specs
# (fedsl.algorithms): default, bounds and meaning are written once, in the algorithm's module.
AlgorithmConfig = create_model(
    "AlgorithmConfig", __base__=AlgorithmConfig,
    **{h.key: (float, Field(h.default, ge=h.ge, gt=h.gt, lt=h.lt, le=h.le, description=f"{h.symbol}, {h.meaning}"))
       for h in _HP.values()})




class ServerConfig(_Strict):
    learning: Literal["auto", "off", "incremental", "parallel"] = Field(
        "auto", description="server learning: auto (fsl: incremental, fsl_p: parallel, others: off), or add it "
                            "to any algorithm (e.g. scaffold + incremental)")
    gamma: float = Field(defaults.GAMMA, ge=0, description="γ, weight of the server loss f0 (paper: 1)")
    gamma_schedule: GammaKind = Field(_SCHEDULE.kind, description="γ over rounds (paper: constant)")
    gamma_final: float = Field(_SCHEDULE.final, ge=0, description="linear/cosine schedules: γ at the last round")
    gamma_every: int = Field(_SCHEDULE.every, ge=1, le=ROUNDS_MAX, description="step schedule: rounds between "
                                                                                "decays (at most 10^7)")
    gamma_factor: float = Field(_SCHEDULE.factor, gt=0, le=1, description="step schedule: decay factor")
    gamma_threshold: float = Field(_SCHEDULE.threshold, ge=-1, le=1, description="adaptive: smallest cos θ that "
                                                                                 "counts as agreement")
    gamma_shrink: float = Field(_SCHEDULE.shrink, gt=0, lt=1, description="adaptive: γ ← shrink·γ when ∇f0 disagrees")
    log_angle: bool = Field(False, description="log cos θ_t between -∇f0 and the clients' update every round")
    lr: float | None = Field(None, gt=0, description="η0, server base step size (paper: √S·η_l·K/K0)")
    batch_size: int | None = Field(None, ge=1, le=BATCH_MAX, description="B0, server batch size (paper: B; "
                                                                         "at most 10^6)")
    epochs: int | None = Field(None, ge=1, le=EPOCHS_MAX, description="E_s, server epochs per round "
                                                                      "(paper: ⌈n/(N·n0)·E_c⌉; at most 10,000)")
    steps: int | None = Field(None, ge=0, le=STEPS_MAX, description="K0, server steps per round (overrides epochs; "
                                                                    "at most 10^6)")
    weight: float | None = Field(None, gt=0, lt=1, description="w0, FSL-p server weight (default n0/(n0+Σn_i))")
    pretrain: bool = Field(False, description="pretrain the initial model on D0 (paper Scenario 1)")
    pretrain_epochs: int = Field(defaults.PRETRAIN_EPOCHS, ge=1, le=100_000, description="pretraining epochs "
                                                                                         "(paper: 500; at most 10^5)")
    pretrain_lr: float = Field(defaults.PRETRAIN_LR, gt=0, description="pretraining learning rate (paper: 0.01)")
    pretrain_batch_size: int | None = Field(None, ge=1, le=BATCH_MAX, description="pretraining batch size "
                                                                                  "(paper: B; at most 10^6)")
    finetune_epochs: int = Field(0, ge=0, le=EPOCHS_MAX, description="the 'FedAvg, then fine-tune on D0' "
                                 "control: epochs of SGD on D0 after the last round, its test accuracy in summary.json "
                                 "as final_accuracy_finetuned (0 = none; at most 10,000)")
    finetune_lr: float | None = Field(None, gt=0, description="step size of the fine-tuning on D0 (default: η_l); "
                                                              "its batch size is B0")


class AttackConfig(_Strict):
    """Byzantine clients in simulation (``fedsl.core.attacks``; docs/how-to/robustness.md)."""
    kind: Literal[KINDS] = Field(
        _ATTACK.kind, description="what the malicious clients do: 'none'; after honest local training 'sign_flip' "
                                  "(Δ → −λ·Δ), 'scale' (Δ → λ·Δ), 'gaussian' (Δ → N(0, σ²) per coordinate), "
                                  "'constant' (every coordinate of Δ = c); or 'label_flip' (they train on their own "
                                  "samples with labels y → L − 1 − y)")
    fraction: float = Field(_ATTACK.fraction, ge=0, lt=1, description="f, share of the N clients that are malicious: "
                                                                      "⌊f·N⌋ of them, drawn once from the seed, the "
                                                                      "same every round")
    scale: float | None = Field(_ATTACK.scale, gt=0, description=f"λ of sign_flip (default "
                                                                 f"{DEFAULT_SCALE['sign_flip']:g}) and scale (default "
                                                                 f"{DEFAULT_SCALE['scale']:g})")
    noise_std: float = Field(_ATTACK.noise_std, gt=0, description="σ of gaussian: each coordinate of a malicious "
                                                                  "update ~ N(0, σ²)")
    constant: float = Field(_ATTACK.constant, description="c of constant: every coordinate of a malicious update")


class RobustConfig(_Strict):
    """A robust server rule before the algorithm's mean of the updates (``fedsl.algorithms.robust``)."""
    aggregator: Literal[AGGREGATORS] = Field(
        _ROBUST.aggregator, description="'mean' (the algorithm's own aggregation), 'median' and 'trimmed_mean' "
                                        "(coordinate-wise), 'krum', 'multi_krum', 'bulyan' (Krum picks S − 2f, then "
                                        "each coordinate's S − 4f values nearest its median are averaged), "
                                        "'norm_bound' (clip each Δ_i to norm "
                                        "τ, then the mean) or 'fltrust' (trust scores from the server's own update on "
                                        "D0; needs server data)")
    trim: float = Field(_ROBUST.trim, ge=0, lt=0.5, description="β of trimmed_mean: the ⌊β·S⌋ largest and ⌊β·S⌋ "
                                                                "smallest values of each coordinate are dropped")
    krum_f: int | None = Field(_ROBUST.krum_f, ge=0, le=CLIENTS_MAX, description="f, the Byzantine count Krum and "
                               "Bulyan assume; Krum's scores sum the S − f − 2 nearest updates (default ⌊(S − 3)/2⌋, "
                               "at least 0); Bulyan needs S >= 4f + 3 (default ⌊(S − 3)/4⌋, at least 0)")
    krum_m: int | None = Field(_ROBUST.krum_m, ge=1, le=CLIENTS_MAX, description="m, the updates Multi-Krum averages "
                                                                                 "(default S − f)")
    norm_bound: float | None = Field(_ROBUST.norm_bound, gt=0, description="τ of norm_bound (required there): each "
                                                                           "update cut to norm at most τ")
    trust_lr: float | None = Field(None, gt=0, description="fltrust: step size of the server's update on D0 "
                                                           "(default η_l, as the clients)")
    trust_steps: int | None = Field(None, ge=1, le=STEPS_MAX, description="fltrust: local steps of the server's "
                                    "update on D0 (default K, the mean client's; batches of min(B, n0); at most 10^6)")
    bucket: int = Field(_ROBUST.bucket, ge=1, le=CLIENTS_MAX, description="s: average the round's updates in random "
                        "buckets of s before median, trimmed_mean, krum or multi_krum, which then see ⌈S/s⌉ bucket "
                        "means (Karimireddy et al., ICLR 2022); 1 = no bucketing")


class DistillConfig(_Strict):
    """FedDF's ensemble distillation on the server's unlabelled data (``fedsl.algorithms.distillation``: which
    defaults are the paper's, the authors' code's and ours); read by algorithms that distil (feddf)."""
    lr: float = Field(_DISTILL.lr, gt=0, description="Adam's step size (paper: 1e-3)")
    temperature: float = Field(_DISTILL.temperature, gt=0, description="T of the softmaxes the KL compares (authors' "
                                                                      "code: 1)")
    steps: int = Field(_DISTILL.steps, ge=1, le=STEPS_MAX, description="K, distillation steps per round at most "
                                                                       "(paper: 10^4; at most 10^6)")
    batch_size: int = Field(_DISTILL.batch_size, ge=1, le=BATCH_MAX, description="unlabelled samples per step "
                                                                                 "(authors' code: 128)")
    eval_every: int = Field(_DISTILL.eval_every, ge=1, le=STEPS_MAX, description="steps between validations of the "
                                                                                 "KL on the held-out part (authors' "
                                                                                 "code: 100)")
    patience: int = Field(_DISTILL.patience, ge=1, le=STEPS_MAX, description="stop when the validation KL has not "
                                                                             "improved for this many steps (paper: "
                                                                             "10^3); the best validated model is kept")
    val_fraction: float = Field(_DISTILL.val_fraction, ge=0, lt=1, description="share of the unlabelled data held "
                                "out for early stopping, drawn once per run (ours: 0.1; 0 = no early stopping: K "
                                "steps, the last model)")
    schedule: Literal[DISTILL_SCHEDULES] = Field(_DISTILL.schedule, description="Adam's step size over the K steps: "
                                                 "'cosine' (annealed to 0, as the authors') or 'constant'")
    clip: float = Field(_DISTILL.clip, ge=0, description="clip the gradient to this norm before each step (authors' "
                                                         "code: 5; 0 = no clipping)")

    def settings(self) -> Distillation:
        return Distillation(self.lr, self.temperature, self.steps, self.batch_size, self.eval_every, self.patience,
                            self.val_fraction, self.schedule, self.clip)



class ClientStateConfig(_Strict):
    """How a stateful rule's clients' states (SCAFFOLD's c_i, FedDyn's ∇L_i, MOON's previous models) are kept
    (``fedsl.engine.client_state``; where on a GPU: ``client_tables``)."""
    store: Literal[STORES] = Field(_STORE.store, description="'dense': an N × d table per state (every client, sampled "
                                   "or not); 'sparse': rows only for the clients sampled so far (at most min(N, S·T)), "
                                   "the rule's initial row for the others; the same results bit for bit")
    dtype: Literal[STORE_DTYPES] = Field(_STORE.dtype, description="the sparse rows' numbers: 'auto' (the run's dtype: "
                                         "exact) or 'float16' (half of float32's memory; lossy: each number rounded "
                                         "to float16, relative error <= 2^-11)")
    on_disk: bool = Field(_STORE.on_disk, description="keep the sparse rows in a memory-mapped file in the run's "
                                                      "folder (client_state.bin), paged in and out by the operating "
                                                      "system: for more rows than memory; checkpoints hold them too")

    @model_validator(mode="after")
    def _sparse_only(self) -> "ClientStateConfig":
        if self.store == "dense" and self.dtype != "auto":
            raise ValueError(f"client_state.dtype = {self.dtype!r} sets the numbers of a sparse store: expected "
                             "client_state.store = 'sparse', or dtype = 'auto'")
        if self.store == "dense" and self.on_disk:
            raise ValueError("client_state.on_disk = true keeps a sparse store's rows in a file: expected "
                             "client_state.store = 'sparse', or on_disk = false")
        return self

    def settings(self) -> StoreSettings:
        return StoreSettings(self.store, self.dtype, self.on_disk)


def krum_rows(r: RobustConfig) -> tuple[str, str]:
    """What Krum's S counts in an error message (the key, its symbol): a round's clients or their bucket means."""
    if r.bucket > 1:
        return "the bucket means ⌈algorithm.clients_per_round / robust.bucket⌉", "⌈S/s⌉"
    return "algorithm.clients_per_round S", "S"


class PrivacyConfig(_Strict):
    """Central differential privacy of the clients' updates: DP-FedAvg (McMahan et al., ICLR 2018), accounted with
    dp-accounting (``fedsl.algorithms.privacy``, ``fedsl.core.privacy_accounting``; docs/how-to/privacy.md)."""
    clip: float | None = Field(None, gt=0, description="C, the bound on each client's update norm ‖x_i − x_t‖₂ (the "
                               "whole model's): updates are clipped to it, averaged over S, and Gaussian noise of "
                               "std z·C/S is added (DP-FedAvg); unset = no differential privacy")
    noise_multiplier: float | None = Field(None, ge=0, description="z, the noise's std in units of C on the sum of "
                                           "the clipped updates (0 = clipping only, ε = ∞); or set target_epsilon")
    target_epsilon: float | None = Field(None, gt=0, allow_inf_nan=True, description="ε to reach after `rounds` "
                                         "rounds at δ: z is calibrated to it (instead of noise_multiplier); inf = no "
                                         "privacy asked (with clip: clipping only, z = 0; without clip: a non-private "
                                         "variant pinned in a sweep over target_epsilon)")
    delta: float | None = Field(None, gt=0, lt=1, description="δ of the (ε, δ) guarantee; default min(1e-5, 1/N^1.1), "
                                "below 1/N at every N")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="ε by 'rdp' (Rényi DP, milliseconds) or 'pld' "
                                              "(privacy loss distributions: tighter, and slower per evaluated round)")
    adaptive: bool = Field(False, description="adaptive clipping (Andrew et al., NeurIPS 2021): privacy.clip is C_0, "
                           "and each round C ← C·exp(−η_C (b̄ − γ)), b̄ the noised fraction of updates not clipped; "
                           "the update's noise is raised so that it and the count's compose to z (ε unchanged)")
    target_quantile: float = Field(_ADAPTIVE.target_quantile, gt=0, lt=1, description="γ of adaptive clipping: the "
                                   "fraction of updates C should leave unclipped (Andrew et al., Flower: 0.5)")
    clip_lr: float = Field(_ADAPTIVE.lr, gt=0, description="η_C of adaptive clipping: the geometric update's step "
                           "(Andrew et al., Flower: 0.2)")
    count_stddev: float | None = Field(_ADAPTIVE.count_stddev, ge=0, description="σ_b of adaptive clipping: the noise "
                                       "on the count of unclipped updates (default S/20, Andrew et al.'s; 0 when z = "
                                       "0); needs z < 2·σ_b")

    @model_validator(mode="after")
    def _one_noise(self) -> "PrivacyConfig":
        if self.clip is None:
            eps = self.target_epsilon
            given = [k for k in ("noise_multiplier", "target_epsilon", "delta") if getattr(self, k) is not None
                     and not (k == "target_epsilon" and math.isinf(eps))]  # ε = inf asks for no privacy
            if given:
                raise ValueError(f"privacy.{given[0]} = {getattr(self, given[0])} without privacy.clip: expected "
                                 "privacy.clip = C > 0 to turn differential privacy on (or leave privacy unset)")
            return self
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            got = ("both privacy.noise_multiplier and privacy.target_epsilon" if self.noise_multiplier is not None
                   else "neither privacy.noise_multiplier nor privacy.target_epsilon")
            raise ValueError(f"privacy.clip = {self.clip}: expected exactly one of privacy.noise_multiplier = z or "
                             f"privacy.target_epsilon = ε, got {got}")
        return self

    @model_validator(mode="after")
    def _adaptive_keys(self) -> "PrivacyConfig":
        if self.adaptive and self.clip is None:
            raise ValueError("privacy.adaptive = true without privacy.clip: expected privacy.clip = C_0 > 0, the "
                             "initial clip norm (Andrew et al. suggest 0.1)")
        if not self.adaptive:
            for key, default in (("target_quantile", _ADAPTIVE.target_quantile), ("clip_lr", _ADAPTIVE.lr),
                                 ("count_stddev", _ADAPTIVE.count_stddev)):
                if getattr(self, key) != default:
                    raise ValueError(f"privacy.{key} = {getattr(self, key)} sets adaptive clipping: expected "
                                     "privacy.adaptive = true with it")
        return self

    def adaptive_clipping(self) -> AdaptiveClipping | None:
        """Adaptive clipping's settings (None: a fixed clip)."""
        return AdaptiveClipping(self.target_quantile, self.clip_lr, self.count_stddev) if self.adaptive else None

    @property
    def enabled(self) -> bool:
        return self.clip is not None


CLAIM_METRICS = ("final_accuracy", "T_0.5", "rise_time",
                 # eval_per_client's, at the last evaluation: the clients' mean, spread and worst 10%
                 "final_client_acc_mean", "final_client_acc_std", "final_client_acc_worst10")


class Claim(_Strict):
    """A claim of the paper that ``fedsl report`` judges from the runs (``fedsl.report.verdicts``): variant
    ``better`` beats ``worse`` on ``metric`` (accuracy: higher; T_0.5 and rise time: fewer rounds), in each
    sweep cell matching ``at``; or, with ``trend``, ``better``'s metric improves as the swept key grows
    (``direction = 'down'``: as it falls)."""
    text: str = Field(description="the paper's words")
    better: str = Field(description="a variant of the config (its name before sweep values and seeds)")
    worse: str | None = Field(None, description="the variant it beats (an ordering claim)")
    trend: str | None = Field(None, description="a swept key, e.g. 'data.classes_per_client' (a trend claim)")
    direction: Literal["up", "down"] = Field("up", description="trend: the metric improves as the key grows "
                                                               "('up') or as it falls ('down')")
    metric: Literal[CLAIM_METRICS] = Field("final_accuracy",
                                           description="what is compared: " + ", ".join(CLAIM_METRICS))
    at: dict[str, Any] = Field(default_factory=dict, description="only the sweep cells with these values, e.g. "
                                                                  "{'data.classes_per_client' = 2}")
    better_at: dict[str, Any] = Field(default_factory=dict, description="an ordering: only better's runs with these "
                                      "values, the keys left out when its cells are matched with worse's, e.g. "
                                      "{'server.gamma' = 1.0} against a DS pinned at gamma = 0")
    worse_at: dict[str, Any] = Field(default_factory=dict, description="an ordering: only worse's runs with these "
                                     "values, the keys left out when the cells are matched, e.g. "
                                     "{'server.gamma' = 0.0}")
    seed_std: float | None = Field(None, gt=0, description="seed-to-seed sample std of the metric in this setting, "
                                   "measured elsewhere over seed_std_seeds seeds: lets a one-seed comparison hold "
                                   "when its difference is beyond it (else one seed is 'not shown')")
    seed_std_seeds: int = Field(3, ge=2, le=1000, description="seeds behind seed_std (its t-test has this - 1 "
                                                               "degrees of freedom)")
    seed_std_source: str = Field("", description="where seed_std was measured")

    @model_validator(mode="after")
    def _one_kind(self) -> "Claim":
        if (self.worse is None) == (self.trend is None):
            raise ValueError(f"claim {self.text[:40]!r}: expected exactly one of worse = VARIANT (an ordering) or "
                             "trend = 'swept.key' (a trend)")
        if self.trend is not None and (self.better_at or self.worse_at):
            raise ValueError(f"claim {self.text[:40]!r}: better_at / worse_at select the two sides of an ordering: "
                             "expected worse = VARIANT with them, or at = {...} for a trend")
        return self

