"""Run configuration: a TOML file validated into typed objects.

Every field has a default except ``rounds``, ``data.dataset`` and ``algorithm.name``.
Hyper-parameters left unset (None) follow the paper's rules (``fedsl.algorithms.defaults``)
and are resolved once the data are known (``fedsl.config.resolve.resolve``).
Errors are ``ConfigError``: one line naming the key, the value and what is expected.
Reading files and ``--set`` overrides: ``fedsl.config.loading``; a config's runs: ``fedsl.config.expand``.

This module holds the run's own keys (``RunConfig``), the checks across tables and the validation that turns
pydantic's errors into one line; the tables live beside it, each module one job: ``config_base`` (the error, the
strict base, the bounds, run names), ``config_data`` ([data]), ``config_tables`` ([model], [algorithm], [server],
[attack], [robust], [distill], [client_state], [privacy], [[claims]]) and ``own_keys`` (keys only some choices
read). Everything is imported from here: ``fedsl.config.schema`` is the one import path.
"""


from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from fedsl.algorithms import SPECS, check_client_optimizer, check_server_learning
from fedsl.algorithms.robust import BUCKETED, bucket_count, default_bulyan_f, default_krum_f
from fedsl.algorithms.spec import CLIENT_MEASURES
from fedsl.config.base import (  # noqa: F401 (re-exported: fedsl.config.schema is the one import)
    BATCH_MAX,
    CLIENTS_MAX,
    EPOCHS_MAX,
    NAME_MAX,
    NAME_RULE,
    PER_CLASS_MAX,
    POOL_MIN_GFLOP,
    ROUNDS_MAX,
    RUNS_MAX,
    SAMPLES_MAX,
    SEED_MAX,
    STEPS_MAX,
    ConfigError,
    _Strict,
    name_problem,
    slug,
)
from fedsl.config.data_keys import DATASETS, SERVER_DATASETS, UNLABELLED_SOURCES, DataConfig  # noqa: F401
from fedsl.config.own_keys import (  # noqa: F401
    ALGORITHM_KEYS,
    ATTACK_KEYS,
    DATA_KEYS,
    DISTILL_KEYS,
    OWN_KEYS,
    ROBUST_KEYS,
    UNLABELLED_KEYS,
    OwnKeys,
    changed,
    lookup,
    switched,
    unread_key,
    without_unread,
)
from fedsl.config.tables import (  # noqa: F401
    ALGORITHM_NAMES,
    CLAIM_METRICS,
    AlgorithmConfig,
    AttackConfig,
    Claim,
    ClientStateConfig,
    DistillConfig,
    ModelConfig,
    PrivacyConfig,
    RobustConfig,
    ServerConfig,
    krum_rows,
)
from fedsl.config.tune_space import TuneConfig
from fedsl.core.attacks import Attack
from fedsl.core.participation import Participation
from fedsl.data import registry
from fedsl.engine.executors import COMPILE_MODES
from fedsl.engine.functional import EVAL_PRECISIONS


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
    eval_per_client: bool = Field(
        False, description="also measure each client's accuracy at every evaluation: the global model's test "
                           "accuracy on the client's label mix (fedsl.engine.per_client); metrics.csv gets "
                           "client_acc_mean, client_acc_std (over the N clients) and client_acc_worst10 (the mean of "
                           "the worst 10%), summary.json their final values")
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

    @property
    def server_batch_size(self) -> int:
        """B0: ``server.batch_size``, else the clients' B (the paper's)."""
        return self.server.batch_size or self.algorithm.batch_size

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
        check_client_optimizer(a.name, a.client_momentum)  # the rules that read a client's update as plain SGD's
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
        client's samples at once. (Stacked runs make each run's round pool, and runs of one seed share it.)"""
        where = f"data.dataset = {self.data.dataset!r} makes each client's samples when it is sampled"
        if self.diag_every:
            raise ValueError(f"diag_every = {self.diag_every} takes every client's full-batch gradient, and {where}: "
                             "expected diag_every = 0")
        if self.eval_per_client:
            raise ValueError(f"eval_per_client = true reads every client's labels, and {where}: expected "
                             "eval_per_client = false")
        if self.attack.kind == "label_flip":
            raise ValueError(f"attack.kind = 'label_flip' copies the malicious clients' samples into the pool, and "
                             f"{where}: expected an attack on the updates")
        sp = SPECS[self.algorithm.name]
        if sp.reads_label_counts:
            raise ValueError(f"algorithm.name = {self.algorithm.name!r} reads every client's label counts, and "
                             f"{where}: expected another algorithm")

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
        if sp.reply:
            what = ", ".join(CLIENT_MEASURES[k].meaning.split(",")[0] for k in sp.reply)
            raise ValueError(f"privacy.clip = {c} with algorithm.name = {a.name!r}: {sp.display}'s server step reads "
                             f"each sampled client's {what}, which the mechanism does not protect: expected "
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
                data[rule.section] = without_unread(rule, data[rule.section], rule.choice_in(data))
    return validate(data)
