"""Run configuration: a TOML file validated into typed objects.

Every field has a default except ``rounds``, ``data.dataset`` and ``algorithm.name``.
Hyper-parameters left unset (None) follow the paper's rules (``fedsl.algorithms.defaults``)
and are resolved once the data are known (``fedsl.experiments.resolve.resolve``).
Errors are ``ConfigError``: one line naming the key, the value and what is expected.
Reading files and ``--set`` overrides: ``fedsl.experiments.loading``; a config's runs: ``fedsl.experiments.sweep``.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from fedsl.algorithms import ALGORITHMS, SPECS, check_server_learning, defaults
from fedsl.algorithms.distillation import SCHEDULES as DISTILL_SCHEDULES
from fedsl.algorithms.distillation import Distillation
from fedsl.algorithms.gamma_schedule import GammaSchedule
from fedsl.algorithms.gamma_schedule import Kind as GammaKind
from fedsl.algorithms.privacy import AdaptiveClipping
from fedsl.algorithms.robust import AGGREGATORS, BUCKETED, Robust, bucket_count, default_bulyan_f, default_krum_f
from fedsl.algorithms.robust import READS as ROBUST_READS
from fedsl.core.attacks import DEFAULT_SCALE, KINDS, Attack
from fedsl.core.attacks import READS as ATTACK_READS
from fedsl.core.participation import PATTERNS, STRAGGLER_MODES, Participation
from fedsl.data import registry
from fedsl.data.synthetic_fedprox import SIZE_MAX as SYNTHETIC_SIZE_MAX
from fedsl.data.synthetic_fedprox import TEST_CLIENTS as SYNTHETIC_TEST_CLIENTS
from fedsl.data.synthetic_leaf import MODEL_SEED as SYNTHETIC_MODEL_SEED
from fedsl.engine.client_state import STORE_DTYPES, STORES, StoreSettings
from fedsl.engine.executors import COMPILE_MODES
from fedsl.engine.functional import EVAL_PRECISIONS
from fedsl.experiments.tune_space import TuneConfig

# Tables that configure one of fedsl's dataclasses take their defaults from it, where they are written once:
# γ's schedule (server.gamma_*), the robust rule ([robust]), the Byzantine clients ([attack]) and participation
# (algorithm.availability, straggler_*), as the rules' own hyper-parameters take theirs from their specs.
_SCHEDULE, _ROBUST, _ATTACK, _PARTICIPATION = GammaSchedule(), Robust(), Attack(), Participation()
_ADAPTIVE = AdaptiveClipping()  # [privacy]'s adaptive clipping (fedsl.algorithms.privacy)
_DISTILL = Distillation()  # FedDF's [distill] table
_STORE = StoreSettings()  # the clients' states' store ([client_state]; fedsl.engine.client_state)


class ConfigError(ValueError):
    """A bad configuration; the message is one line meant for the user."""


class _Strict(BaseModel):
    # strict: no silent coercion (true -> 1, "5" -> 5); no inf/nan learning rates
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True, allow_inf_nan=False)


# Upper bounds: absurd values stop at validation with one line, not later with a MemoryError
# or hours of silence (each is in its field's description).
ROUNDS_MAX = 10**7          # rounds and every per-round period (eval_every, checkpoint_every, ...)
SEED_MAX = 2**63 - 1        # seeds are non-negative int64
CLIENTS_MAX = 1_000_000     # N, S, c
PER_CLASS_MAX = 1_000_000   # generated or carved images per class
SAMPLES_MAX = 10_000_000    # sample counts (n_i, n0)
BATCH_MAX = 1_000_000       # batch sizes
EPOCHS_MAX = 10_000         # epochs per round
STEPS_MAX = 1_000_000       # steps per round
# executor = 'auto' on a CPU: the run's client training (GFLOP) from which a process pool pays (experiments.placement)
POOL_MIN_GFLOP = 4000.0
RUNS_MAX = 100_000          # runs of one config (variants × sweep points × seeds)

# Names of runs and variants become folder names under --out: a safe character set only.
NAME_MAX = 200
_NAME = re.compile(r"\w[\w .+=,()-]*")  # \w: letters and digits of any script, and _
NAME_RULE = (f"letters, digits, spaces and _ . - + = , ( ) only, starting with a letter, digit or _, "
             f"at most {NAME_MAX} bytes in UTF-8 (it names the run's folder)")
_UNSAFE = re.compile(r"[^\w .+=,()-]")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a run folder (None when it can)."""
    if not name:
        return "expected a non-empty name"
    if not _NAME.fullmatch(name) or len(name.encode("utf-8")) > NAME_MAX:
        return f"expected {NAME_RULE}"
    return None


def slug(text: str) -> str:
    """``text`` with every character outside the safe set replaced by '_'."""
    return _UNSAFE.sub("_", text)


DATASETS = registry.names()  # one entry each in fedsl.data.registry.DATASETS
SERVER_DATASETS = registry.server_source_names()  # D0's other sources: fedsl.data.registry.SERVER_SOURCES
UNLABELLED_SOURCES = ("server", *SERVER_DATASETS)  # FedDF's unlabelled data: D0's images, or another source's


class DataConfig(_Strict):
    dataset: Literal[DATASETS] = Field(description="dataset name: " + ", ".join(DATASETS))
    data_dir: str | None = Field(None, description="folder with the dataset files (else env FEDSL_DATA_DIR, "
                                                   "else ~/.cache/fedsl/data)")
    download: bool = Field(False, description="download missing publisher files (needs a network)")
    emnist_split: Literal["balanced", "bymerge", "byclass", "letters", "digits", "mnist"] = Field(
        "balanced", description="EMNIST split")
    classes: list[str] | Literal["paper45"] | None = Field(
        None, description="class subset by name (EMNIST: 'paper45' = the paper's 45 classes)")
    carve: bool = Field(False, description="carve train/test (train_per_class + test_per_class per class) out of "
                                           "the one split that exists locally, e.g. EMNIST ByMerge test")
    normalize: Literal["standardize", "unit"] = Field(
        "standardize", description="inputs: 'standardize' (pixels/255, then per-channel mean and std of the "
                                   "training split, for clients, D0 and test set alike) or 'unit' (pixels/255 only)")
    carve_test: Literal["up_to", "exact"] = Field(
        "up_to", description="carving: a class short of train_per_class + test_per_class gives the test set what "
                             "is left after its training share ('up_to', the test size is in summary.json) or is "
                             "refused ('exact')")
    num_clients: int = Field(20, ge=1, le=CLIENTS_MAX, description=f"N, number of clients (at most {CLIENTS_MAX:,})")
    partition: Literal["classes", "iid", "dirichlet", "shards", "natural"] = Field(
        "classes", description="'classes' (paper: C classes per client), 'iid', 'dirichlet', 'shards' or 'natural' "
                               "(one client per id of the files: LEAF's users, data.id_column of hf_files; "
                               "data.num_clients = N keeps the first N ids, sorted)")
    classes_per_client: int = Field(2, ge=1, le=10_000, description="C, label classes per client (at most 10,000)")
    samples_per_client: int | None = Field(None, ge=1, le=SAMPLES_MAX, description="n_i; default: the pool split "
                                                                                    "evenly over N (at most 10^7)")
    dirichlet_alpha: float = Field(0.5, gt=0, description="α of the Dirichlet label-skew partition")
    shards_per_client: int = Field(2, ge=1, le=10_000, description="shards per client (McMahan et al. partition; "
                                                                     "at most 10,000)")
    quantity_skew: float | None = Field(None, gt=0, description="β: IID labels, client sizes ∝ Dirichlet(β)")
    server_source: Literal["iid", "clients", "dataset", "other_ids"] = Field(
        "iid", description="D0 from: 'iid' training samples, 'clients' (c clients × s samples), another 'dataset', "
                           "or 'other_ids' (natural partition: the training samples of the c = data.server_clients "
                           "ids after the N clients', ids that are not clients)")
    server_size: int = Field(0, ge=0, le=SAMPLES_MAX, description="n0 = |D0| (iid: ≈ n0/L per class; other sources: "
                                                                    "a size budget, 0 = all they give; at most 10^7)")
    server_overlap: bool = Field(True, description="iid D0 drawn from the whole pool (paper) or disjoint from clients")
    server_clients: int = Field(10, ge=1, le=CLIENTS_MAX, description="c, clients the server takes samples from "
                                                                        f"(paper Scenario 2; at most {CLIENTS_MAX:,})")
    server_samples_per_client: int = Field(50, ge=1, le=PER_CLASS_MAX, description="s, samples taken from each of "
                                                                                     "the c clients (at most 10^6)")
    server_dataset: Literal[SERVER_DATASETS] = Field(
        "fslsyn", description="other-source D0: " + ", ".join(
            f"'{s.name}'" + (f" ({s.note})" if s.note else "") for s in registry.SERVER_SOURCES.values()))
    server_data_dir: str | None = Field(None, description="folder of the other-source D0 (default: data_dir)")
    server_per_class: int | None = Field(None, ge=1, le=100_000, description="other-source D0: samples per class "
                                                                               "(paper FSLsyn: STL-10 56 or 80; "
                                                                               "at most 100,000)")
    unlabelled: Literal[UNLABELLED_SOURCES] = Field(
        "server", description="the server's unlabelled data U that FedDF distils on (labels, if any, never read): "
                              "'server' = D0's images, or another source of data.server_dataset's list (e.g. 'stl10', "
                              "or 'stl10_unlabelled': STL-10's 100,000 unlabelled images), appended to the pool")
    unlabelled_size: int = Field(0, ge=0, le=SAMPLES_MAX, description="|U|: that many of data.unlabelled's images, "
                                 "drawn once from the seed (0 = all; at most 10^7)")
    test_size: int | None = Field(None, ge=1, le=SAMPLES_MAX, description="evaluate on this many test samples: a "
                                  "class-balanced subset drawn once, the same for every run and seed (quick looks, "
                                  "quick forms); default: the whole test split, as the paper")
    validation: float = Field(0.0, ge=0, lt=1, description="fraction of each client's training samples held out as "
                              "the validation set (0 = none): pooled, evaluated beside the test set, never trained on")
    # local files read with Hugging Face datasets (fedsl.data.hf_files)
    id_column: str | None = Field(None, min_length=1, description="hf_files: the column of each sample's natural id "
                                  "(writer, user, device) that data.partition = 'natural' makes one client each")
    label_column: str = Field("label", min_length=1, description="hf_files: the column of the class labels")
    test_fraction: float = Field(0.1, gt=0, lt=1, description="hf_files without a test split: the fraction of each "
                                 "id's samples held out as its test samples (⌊f·n_u⌋, drawn once, seed-free); "
                                 "shakespeare: each role's last windows (LEAF's 1 − tf; the FedAvg paper 0.2)")
    # Shakespeare by speaking role (fedsl.data.shakespeare)
    text: Literal["works", "tiny"] = Field("works", description="shakespeare: 'works' (Project Gutenberg's etext "
                                           "#100 or its first part: one client per (play, role), LEAF's) or 'tiny' "
                                           "(tinyshakespeare.txt: one client per speaker)")
    seq_length: int = Field(80, ge=1, le=10_000, description="shakespeare: L, characters per sample's window "
                                                             "(LEAF, FedAvg paper: 80)")
    stride: int = Field(1, ge=1, le=10_000, description="shakespeare: keep every s-th window of a line (1: every "
                                                        "window, LEAF's; larger bounds their overlap)")
    min_samples: int = Field(64, ge=1, le=SAMPLES_MAX, description="shakespeare: a role with fewer windows is "
                                                                   "dropped (LEAF's -k)")
    # font-rendered characters (fedsl.data.synthetic)
    chars: str = Field("0123456789", min_length=2, description="characters (classes) of synthetic_chars")
    train_per_class: int = Field(200, ge=1, le=PER_CLASS_MAX, description="training images per class (synthetic_chars, "
                                                                            "carve; at most 10^6; synthetic_chars: "
                                                                            "len(chars) × (train + test) at most 10^6)")
    test_per_class: int = Field(100, ge=1, le=PER_CLASS_MAX, description="test images per class (synthetic_chars, "
                                                                        "carve; at most 10^6)")
    # Synthetic(α, β) of FedProx (fedsl.data.synthetic_fedprox)
    synthetic_alpha: float = Field(1.0, ge=0, le=100, description="α of synthetic_fedprox's Synthetic(α, β): u_k ~ "
                                   "N(0, α²), the mean of the clients' W_k, b_k (FedProx: 0, 0.5, 1; it shifts every "
                                   "class's logit alike, so it changes no label, as in the authors' generator)")
    synthetic_beta: float = Field(1.0, ge=0, le=100, description="β of synthetic_fedprox's Synthetic(α, β): how much "
                                  "the clients' inputs differ (B_k ~ N(0, β²))")
    synthetic_max_samples: int = Field(SYNTHETIC_SIZE_MAX, ge=2, le=SAMPLES_MAX, description="synthetic_fedprox and "
                                       "synthetic_leaf: cap on a client's n_k (⌊lognormal(4, 2)⌋ + 50, LEAF's "
                                       "⌊lognormal(3, 2)⌋ + 5), the first ⌊0.9·n_k⌋ its training "
                                       "data (LEAF's cap 1,000; at most 10^7)")
    synthetic_test_clients: int = Field(SYNTHETIC_TEST_CLIENTS, ge=1, le=CLIENTS_MAX, description="synthetic_fedprox "
                                        "and synthetic_leaf: the test set is the held-out samples of this many "
                                        "clients drawn once (all N when N is not larger)")
    synthetic_server_alpha: float | None = Field(None, ge=0, le=100, description="synthetic_fedprox: α0, D0 (iid) "
                                                 "drawn through the prior (α0, β0), a shifted D0 (default α: none; "
                                                 "α0 changes no label: β0 shifts)")
    synthetic_server_beta: float | None = Field(None, ge=0, le=100, description="synthetic_fedprox: β0 of the "
                                                "shifted D0's prior (default β: none)")
    # LEAF's synthetic data (fedsl.data.synthetic_leaf); synthetic_alpha and synthetic_beta are not read there (a
    # changed one is refused, as every dataset-specific key with a dataset that does not read it)
    synthetic_clusters: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(
        None, min_length=1, max_length=100, description="synthetic_leaf: the probabilities of its clusters of client "
        "models, summing to 1 (LEAF's prob_clusters; default [1.0], one cluster, as LEAF)")
    synthetic_model_seed: int = Field(SYNTHETIC_MODEL_SEED, ge=0, le=2**63 - 1, description="synthetic_leaf: the seed "
                                      "of the structure the clients' models share (Q, the clusters' centres): one "
                                      "benchmark instance for every run seed, as LEAF's generated files are one "
                                      "(default 931,231, LEAF's default seed); the run's seed draws the clients")

    @model_validator(mode="after")
    def _checks(self) -> "DataConfig":
        if len(set(self.chars)) != len(self.chars):
            raise ValueError(f"data.chars = {self.chars!r}: expected distinct characters")
        if isinstance(self.classes, list) and len(set(self.classes)) != len(self.classes):
            raise ValueError(f"data.classes = {self.classes!r}: expected distinct class names")
        if self.classes == "paper45" and self.dataset != "emnist":
            raise ValueError(f"data.classes = 'paper45' is for dataset 'emnist', not {self.dataset!r}")
        if self.partition == "natural" and not registry.DATASETS[self.dataset].natural:
            raise ValueError(f"data.partition = 'natural' needs an id per sample: expected data.dataset "
                             f"{' or '.join(repr(n) for n, i in registry.DATASETS.items() if i.natural)}, "
                             f"not {self.dataset!r}")
        if self.partition == "natural" and self.samples_per_client is not None:
            raise ValueError(f"data.samples_per_client = {self.samples_per_client}: with data.partition = 'natural' "
                             "each client holds its id's samples; expected it unset")
        if self.quantity_skew is not None and self.partition != "iid":
            raise ValueError(f"data.quantity_skew = {self.quantity_skew}: only with data.partition = 'iid'")
        if self.server_source == "other_ids" and self.partition != "natural":
            raise ValueError("data.server_source = 'other_ids' takes D0 from ids that are not clients: expected "
                             f"data.partition = 'natural', not {self.partition!r}")
        if self.server_source == "dataset" and not registry.SERVER_SOURCES[self.server_dataset].labelled:
            raise ValueError(f"data.server_dataset = {self.server_dataset!r} has no labels, and D0 needs them: "
                             f"expected a labelled source, or data.unlabelled = {self.server_dataset!r} (FedDF's "
                             "unlabelled data)")
        if self.synthetic_clusters is not None and abs(sum(self.synthetic_clusters) - 1) > 1e-6:
            raise ValueError(f"data.synthetic_clusters = {self.synthetic_clusters}: expected probabilities summing "
                             "to 1")
        check = registry.DATASETS[self.dataset].check_config  # the dataset's own rules (synthetic_chars: its size)
        problem = check(self) if check is not None else None
        if problem:
            raise ValueError(problem)
        return self

    @property
    def has_server_data(self) -> bool:
        return self.server_source != "iid" or self.server_size > 0

    @property
    def has_unlabelled_data(self) -> bool:
        """The server has unlabelled data U: D0's images, or another source's."""
        return self.unlabelled != "server" or self.has_server_data


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

    @model_validator(mode="after")
    def _known_or_import_path(self) -> "ModelConfig":
        from fedsl.models import MODELS, import_problem
        if self.name not in MODELS and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.name):
            raise ValueError(f"model.name = {self.name!r}: expected one of {', '.join(MODELS)} "
                             "or an import path 'package.module:factory'")
        if self.name not in MODELS and (problem := import_problem(self.name)):
            raise ValueError(problem)  # an import path runs code: only where the user opted in
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


@dataclass(frozen=True)
class OwnKeys:
    """Keys of table ``section`` that only some choices of ``selector`` (``table.key``) read: ``readers`` maps each
    to the choices that do. Another choice's key, changed, would change nothing (a sweep of it would run one config
    many times): a run's config refuses it (``unread_key``); a template (a config with variants or a sweep) gives
    each run only the keys its choice reads and refuses one no run reads (``fedsl.experiments.sweep``); ``--set``
    that switches the choice leaves the old one's keys behind (``without_unread``)."""

    section: str
    selector: str
    readers: dict[str, tuple[str, ...]]

    def choice(self, cfg: BaseModel) -> str:
        """The choice the selector (``table.key``) names in config ``cfg``, e.g. its algorithm's name."""
        table, key = self.selector.split(".")
        return getattr(getattr(cfg, table), key)


def lookup(data: dict, dotted: str) -> Any:
    """``data``'s value at a dotted key (None where a table or the key is missing)."""
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


# Who reads what is declared where the choices are: the algorithms' specs (hyper-parameters, distillation), the
# dataset registry (``reads``), the attacks' and robust rules' modules (READS). All of them: OWN_KEYS, below the
# [distill] table.
ALGORITHM_KEYS = OwnKeys("algorithm", "algorithm.name", {
    key: tuple(n for n, s in SPECS.items() if any(h.key == key for h in s.hyperparams)) for key in _HP})
DATA_KEYS = OwnKeys("data", "data.dataset", {key: registry.readers(key) for key in registry.specific_keys()})
ATTACK_KEYS = OwnKeys("attack", "attack.kind", ATTACK_READS)
ROBUST_KEYS = OwnKeys("robust", "robust.aggregator", ROBUST_READS)


@functools.cache
def _default(model: type[BaseModel], key: str) -> Any:
    return model.model_fields[key].default


def changed(table: BaseModel, key: str) -> bool:
    """Whether ``table``'s ``key`` differs from its default. The own-keys rules ask this, not "was it set", so that a
    saved config (every key written) loads."""
    return getattr(table, key) != _default(type(table), key)


def unread_key(rule: OwnKeys, table: BaseModel, choice: str) -> str | None:
    """The one-line problem of a key of ``table`` (the rule's section) that only choices other than ``choice`` read,
    changed from its default, or None."""
    for key, by in rule.readers.items():
        if choice not in by and changed(table, key):
            return (f"{rule.section}.{key} = {getattr(table, key)!r}: read only with {rule.selector} = "
                    f"{' or '.join(repr(b) for b in by)}, not {choice!r}: expected it unset")
    return None


def without_unread(rule: OwnKeys, table: dict, choice: Any, keep: Callable[[str], bool] | None = None) -> dict:
    """``table``, the rule's section as a dict, without the keys ``choice`` does not read, save those ``keep`` names
    (set with it): a FedAvg run of a FedProx template, or ``--set algorithm.name=fedavg`` on a FedProx config, runs
    without μ."""
    drop = {k for k, by in rule.readers.items() if choice not in by and k in table and not (keep and keep(k))}
    return {k: v for k, v in table.items() if k not in drop} if drop else table


def switched(data: dict, base: dict) -> list[tuple[OwnKeys, Any]]:
    """The rules whose choice differs between config dicts ``data`` and ``base``, with ``data``'s choice."""
    return [(rule, lookup(data, rule.selector)) for rule in OWN_KEYS
            if lookup(data, rule.selector) != lookup(base, rule.selector)]


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


# [distill] and the unlabelled data U are read only by the algorithms that distil (their specs' ``distills``:
# FedDF); for the others U would be loaded and appended to the pool for nothing
_DISTILLERS = tuple(n for n, s in SPECS.items() if s.distills)
DISTILL_KEYS = OwnKeys("distill", "algorithm.name", {key: _DISTILLERS for key in DistillConfig.model_fields})
UNLABELLED_KEYS = OwnKeys("data", "algorithm.name", {"unlabelled": _DISTILLERS, "unlabelled_size": _DISTILLERS})
OWN_KEYS: tuple[OwnKeys, ...] = (ALGORITHM_KEYS, DATA_KEYS, ATTACK_KEYS, ROBUST_KEYS, DISTILL_KEYS, UNLABELLED_KEYS)


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


CLAIM_METRICS = ("final_accuracy", "T_0.5", "rise_time")


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
        return self


class RunConfig(_Strict):
    name: str = Field("run", min_length=1, description=f"run name: {NAME_RULE}")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of partition, sampling, batches, dropout, init "
                                                        "(0 to 2**63 - 1)")
    seeds: list[int] = Field(default_factory=list, description="run every variant once per seed (overrides seed; "
                                                               "each 0 to 2**63 - 1)")
    paper: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="the paper's numbers per variant (e.g. {FSL = {final_accuracy = 0.61, "
                                          "T_0.5 = 203}}), shown beside ours by `fedsl report`")
    paper_claims: list[str] = Field(default_factory=list, description="the paper's claims for this experiment, as text")
    claims: list[Claim] = Field(default_factory=list, description="claims `fedsl report` judges from the runs "
                                                                  "([[claims]] tables: text, better, worse or "
                                                                  "trend, metric, at; see Claim)")
    paper_rounds: int | None = Field(
        None, ge=1, le=ROUNDS_MAX, description="rounds of the paper's runs behind `paper` and `paper_claims` (default: "
                                               "the config's own `rounds` before --quick and --set); `fedsl report` "
                                               "says so beside the paper's numbers when ours ran fewer")
    plot: Literal["auto", "lines", "heatmap"] = Field(
        "auto", description="how `fedsl report` draws a sweep: 'lines' = final accuracy and rise time against the "
                            "first swept key, a line per variant and value of the other keys (the paper's Fig. 3); "
                            "'heatmap' = final accuracy over the first two keys, a panel per variant (Fig. 5); "
                            "'auto' = lines for one key, heat maps for more (one key always gives lines)")
    quick: dict[str, Any] = Field(default_factory=dict, description="dotted overrides applied by --quick: a "
                                                                    "minutes-long form of the experiment")
    sweep: dict[str, list[Any]] = Field(
        default_factory=dict, description="dotted key -> list of values: one run per combination, e.g. "
                                          "'server.gamma' = [0.5, 1, 1.5] (× variants × seeds)")
    rounds: int = Field(ge=1, le=ROUNDS_MAX, description="T, number of rounds, at most 10^7")
    eval_every: int = Field(1, ge=1, le=ROUNDS_MAX, description="evaluate every this many rounds (paper: 1); T_a "
                                                                "and rise time are then found to within this many "
                                                                "rounds (summary.json: time_resolution)")
    eval_final_window: bool = Field(
        True, description="also evaluate each of the last rolling_window rounds, whatever eval_every is, so that the "
                          "final accuracy is the paper's (the mean over every one of the last 20 rounds) at "
                          "1/eval_every of the evaluation cost elsewhere; false = the final accuracy is the mean of "
                          "the evaluations that fall in the window (parity-cifar10: the last 3 of every 10)")
    eval_batch_size: int = Field(100, ge=1, le=BATCH_MAX, description="evaluation batch size (at most 10^6)")
    eval_precision: Literal[EVAL_PRECISIONS] = Field(
        "float32", description="evaluation's forward passes: 'float32' (as trained), or 'bfloat16' autocast "
                               "(opt-in; what it changes in accuracy and time for the paper's CNN: "
                               "benchmarks/RESULTS-gpu.md)")
    rolling_window: int = Field(20, ge=1, le=ROUNDS_MAX, description="rounds in the rolling accuracy window "
                                                                     "(paper: 20)")
    checkpoint_every: int = Field(10, ge=0, le=ROUNDS_MAX, description="write a resumable checkpoint (with the "
                                  "clients' tables: N × d for SCAFFOLD/FedDyn) every this many rounds; 0 = only on "
                                  "interruption. A finished run's checkpoint keeps its model and server state only")
    diag_every: int = Field(0, ge=0, le=ROUNDS_MAX, description="measure ξ², G² and cos(∇F, ∇f0) every this many "
                                                                "rounds (full-batch gradients; 0 = never; paper: 50)")
    diverge_loss: float = Field(100.0, ge=0, description="stop a run as 'diverged' when its test loss exceeds this "
                                                         "factor × max(initial loss, ln L) for diverge_patience "
                                                         "evaluations in a row (a finite blow-up: weights ≈ 1e25, "
                                                         "accuracy at chance); non-finite loss always stops it; "
                                                         "0 = only non-finite")
    diverge_patience: int = Field(3, ge=1, le=1000, description="consecutive evaluations above the diverge_loss "
                                                                "bound before a run counts as diverged")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="device")
    dtype: Literal["float32", "float64"] = Field("float32", description="floating point precision")
    executor: Literal["auto", "sequential", "vectorised", "processes"] = Field(
        "auto", description="client executor: 'sequential' (a loop over the round's clients), 'vectorised' (vmap "
                            "over clients; auto on CUDA), 'processes' (CPU: the clients split over one worker "
                            "process per usable core, one torch thread each; the clients' models bit-identical to "
                            "'sequential' at threads = 1). auto on a CPU: 'processes' when threads = 0 leaves the "
                            "run 2 or more free cores, S >= 2 and the run's client training (T·S·K·B samples at the "
                            f"model's FLOPs) reaches {POOL_MIN_GFLOP:,.0f} GFLOP, which wins back the workers' start; "
                            "else 'sequential'")
    compile: Literal[COMPILE_MODES] = Field(
        "off", description="executor = 'vectorised' (auto on CUDA): 'cuda-graphs' captures a round's K local steps "
                           "(and the server's K0) as one CUDA graph per shape and replays it: the same kernels, one "
                           "launch (Scenario 2 on a GPU); the others torch.compile the vectorised step "
                           "('reduce-overhead' with CUDA graphs, 'aot_eager' captures without code generation, a "
                           "check); compiling costs seconds to minutes once per run")
    threads: int = Field(0, ge=0, le=1024, description="torch intra-op threads of the process. 0 = safe automatic: the "
                                              "smallest of torch's current setting, the cores this process may use "
                                              "(affinity), OMP_NUM_THREADS if set, the cores / runs side by side "
                                              "(--parallel), and the cores the load average leaves free; chosen once "
                                              "per process (on a busy machine threads that wait on each other slow a "
                                              "round many times over). Results depend on it in the last bits: set N "
                                              "for bit-identical reruns across machines and loads")
    deterministic: bool = Field(False, description="CUDA: deterministic cuDNN convolutions, so that a resumed run "
                                                   "equals an uninterrupted one bit for bit (slower); CPU runs "
                                                   "always are")
    client_tables: Literal["auto", "device", "host"] = Field(
        "auto", description="where the clients' state tables live on a GPU (SCAFFOLD's c_i, FedDyn's ∇L_i: N × d "
                            "numbers per run, 2.2 GB for 1,000 CIFAR clients; a sparse store's rows of the clients "
                            "seen, [client_state]): 'device'; 'host' (CPU memory: each "
                            "round copies the S sampled rows over and back, so N × d may exceed the GPU's memory; "
                            "slower: the host waits for the round's end); 'auto' = 'host' when one run's tables "
                            "would take more than half the GPU's free memory. Results are the same")
    stack: int | Literal["auto"] = Field(
        "auto", description="sweeps: runs advanced together as one vmapped computation (stacked runs); 'auto' = "
                            "on CUDA up to 64 that fit in memory, on CPU 1 (measured: no gain there); 1 = never; "
                            "at most 1024")
    tracking: list[Literal["tensorboard", "mlflow"]] = Field(
        default_factory=list, description="trackers that follow each run as it goes, besides metrics.csv: "
                                          "'tensorboard' (event files in RUN/tensorboard; needs fedsl[tensorboard]), "
                                          "'mlflow' (a local store, RUN/mlflow.db; needs fedsl[mlflow])")
    description: str = Field("", description="what this run or preset is for")
    data: DataConfig = Field(description="a [data] table with at least dataset = ...")
    model: ModelConfig = Field(ModelConfig(), description="a [model] table")
    algorithm: AlgorithmConfig = Field(description="an [algorithm] table with at least name = ...")
    server: ServerConfig = Field(ServerConfig(), description="a [server] table (server learning)")
    attack: AttackConfig = Field(AttackConfig(), description="an [attack] table (Byzantine clients, simulation only)")
    robust: RobustConfig = Field(RobustConfig(), description="a [robust] table (a robust server rule)")
    privacy: PrivacyConfig = Field(PrivacyConfig(), description="a [privacy] table (DP-FedAvg: clip, noise, ε)")
    distill: DistillConfig = Field(DistillConfig(), description="a [distill] table (FedDF's ensemble distillation)")
    client_state: ClientStateConfig = Field(ClientStateConfig(), description="a [client_state] table (how the clients' "
                                            "states are kept: dense tables or the rows of the clients seen)")
    tune: TuneConfig = Field(TuneConfig(), description="a [tune] table (fedsl tune: trials, rounds per trial, "
                                                       "search space)")
    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named overrides, one run each, compared side by side")

    @property
    def participation(self) -> Participation:
        """Client availability and stragglers (``algorithm.availability``, ``straggler_*``)."""
        a = self.algorithm
        return Participation(a.availability, a.availability_pattern, a.straggler_fraction, a.straggler_mode)

    @property
    def byzantine(self) -> Attack:
        """The Byzantine clients' attack (``[attack]``)."""
        k = self.attack
        return Attack(k.kind, k.fraction, k.scale, k.noise_std, k.constant)

    def evaluates(self, done: int) -> bool:
        """Whether the model after round ``done`` is evaluated: every ``eval_every`` rounds, the last round, and
        (``eval_final_window``) each round of the final rolling window. The simulator and Flower both ask here."""
        return (done % self.eval_every == 0 or done == self.rounds
                or (self.eval_final_window and done > self.rounds - self.rolling_window))

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        if not self.variants and not self.sweep:  # a run (a template's runs are checked as they expand)
            for rule in OWN_KEYS:  # algorithm.mu with FedAvg, data.chars with CIFAR-10: it would change nothing
                if problem := unread_key(rule, getattr(self, rule.section), rule.choice(self)):
                    raise ValueError(problem)
        if isinstance(self.stack, int) and not 1 <= self.stack <= 1024:
            raise ValueError(f"stack = {self.stack}: expected 'auto' or an integer >= 1 (1 = no stacking), "
                             "at most 1024")
        if self.client_state.on_disk and self.client_tables == "device":
            raise ValueError("client_state.on_disk = true keeps the clients' states in a file on the host: expected "
                             "client_tables = 'auto' or 'host', not 'device'")
        if self.compile == "cuda-graphs" and self.device == "cpu":
            raise ValueError("compile = 'cuda-graphs' captures CUDA graphs: expected device = 'cuda' or 'auto' (on a "
                             "machine with a GPU), not 'cpu'")
        if self.compile != "off" and self.executor in ("sequential", "processes"):
            raise ValueError(f"compile = {self.compile!r} captures the vectorised step: expected executor = "
                             f"'vectorised' or 'auto', not {self.executor!r}")
        if self.eval_precision == "bfloat16" and self.dtype == "float64":
            raise ValueError("eval_precision = 'bfloat16' evaluates float32 models under bf16 autocast (which leaves "
                             "float64 as it is): expected dtype = 'float32', not 'float64'")
        if problem := name_problem(self.name):
            raise ValueError(f"name = {self.name!r}: {problem}")
        for vname in self.variants:
            if problem := name_problem(vname):
                raise ValueError(f"variants.{vname!r}: not a usable variant name: {problem}")
        bad = [x for x in self.seeds if not 0 <= x <= SEED_MAX]
        if bad:
            raise ValueError(f"seeds = {self.seeds}: {bad[0]} is out of range: expected distinct integers from 0 "
                             f"to 2**63 - 1 = {SEED_MAX}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds = {self.seeds}: expected distinct integers from 0 to 2**63 - 1")
        for key, values in self.sweep.items():
            if key.split(".")[0] in ("seed", "seeds", "sweep", "variants", "name") or not key or "" in key.split("."):
                raise ValueError(f"sweep key {key!r}: expected a dotted config key such as 'server.gamma' "
                                 "(use seeds = [...] for seeds)")
            if not values:
                raise ValueError(f"sweep.{key} = []: expected a non-empty list of values")
        d, a = self.data, self.algorithm
        if a.clients_per_round > d.num_clients:
            raise ValueError(
                f"algorithm.clients_per_round = {a.clients_per_round}: expected at most "
                f"data.num_clients = {d.num_clients}")
        check_server_learning(a.name, self.server.learning, d.has_server_data)  # needs D0, composes with FSL-p
        sp = SPECS[a.name]
        if sp.sets_gamma and self.server.gamma_schedule == "adaptive":
            raise ValueError(f"server.gamma_schedule = 'adaptive' adapts γ from cos θ_t, and {sp.display} sets γ_t "
                             f"itself: expected another schedule with algorithm.name = {a.name!r}")
        if self.server.finetune_epochs and not d.has_server_data:
            raise ValueError(f"server.finetune_epochs = {self.server.finetune_epochs} fine-tunes on D0: expected "
                             "data.server_size > 0 or data.server_source = 'clients' / 'dataset' / 'other_ids'")
        if self.privacy.enabled:
            self._privacy_checks()
        if self.server.pretrain and not d.has_server_data:
            raise ValueError("server.pretrain = true needs server data: expected data.server_size > 0 "
                             "or data.server_source = 'clients' / 'dataset' / 'other_ids'")
        if sp.distills:
            self._distill_checks()
        self._robust_checks()
        if registry.on_demand(d.dataset):
            self._on_demand_checks()
        return self

    def _on_demand_checks(self) -> None:
        """What a dataset whose clients' samples are made on demand cannot give (one line each): whatever needs every
        client's samples at once, or one pool shared by stacked runs."""
        where = f"data.dataset = {self.data.dataset!r} makes each client's samples when it is sampled"
        if self.diag_every:
            raise ValueError(f"diag_every = {self.diag_every} takes every client's full-batch gradient, and {where}: "
                             "expected diag_every = 0")
        if self.attack.kind == "label_flip":
            raise ValueError(f"attack.kind = 'label_flip' copies the malicious clients' samples into the pool, and "
                             f"{where}: expected an attack on the updates")
        sp = SPECS[self.algorithm.name]
        if sp.reads_label_counts:
            raise ValueError(f"algorithm.name = {self.algorithm.name!r} reads every client's label counts, and "
                             f"{where}: expected another algorithm")
        if isinstance(self.stack, int) and self.stack > 1:
            raise ValueError(f"stack = {self.stack}: {where}, each round on a pool of its own: expected stack = 1 or "
                             "'auto' (runs one by one)")

    def _distill_checks(self) -> None:
        """What an algorithm that distils the clients' ensemble on unlabelled data (FedDF) needs (one line each)."""
        name, d = self.algorithm.name, self.data
        if not d.has_unlabelled_data:
            raise ValueError(f"algorithm.name = {name!r} distils on the server's unlabelled data, and the server has "
                             "none: expected data.unlabelled = a source (e.g. 'stl10_unlabelled'), or D0's images "
                             "(data.server_size > 0 or data.server_source = 'clients' / 'dataset' / 'other_ids')")
        if self.robust.aggregator != "mean":
            raise ValueError(f"robust.aggregator = {self.robust.aggregator!r} with algorithm.name = {name!r}: its "
                             "distillation reads each client's model, which a robust rule replaces: expected "
                             "robust.aggregator = 'mean'")
        if self.privacy.enabled:
            raise ValueError(f"privacy.clip = {self.privacy.clip} with algorithm.name = {name!r}: its distillation "
                             "reads each client's model, which DP-FedAvg does not protect: expected privacy unset")

    def _robust_checks(self) -> None:
        """Robust rules that cannot run with this config (one line each)."""
        r, s = self.robust, self.algorithm.clients_per_round
        if r.bucket > 1:
            if r.aggregator not in BUCKETED:
                raise ValueError(f"robust.bucket = {r.bucket} averages the updates in buckets before a robust rule: "
                                 f"expected robust.aggregator in {', '.join(BUCKETED)}, got {r.aggregator!r}")
            s = bucket_count(s, r.bucket)  # Krum's checks below count the ⌈S/s⌉ bucket means
        if r.aggregator == "fltrust" and not self.data.has_server_data:
            raise ValueError("robust.aggregator = 'fltrust' scores the clients against the server's own update on "
                             "D0: expected data.server_size > 0 or data.server_source = "
                             "'clients' / 'dataset' / 'other_ids'")
        if r.aggregator == "norm_bound" and r.norm_bound is None:
            raise ValueError("robust.aggregator = 'norm_bound' clips each update to norm τ: expected robust.norm_bound "
                             "= τ > 0")
        if r.aggregator in ("krum", "multi_krum"):
            f = r.krum_f if r.krum_f is not None else default_krum_f(s)
            rows, symbol = krum_rows(r)
            if s - f - 2 < 1:
                raise ValueError(f"robust.aggregator = {r.aggregator!r} scores each update by its S − f − 2 nearest: "
                                 f"expected {rows} >= f + 3 = {f + 3}, got {symbol} = {s} (robust.krum_f = {f})")
            if r.krum_m is not None and r.krum_m > s:
                raise ValueError(f"robust.krum_m = {r.krum_m}: expected at most {rows} = {s}")
        if r.aggregator == "bulyan":
            f = r.krum_f if r.krum_f is not None else default_bulyan_f(s)
            if s < 4 * f + 3:
                raise ValueError(f"robust.aggregator = 'bulyan' picks S − 2f updates by Krum, then averages each "
                                 f"coordinate's S − 4f nearest its median: expected algorithm.clients_per_round S >= "
                                 f"4f + 3 = {4 * f + 3}, got S = {s} (robust.krum_f = {f})")

    def _privacy_checks(self) -> None:
        """What DP-FedAvg's guarantee assumes of the rest of the run (docs/how-to/privacy.md)."""
        a, c = self.algorithm, self.privacy.clip
        if a.weighted:
            raise ValueError(f"privacy.clip = {c} with algorithm.weighted = true: expected weighted = false "
                             "(DP-FedAvg's sensitivity C/S is that of the plain mean; weights n_i/Σn_j would change it "
                             "per client)")
        sp = SPECS[a.name]
        if sp.reads_label_counts:
            raise ValueError(f"privacy.clip = {c} with algorithm.name = {a.name!r}: {sp.display}'s γ_t reads the "
                             "sampled clients' label counts, which the mechanism does not protect: expected another "
                             "algorithm")
        if sp.reads_start_loss:
            raise ValueError(f"privacy.clip = {c} with algorithm.name = {a.name!r}: {sp.display}'s server step reads "
                             "each sampled client's loss F_i(x_t), which the mechanism does not protect: expected "
                             "another algorithm")
        if self.robust.aggregator != "mean":
            raise ValueError(f"privacy.clip = {c} with robust.aggregator = {self.robust.aggregator!r}: DP-FedAvg's "
                             "sensitivity C/S is that of the plain sum of clipped updates, which a robust rule "
                             "replaces: expected robust.aggregator = 'mean'")
        if a.availability < 1:
            raise ValueError(f"privacy.clip = {c} with algorithm.availability = {a.availability}: the accountant's "
                             "sampling rate q = S/N assumes every client can be sampled in every round: expected "
                             "availability = 1")


# ----------------------------------------------------------------------------- validation

def _describe(model: type[BaseModel], loc: tuple) -> str:
    """The description of the field at ``loc`` (for 'expected ...' in messages)."""
    cls: Any = model
    field = None
    for part in loc:
        fields = getattr(cls, "model_fields", None)
        if not fields or part not in fields:
            return ""
        field = fields[part]
        cls = field.annotation
    return field.description or "" if field else ""


def _did_you_mean(loc: tuple, parent: type[BaseModel]) -> str | None:
    """The key meant by unknown key ``loc``: a close spelling in its own table (``algorithm.local_rl``
    -> ``algorithm.local_lr``), else the same name in another table (``gamma`` -> ``server.gamma``)."""
    import difflib

    name, prefix = str(loc[-1]), "".join(f"{p}." for p in loc[:-1])
    near = difflib.get_close_matches(name, list(parent.model_fields), n=1)
    if near:
        return prefix + near[0]
    for table, field in RunConfig.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and sub is not parent:
            near = difflib.get_close_matches(name, list(sub.model_fields), n=1, cutoff=0.85)
            if near:
                return f"{table}.{near[0]}"
    return None


def _format(err: ValidationError, data: dict) -> str:
    # an unknown key first: a typo (`round = 1`) also leaves its key missing, and "did you mean 'rounds'?" is the
    # line that says what to do
    e = min(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    loc = tuple(p for p in e["loc"] if isinstance(p, str))
    key = ".".join(loc) or "config"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    if e["type"] == "extra_forbidden":
        parent: Any = RunConfig
        for part in loc[:-1]:
            parent = parent.model_fields[part].annotation
        allowed = ", ".join(parent.model_fields)
        near = _did_you_mean(loc, parent)
        return f"unknown key '{key}': {f'did you mean {near!r}? ' if near else ''}expected one of {allowed}{more}"
    if e["type"] == "missing":
        return f"missing key '{key}': expected {_describe(RunConfig, loc)}{more}"
    if e["type"] == "value_error":  # from our cross-checks: the message is already complete
        return str(e["ctx"]["error"]) + more
    desc = _describe(RunConfig, loc)
    value = e.get("input")
    return f"{key} = {value!r}: {e['msg'].rstrip('.')}" + (f" ({desc})" if desc else "") + more


def validate(data: dict) -> RunConfig:
    """A plain dict (from TOML) -> RunConfig, or ConfigError with one line."""
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a table of keys, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format(err, data)) from None


def validate_saved(data: dict) -> RunConfig:
    """A config a run saved (its config.json) -> RunConfig. A run started before keys its algorithm, dataset, attack
    or robust rule does not read were refused may hold one (a FedAvg run of a FedProx group carried μ, never read):
    it is dropped, so the run resumes as it ran."""
    if isinstance(data, dict):
        data = dict(data)
        for rule in OWN_KEYS:
            if isinstance(data.get(rule.section), dict):
                data[rule.section] = without_unread(rule, data[rule.section], lookup(data, rule.selector))
    return validate(data)
