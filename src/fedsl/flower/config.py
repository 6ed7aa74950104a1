"""One config for both apps: a fedsl run config carried in Flower's run config.

Flower flattens ``[tool.flwr.app.config]`` (and ``flwr run --run-config``) into dotted
keys: ``algorithm.local_lr = 0.05`` is fedsl's ``algorithm.local_lr``. A few dashed keys
are Flower-side options (``FLOWER_KEYS``); everything else is a fedsl config key,
validated by ``fedsl.experiments.config`` with the same one-line errors as ``fedsl run``.
A base config may come from a fedsl TOML file (``config-file``) or a bundled preset
(``preset``), and ``variant`` picks one of its ``[variants.X]``; the run-config keys
override it.

Flower's ``num-server-rounds`` (its app templates' name for T) sets ``rounds`` when the run config
does not. Keys that are neither (their first dotted part is no fedsl key, e.g. a user's own
``data-dir``) are left to the user's code: fedsl ignores them, except a near miss
of one of its keys (``rouds``, ``eval-every``), refused as a likely typo. A ClientApp needs little of
the config (``CLIENT_DEFAULTS``): ``data.*`` (the federation it holds a partition of), ``seed``,
``model.*``, ``dtype``; η_l, B, E, K come from the train message when it carries them.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsl.algorithms import Algorithm, Pretraining
from fedsl.core.privacy_accounting import Budget
from fedsl.data.federation import Federation
from fedsl.engine.simulator import Simulator
from fedsl.experiments import presets
from fedsl.experiments.config import ConfigError, PrivacyConfig, RunConfig, validate
from fedsl.experiments.loading import read_file, set_dotted
from fedsl.experiments.runner import prepare  # the runner's own resolution of the paper's defaults
from fedsl.experiments.sweep import expand_variants

# Flower-side options (dashed, so they never collide with fedsl's snake_case keys)
FLOWER_KEYS = ("preset", "config-file", "variant", "out-dir", "round-timeout", "straggler-timeout", "min-nodes",
               "node-wait", "client-delay", "resume", "node-partitions")
# fedsl's own keys: the first dotted part of every key validated as a fedsl config key
FEDSL_KEYS = tuple(RunConfig.model_fields)
# What a ClientApp assumes when the run config leaves it out (it does not sample clients nor count rounds):
# plain local SGD (the rule's correction only matters to the ClientApps of fedsl's own strategy, whose run
# config names it), one round, one client per round.
CLIENT_DEFAULTS = {"algorithm.name": "fedavg", "rounds": 1, "algorithm.clients_per_round": 1}


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
        node_wait: seconds to wait for them (then the run starts with the nodes there are).
        client_delay: seconds a ClientApp sleeps before training (for failure tests only).
        resume: continue from ``out_dir/checkpoint.pt`` when there is one (written every
            ``checkpoint_every`` rounds by the ServerApp); False: start over at round 1.
        node_partitions: the server's assignment of partitions to nodes, node id -> partition id
            (run config ``node-partitions = "ID:I,ID:I,..."``, e.g. the node ids that
            ``flwr supernode register`` printed); empty: a partition is assigned to the first
            connected node that claims it (its node config's ``partition-id``), and the lowest free
            one to a node whose ClientApp answers no query (a plain Flower client).
        user_keys: run-config keys fedsl ignores (the user's own, left to their code).
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
    (cfg,) = expand_variants(cfg).values()
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
    )
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
        _CACHE[key] = FlowerSetup(cfg, options, prep.fed, prep.sim, prep.algorithm, prep.pretrain,
                                   prep.privacy)
    return _CACHE[key]
