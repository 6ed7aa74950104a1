"""One config for both apps: a fedsl run config carried in Flower's run config.

Flower flattens ``[tool.flwr.app.config]`` (and ``flwr run --run-config``) into dotted
keys: ``algorithm.local_lr = 0.05`` is fedsl's ``algorithm.local_lr``. A few dashed keys
are Flower-side options (``FLOWER_KEYS``); everything else is a fedsl config key,
validated by ``fedsl.config.schema`` with the same one-line errors as ``fedsl run``.
A base config may come from a fedsl TOML file (``config-file``) or a bundled preset
(``preset``), and ``variant`` picks one of its ``[variants.X]``; the run-config keys
override it.

Flower's ``num-server-rounds`` (its app templates' name for T) sets ``rounds`` when the run config
does not. Keys that are neither (their first dotted part is no fedsl key, e.g. a user's own
``data-dir``) are left to the user's code: fedsl ignores them, except a near miss
of one of its keys (``rouds``, ``eval-every``), refused as a likely typo. A ClientApp needs little of
the config (``CLIENT_DEFAULTS``): ``data.*`` (the federation it holds a partition of), ``seed``,
``model.*``, ``dtype``; η_l, B, E, K come from the train message when it carries them, the clients' momentum and
weight decay (``algorithm.client_momentum``, ``algorithm.weight_decay``) from the run config, as in ``fedsl run``.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsl.algorithms import SPECS, Algorithm, Pretraining, Spec
from fedsl.algorithms import spec as algorithm_spec
from fedsl.algorithms.spec import CLIENT_MEASURES
from fedsl.config import presets
from fedsl.config.expand import expand_variants, set_dotted
from fedsl.config.loading import read_file
from fedsl.config.schema import ConfigError, PrivacyConfig, RunConfig, validate
from fedsl.core.privacy_accounting import Budget
from fedsl.data import registry
from fedsl.data.federation import Federation
from fedsl.engine.simulator import Simulator
from fedsl.runs.build import prepare  # `fedsl run`'s own resolution of the paper's defaults

# Flower-side options (dashed, so they never collide with fedsl's snake_case keys)
FLOWER_KEYS = ("preset", "config-file", "variant", "out-dir", "round-timeout", "straggler-timeout", "min-nodes",
               "node-wait", "client-delay", "resume", "node-partitions", "federation", "max-examples", "secagg",
               "secagg-shares", "secagg-threshold", "secagg-clipping-range", "secagg-quantization-range")
# How the server treats its clients (run config ``federation``; docs/reference/flower-protocol.md):
# open: clients own their data and the server knows only what they report (the default: a real federation);
# replay: every machine rebuilds the simulator's federation from the config, and the server replays the
# simulator's run exactly (partition ids, n_i, sampled clients): for parity tests and simulated availability.
FEDERATIONS = ("open", "replay")
# fedsl's own keys: the first dotted part of every key validated as a fedsl config key
FEDSL_KEYS = tuple(RunConfig.model_fields)
# What a ClientApp assumes when the run config leaves it out (it does not sample clients nor count rounds):
# plain local SGD (the rule's correction only matters to the ClientApps of fedsl's own strategy, whose run
# config names it), one round, one client per round.
CLIENT_DEFAULTS = {"algorithm.name": "fedavg", "rounds": 1, "algorithm.clients_per_round": 1}
# SecAgg+ masks with integers modulo 2^32 (Flower's largest modulus_range): the sum of S quantised models, each
# entry in 0..Q, must stay below it (S · Q < 2^32), else the aggregate wraps around.
SECAGG_MODULUS = 2**32


def user_key(key: str) -> bool:
    """Whether a run-config key is the user's (fedsl ignores it): neither a Flower-side option nor a fedsl key.

    Raises:
        ConfigError: a near miss of a fedsl key or option (a likely typo), in one line.
    """
    top = key.split(".")[0]
    if key in FLOWER_KEYS or top in FEDSL_KEYS:
        return False
    near = difflib.get_close_matches(top, FEDSL_KEYS + FLOWER_KEYS, n=1, cutoff=0.8)
    if near:
        raise ConfigError(f"run config key {key!r}: not a fedsl key; did you mean {near[0]!r}? (keys fedsl does not "
                          "know are left to your code: rename it if it is yours)")
    return True


def client_defaults(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``CLIENT_DEFAULTS`` a ClientApp adds to ``run_config`` (none when a base config is named)."""
    if run_config.get("preset") or run_config.get("config-file"):
        return {}
    given = set(run_config) | ({"rounds"} if "num-server-rounds" in run_config else set())
    return {k: v for k, v in CLIENT_DEFAULTS.items() if k not in given}


@dataclass(frozen=True)
class FlowerOptions:
    """Options of a Flower run that are not part of the algorithm.

    Attributes:
        out_dir: where the ServerApp writes ``final.pt``, ``rounds.json``, ``evaluations.json``,
            ``received.json`` and, every ``checkpoint_every`` rounds, ``checkpoint.pt`` ("" = nowhere).
        round_timeout: seconds the ServerApp waits for a round's replies; clients that have
            not replied by then are dropped for the rest of the run.
        straggler_timeout: seconds to wait for the rest of a round's replies once the first one
            arrived (0 = up to ``round_timeout``); bounds what a crashed node costs a round.
        min_nodes: connected SuperNodes to wait for before round 1.
        node_wait: seconds to wait for them (then the run starts with the nodes there are; with none at all,
            and min_nodes ≥ 1, the ServerApp fails at once: ``strategy.NoNodes``); a later round that has lost
            every node waits as long for one (then fails the same way, its rounds done checkpointed).
        client_delay: seconds a ClientApp sleeps before training (for failure tests only).
        resume: continue from ``out_dir/checkpoint.pt`` when there is one (written every
            ``checkpoint_every`` rounds by the ServerApp); False: start over at round 1.
        node_partitions: the server's assignment of partitions to nodes, node id -> partition id
            (run config ``node-partitions = "ID:I,ID:I,..."``, e.g. the node ids that
            ``flwr supernode register`` printed); empty: a partition is assigned to the first
            connected node that claims it (its node config's ``partition-id``), and the lowest free
            one to a node whose ClientApp answers no query (a plain Flower client).
        user_keys: run-config keys fedsl ignores (the user's own, left to their code).
        federation: ``open`` (default): the server samples S of the connected nodes (seeded) and accepts a stock
            Flower reply (``arrays`` + ``num-examples``); ``replay``: the simulator's run over the network
            (partition ids, the simulator's sampled clients, n_i checked against the rebuilt federation).
        max_examples: an open federation's bound on a reply's ``num-examples`` (n_i weighs updates under
            ``algorithm.weighted`` and FSL-p); a reply above it is left out of the round, with one log line.
            Under SecAgg+ with ``algorithm.weighted`` it is also the largest weight (Flower's ``max_weight``).
        secagg: secure aggregation (Flower's SecAgg+, ``fedsl.flower.secagg``): the server gets only the sum
            of the round's models, never one x_i (docs/how-to/secure-aggregation.md).
        secagg_shares: SecAgg+'s ``num_shares``: each client's secrets are split into this many shares, one per
            neighbour (an integer >= 3, or a fraction in (0, 1] of the round's clients; 1.0: all of them).
        secagg_threshold: SecAgg+'s ``reconstruction_threshold``: shares needed to rebuild a client's secret (an
            integer >= 2 below ``secagg_shares``, or a fraction in (0, 1] of the shares); Flower uses at least 2.
        secagg_clipping_range: c: every (weighted) model entry is clipped to [-c, c] before it is quantised.
        secagg_quantization_range: Q: [-c, c] is mapped onto the integers 0..Q (stochastic rounding), so an
            entry of the aggregate is within 2c/Q of the mean of the clipped models (uniform weights).
    """

    out_dir: str = ""
    round_timeout: float = 600.0
    straggler_timeout: float = 0.0
    min_nodes: int = 1
    node_wait: float = 300.0
    client_delay: float = 0.0
    resume: bool = True
    node_partitions: tuple[tuple[int, int], ...] = ()
    user_keys: tuple[str, ...] = ()
    federation: str = "open"
    max_examples: int = 1_000_000
    secagg: bool = False
    secagg_shares: int | float = 1.0
    secagg_threshold: int | float = 0.67
    secagg_clipping_range: float = 8.0
    secagg_quantization_range: int = 2**22

    @property
    def open(self) -> bool:
        """Whether clients own their data (``federation = "open"``)."""
        return self.federation == "open"


def check_open_federation(cfg: RunConfig, options: FlowerOptions) -> None:
    """What an open federation cannot run, in one line each: what needs the server to know the clients' data.

    Raises:
        ConfigError: the first key that needs ``federation = "replay"``.
    """
    replay = 'set the run config key federation = "replay" (every machine rebuilds the federation from the config)'
    alg = cfg.algorithm
    if options.node_partitions:
        raise ConfigError(f"run config node-partitions assigns partitions, but in an open federation the clients own "
                          f"their data: {replay}")
    if alg.availability < 1 or alg.straggler_fraction > 0:
        raise ConfigError(f"algorithm.availability = {alg.availability} and algorithm.straggler_fraction = "
                          f"{alg.straggler_fraction} simulate partial participation; an open federation has real "
                          f"nodes (the connected ones are sampled): {replay}")
    why = open_refusal(algorithm_spec(alg.name))
    if why:
        raise ConfigError(f"algorithm.name = {alg.name!r} {why}: {replay}")
    if cfg.eval_per_client:
        raise ConfigError(f"eval_per_client = true weighs the test accuracy by each client's label mix, which open "
                          f"clients do not report: {replay}")


def open_refusal(sp: Spec) -> str:
    """Why a rule cannot run in an open federation (it needs the server to know the clients' data), as a clause;
    "" = it can."""
    if sp.reads_label_counts:
        return "reads the sampled clients' label counts, which open clients do not report"
    if sp.reply:
        return ("reads each client's " + ", ".join(f"{CLIENT_MEASURES[k].meaning} ({CLIENT_MEASURES[k].record})"
                                                   for k in sp.reply) + " beside x_i, which open clients do not report")
    if sp.shares_server_data:
        return "trains the clients on D_i ∪ D0, so each client needs the server's D0"
    return ""


def _number_option(flat: Mapping[str, Any], key: str, default: int | float) -> int | float:
    """A run-config value that may be an integer (a count) or a float (a fraction), as Flower's SecAgg+ reads it."""
    value = flat.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"run config {key} = {value!r}: expected an integer or a fraction")
    return value


def secagg_rules() -> tuple[str, ...]:
    """The algorithms whose server half runs on the sum of the models SecAgg+ leaves the server (their specs'
    ``secagg_reason`` is empty) in an open federation, where SecAgg+ runs (``open_refusal`` is empty)."""
    return tuple(name for name, sp in SPECS.items() if not sp.secagg_reason and not open_refusal(sp))


def check_secagg(cfg: RunConfig, options: FlowerOptions) -> None:
    """What cannot run under SecAgg+, and bad SecAgg+ values, in one line each (docs/how-to/secure-aggregation.md).

    The server sees only the sum of the round's models. A rule runs under it when its server half reads the models
    through their (weighted) mean alone (``secagg_rules``: its spec's ``secagg_reason`` is empty).

    Raises:
        ConfigError: the first key that SecAgg+ cannot run with, or a bad ``secagg-*`` value.
    """
    alg, s = cfg.algorithm, cfg.algorithm.clients_per_round
    if not options.open:
        raise ConfigError('run config secagg = true with federation = "replay": secure aggregation runs in an open '
                          'federation (federation = "open"); replay checks each client\'s x_i against the '
                          "simulator's, which the server never sees under SecAgg+")
    if cfg.robust.aggregator != "mean":
        raise ConfigError(f"robust.aggregator = {cfg.robust.aggregator!r} needs every client's model x_i, and under "
                          "secagg = true the server sees only their sum: expected robust.aggregator = 'mean'")
    if cfg.privacy.enabled:
        raise ConfigError(f"privacy.clip = {cfg.privacy.clip} clips each client's update on the server, and under "
                          "secagg = true the server sees only their sum: expected privacy unset (DP with secure "
                          "aggregation needs the clients to clip and noise their own updates: not built)")
    sp = algorithm_spec(alg.name)
    reason = sp.secagg_reason  # the rule's server half needs more than the sum of the models
    if reason:
        raise ConfigError(f"algorithm.name = {alg.name!r} {reason}; under secagg = true the server sees only the sum "
                          f"of the models: use {', '.join(secagg_rules())}")
    if sp.plain_mean and alg.weighted:
        raise ConfigError(f"algorithm.name = {alg.name!r} averages the models plainly, so under secagg = true the "
                          "clients are weighted equally: expected algorithm.weighted = false")
    if s < 2:
        raise ConfigError(f"algorithm.clients_per_round = {s} with secagg = true: SecAgg+ sums the models of at "
                          "least 2 clients (expected >= 2; with 1 the sum is that client's model)")
    shares, threshold = options.secagg_shares, options.secagg_threshold
    if isinstance(shares, int) and not 3 <= shares <= s:
        raise ConfigError(f"run config secagg-shares = {shares}: expected an integer in 3..algorithm.clients_per_round "
                          f"= {s}, or a fraction in (0, 1] of the round's clients")
    if isinstance(shares, float) and not 0 < shares <= 1:
        raise ConfigError(f"run config secagg-shares = {shares}: expected a fraction in (0, 1] of the round's clients, "
                          "or an integer >= 3")
    top = shares - 1 if isinstance(shares, int) else s  # Flower: an integer threshold below an integer shares
    if isinstance(threshold, int) and not 2 <= threshold <= top:
        raise ConfigError(f"run config secagg-threshold = {threshold}: expected an integer in 2..{top} (below "
                          f"secagg-shares, at most algorithm.clients_per_round), or a fraction in (0, 1] of the shares")
    if isinstance(threshold, float) and not 0 < threshold <= 1:
        raise ConfigError(f"run config secagg-threshold = {threshold}: expected a fraction in (0, 1] of the shares, "
                          "or an integer >= 2")
    c, q = options.secagg_clipping_range, options.secagg_quantization_range
    if not (math.isfinite(c) and c > 0):
        raise ConfigError(f"run config secagg-clipping-range = {c}: expected a finite number > 0")
    if q < 2:
        raise ConfigError(f"run config secagg-quantization-range = {q}: expected an integer >= 2")
    if s * q >= SECAGG_MODULUS:
        raise ConfigError(f"run config secagg-quantization-range = {q} with algorithm.clients_per_round = {s}: the sum "
                          f"of the quantised models would wrap around 2^32 (expected S · Q < 2^32, i.e. Q <= "
                          f"{(SECAGG_MODULUS - 1) // s})")


def parse_node_partitions(text: str, num_clients: int) -> tuple[tuple[int, int], ...]:
    """``"ID:I, ID:I"`` (node id : partition id) -> sorted pairs; one node per partition and vice versa.

    Raises:
        ConfigError: one line naming the bad entry.
    """
    pairs: dict[int, int] = {}
    owner: dict[int, int] = {}
    for item in text.replace(",", " ").split():
        node_s, sep, pid_s = item.partition(":")
        try:
            node, pid = int(node_s), int(pid_s)
        except ValueError:
            node = pid = -1
        if not sep or node < 0 or not 0 <= pid < num_clients:
            raise ConfigError(f"run config node-partitions entry {item!r}: expected NODE_ID:PARTITION_ID with "
                              f"0 <= PARTITION_ID < data.num_clients = {num_clients}")
        if node in pairs:
            raise ConfigError(f"run config node-partitions: node {node} is listed twice")
        if pid in owner:
            raise ConfigError(f"run config node-partitions: partition {pid} is assigned to nodes {owner[pid]} "
                              f"and {node}")
        pairs[node], owner[pid] = pid, node
    return tuple(sorted(pairs.items()))


def _option(flat: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = flat.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"run config {key} = {value!r}: expected a {kind.__name__}")
    return value


def parse_run_config(run_config: Mapping[str, Any], app_dir: str | Path | None = None
                     ) -> tuple[RunConfig, FlowerOptions]:
    """Flower's (flat) run config -> the fedsl ``RunConfig`` and the Flower options.

    Args:
        run_config: ``context.run_config``: dotted fedsl keys plus ``FLOWER_KEYS``.
        app_dir: folder that a relative ``config-file`` is resolved against (the app's folder).
    Raises:
        ConfigError: one line naming the bad key and value.
    """
    flat = dict(run_config)
    preset = _option(flat, "preset", str, "")
    config_file = _option(flat, "config-file", str, "")
    variant = _option(flat, "variant", str, "")
    if preset and config_file:
        raise ConfigError(f"run config preset = {preset!r} and config-file = {config_file!r}: expected at most one")
    data: dict[str, Any] = {}
    if preset:
        data = presets.load(preset)
    elif config_file:
        path = Path(config_file).expanduser()
        if not path.is_absolute() and app_dir is not None:
            path = Path(app_dir) / path
        data = read_file(path)
    data = copy.deepcopy(data)
    users = []
    for key, value in flat.items():
        if key in FLOWER_KEYS:
            continue
        if user_key(key):
            users.append(key)
            continue
        set_dotted(data, key, value)
    if "num-server-rounds" in flat:  # Flower's templates name T so: it stands for rounds unless rounds is given
        n = flat["num-server-rounds"]
        if "rounds" not in flat:
            data["rounds"] = n
        elif flat["rounds"] != n:
            raise ConfigError(f"run config num-server-rounds = {n!r} and rounds = {flat['rounds']!r}: expected one "
                              "of them, or equal values")
    for key in ("seeds", "sweep"):
        if data.get(key):
            raise ConfigError(f"{key} = {data[key]!r}: a Flower run is one run; set seed = ... instead")
    variants = data.get("variants") or {}
    if variant:
        if variant not in variants:
            raise ConfigError(f"run config variant = {variant!r}: expected one of {sorted(variants) or '(none)'}")
        data["variants"] = {variant: variants[variant]}
    elif len(variants) > 1:
        raise ConfigError(f"the config has variants {sorted(variants)}: a Flower run is one run; "
                          "pick one with the run config key variant = \"NAME\"")
    cfg = validate(data)
    (cfg,) = expand_variants(cfg, picked=bool(variant)).values()
    if registry.on_demand(cfg.data.dataset):  # a node would make its partition's samples: not built there
        raise ConfigError(f"data.dataset = {cfg.data.dataset!r} makes each client's samples on demand, which runs in "
                          "`fedsl run`; a Flower node trains on data it holds: expected a dataset of files")
    if cfg.data.validation:  # the server's strategy records the test set's evaluations only
        raise ConfigError(f"data.validation = {cfg.data.validation}: a validation set is evaluated by `fedsl run`; a "
                          "Flower run's server evaluates the test set only: expected data.validation = 0")
    if cfg.attack.kind != "none":  # robust rules run on Flower (server_round.aggregate); attacks are simulated
        raise ConfigError(f"attack.kind = {cfg.attack.kind!r}: Byzantine clients are simulated by `fedsl run`; a "
                          "Flower run's clients are real nodes: expected attack.kind = 'none'")
    options = FlowerOptions(
        out_dir=_option(flat, "out-dir", str, ""),
        round_timeout=_option(flat, "round-timeout", float, FlowerOptions.round_timeout),
        straggler_timeout=_option(flat, "straggler-timeout", float, 0.0),
        min_nodes=_option(flat, "min-nodes", int, FlowerOptions.min_nodes),
        node_wait=_option(flat, "node-wait", float, FlowerOptions.node_wait),
        client_delay=_option(flat, "client-delay", float, 0.0),
        resume=_option(flat, "resume", bool, FlowerOptions.resume),
        node_partitions=parse_node_partitions(_option(flat, "node-partitions", str, ""), cfg.data.num_clients),
        user_keys=tuple(sorted(users)),
        federation=_option(flat, "federation", str, FlowerOptions.federation),
        max_examples=_option(flat, "max-examples", int, FlowerOptions.max_examples),
        secagg=_option(flat, "secagg", bool, False),
        secagg_shares=_number_option(flat, "secagg-shares", FlowerOptions.secagg_shares),
        secagg_threshold=_number_option(flat, "secagg-threshold", FlowerOptions.secagg_threshold),
        secagg_clipping_range=_option(flat, "secagg-clipping-range", float, FlowerOptions.secagg_clipping_range),
        secagg_quantization_range=_option(flat, "secagg-quantization-range", int,
                                          FlowerOptions.secagg_quantization_range),
    )
    if options.federation not in FEDERATIONS:
        raise ConfigError(f"run config federation = {options.federation!r}: expected one of {', '.join(FEDERATIONS)}")
    if options.max_examples < 1:
        raise ConfigError(f"run config max-examples = {options.max_examples}: expected an integer >= 1")
    if options.open:
        check_open_federation(cfg, options)
    if options.secagg:
        check_secagg(cfg, options)
    if options.round_timeout <= 0:
        raise ConfigError(f"run config round-timeout = {options.round_timeout}: expected seconds > 0")
    if options.straggler_timeout < 0:
        raise ConfigError(f"run config straggler-timeout = {options.straggler_timeout}: expected seconds >= 0")
    if options.min_nodes < 0:
        raise ConfigError(f"run config min-nodes = {options.min_nodes}: expected an integer >= 0")
    return cfg, options


@dataclass
class FlowerSetup:
    """What either app builds from the config: the same objects as ``fedsl run``.

    The federation is rebuilt deterministically from (config, seed) on every machine: the
    ClientApp uses its partition D_i, the ServerApp D0 (n0 samples) and the test set. The
    ``Simulator`` instance is the engine both sides call into (its executor, layout, and
    server-learning step with γ·η0, K0 and B0).
    """

    cfg: RunConfig
    options: FlowerOptions
    fed: Federation
    sim: Simulator
    algorithm: Algorithm
    pretrain: Pretraining | None
    privacy: Budget | None = None  # DP's accounting (privacy.clip set): ε in rounds.json and done.json

    @property
    def num_clients(self) -> int:
        """N."""
        return self.fed.num_clients


_CACHE: dict[tuple, FlowerSetup] = {}


def load_setup(run_config: Mapping[str, Any], app_dir: str | Path | None = None, client: bool = False) -> FlowerSetup:
    """Build (once per process and run config) the federation, algorithm, model and engine.

    ``client``: for a ClientApp, which assumes ``CLIENT_DEFAULTS`` for the keys the run config leaves out.
    """
    run_config = {**client_defaults(run_config), **run_config} if client else dict(run_config)
    key = (tuple(sorted((k, repr(v)) for k, v in run_config.items())), str(app_dir))
    if key not in _CACHE:
        cfg, options = parse_run_config(run_config, app_dir)
        if client and cfg.privacy.enabled:  # central DP: the server clips and adds the noise, and accounts;
            cfg = cfg.model_copy(update={"privacy": PrivacyConfig()})  # a ClientApp needs neither nor dp-accounting
        prep = prepare(cfg)  # also sets fedsl's ``threads`` (torch threads of this process)
        if prep.sim.batchnorm == "local":
            raise ConfigError("model.batchnorm = 'local' (FedBN) evaluates each client's own BatchNorm, which the "
                              "nodes keep and a Flower server never sees: expected 'clients', 'server' or 'batch' on "
                              "Flower")
        _CACHE[key] = FlowerSetup(cfg, options, prep.fed, prep.sim, prep.algorithm, prep.pretrain,
                                   prep.privacy)
    return _CACHE[key]
