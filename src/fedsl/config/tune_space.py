"""What a tuning study searches: the ``[tune]`` table of a config, and each run's search space.

A study (``fedsl tune``) tunes each variant of a config on its own, with the same budget: ``tune.trials`` trials of
``tune.rounds`` rounds, each judged on the validation set (``data.validation``; the test set is never read). The
space of a variant is what its run reads, with the ranges declared where the hyper-parameters are:

- η_l (``algorithm.local_lr``) for every rule, and γ (``server.gamma``) when the run learns on the server
  (``fedsl.algorithms.spec``: ``LOCAL_LR_SEARCH``, ``GAMMA_SEARCH``);
- η_g (``algorithm.global_lr``) for a rule with a server step size, in its spec's ``global_lr_search``;
- the rule's own hyper-parameters that carry a ``search`` range (``HyperParam.search``: FedProx's μ, FedDyn's α,
  FedAdam's τ, ...);
- FedDF's distillation step size and steps (``fedsl.algorithms.distillation.SEARCH``).

``[tune.space]`` narrows, widens or fixes them, key by key: a table ``{low, high, log, integer}`` is a range, a
list is a choice among values, a number or string fixes the key for every trial.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsl.algorithms import SPECS, distillation
from fedsl.algorithms.spec import GAMMA_SEARCH, LOCAL_LR_SEARCH, SQRT_S_SPREAD, Range, Spec

TRIALS_MAX = 10_000
STACK_MAX = 64
METRICS = ("final_val_accuracy",)


class TuneConfig(BaseModel):
    """The ``[tune]`` table: a study's budget, metric and search space (read by ``fedsl tune`` only)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True, allow_inf_nan=False)

    trials: int = Field(20, ge=1, le=TRIALS_MAX, description="trials per variant: every variant gets the same budget "
                                                              f"(at most {TRIALS_MAX:,})")
    rounds: int | None = Field(None, ge=1, le=10**7, description="rounds of each trial (default: the config's rounds)")
    metric: Literal[METRICS] = Field("final_val_accuracy", description="what a trial is judged on: the rolling "
                                     "validation accuracy at its last round (never the test set)")
    validation: float = Field(0.1, gt=0, lt=1, description="data.validation of the trials when the config leaves it "
                                                          "0: the fraction of each client's samples held out")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="seed of the sampler (each trial's draw follows from it "
                                                          "and the trials before)")
    sampler: Literal["tpe", "grid"] = Field("tpe", description="'tpe' (Optuna's TPE over the space) or 'grid' (every "
                                            "combination of [tune.space]'s lists once, in a seeded order, every other "
                                            "key at the config's value: a small grid such as the paper's, chosen on "
                                            "validation data)")
    prune: bool = Field(True, description="false: no pruning whatever tune.pruner says (the older key)")
    pruner: Literal["median", "hyperband", "none"] = Field(
        "median", description="'median': stop a trial whose rolling validation accuracy trails the median of the "
                              "finished trials at the same round, after the first quarter of its rounds (Optuna's "
                              "MedianPruner); 'hyperband': Optuna's HyperbandPruner over rounds (brackets of "
                              "successive halving from rounds/9, keeping a third at each rung); 'none'")
    budget_rounds: int | None = Field(None, ge=1, le=10**9, description="each variant's budget in rounds run "
                                      "(pruned trials count the rounds they ran) instead of tune.trials: every "
                                      "variant the same compute, whatever its pruning")
    stack: int | Literal["auto"] = Field("auto", description="trials asked at once (TPE's constant liar keeps them "
                                         "apart) and run together as stacked runs when their structure agrees; "
                                         "'auto': on a GPU 8, on a CPU 1 (measured: benchmarks/RESULTS-tune.md); "
                                         "at most 64")
    edge_trials: int = Field(6, ge=1, le=TRIALS_MAX, description="trials added each time a best value at the edge "
                                                                 "of its range widens that range")
    edge_widenings: int = Field(2, ge=0, le=10, description="how often a study widens the ranges whose best value "
                                "lies within 5% (of the log-range where log) of an edge that is not a hard bound: "
                                "by a decade on that side (a range's width where linear), then tune.edge_trials "
                                "more trials; 0: never")
    storage: str = Field("sqlite", description="where the studies are kept: 'sqlite' (OUT/study.db, embedded), "
                         "'journal' (Optuna's journal file OUT/study.journal: safe on NFS, a Ray cluster's shared "
                         "folder) or a database URL (postgresql://user@host/db: many machines, many folders)")
    startup_trials: int = Field(5, ge=0, le=TRIALS_MAX, description="trials drawn at random before TPE models the "
                                "space, and finished before pruning starts")
    space: dict[str, Any] = Field(default_factory=dict, description="per config key: {low, high, log, integer} (a "
                                  "range), a list (a choice) or a value (fixed); keys it leaves out keep their "
                                  "default ranges")

    @field_validator("space")
    @classmethod
    def _entries(cls, space: dict[str, Any]) -> dict[str, Any]:
        for key, entry in space.items():
            parse_entry(key, entry)
        return space

    @field_validator("stack")
    @classmethod
    def _stack(cls, stack: int | str) -> int | str:
        if isinstance(stack, int) and not 1 <= stack <= STACK_MAX:
            raise ValueError(f"tune.stack = {stack}: expected 'auto' or trials asked at once, 1 to {STACK_MAX}")
        return stack

    @field_validator("storage")
    @classmethod
    def _storage(cls, storage: str) -> str:
        from fedsl.config.tune_storage import check_storage
        return check_storage(storage)

    @property
    def pruning(self) -> str:
        """The pruner in effect: ``pruner``, or 'none' when ``prune`` is false."""
        return self.pruner if self.prune else "none"


def parse_entry(key: str, entry: Any) -> Range | list | float | int | str | bool:
    """A ``[tune.space]`` entry as a ``Range``, a list of choices or a fixed value; ValueError of one line otherwise."""
    where = f"tune.space.{key!r}"
    if isinstance(entry, dict):
        flags = ("log", "integer", "hard_low", "hard_high")
        unknown = set(entry) - {"low", "high", *flags}
        if unknown or not {"low", "high"} <= set(entry):
            raise ValueError(f"{where} = {entry!r}: expected a table {{low, high}} with optional log, integer, "
                             "hard_low and hard_high (true or false)")
        low, high = entry["low"], entry["high"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise ValueError(f"{where}: low = {low!r}, high = {high!r}: expected numbers")
        if not all(isinstance(entry.get(k, False), bool) for k in flags):
            raise ValueError(f"{where}: {', '.join(flags)}: expected true or false")
        try:
            return Range(float(low), float(high), *(entry.get(k, False) for k in flags))
        except ValueError as e:
            raise ValueError(f"{where}: {e} (an empty range searches nothing)") from None
    if isinstance(entry, list):
        if not entry or len({repr(v) for v in entry}) != len(entry):
            raise ValueError(f"{where} = {entry!r}: expected a list of distinct values to choose from")
        return entry
    if isinstance(entry, (int, float, str, bool)):
        return entry
    raise ValueError(f"{where} = {entry!r}: expected a range table, a list or a value")


def default_space(cfg) -> dict[str, Range]:
    """The keys run ``cfg`` (a ``RunConfig``) reads that a study searches by default, with their ranges."""
    sp = SPECS[cfg.algorithm.name]
    space = {"algorithm.local_lr": LOCAL_LR_SEARCH}
    if sp.global_lr is not None and sp.global_lr_search is not None:
        space["algorithm.global_lr"] = sp.global_lr_search
        if sp.global_lr == "sqrt_s" and sp.global_lr_search == Spec.global_lr_search:  # centred on the paper's √S
            root = math.sqrt(cfg.algorithm.clients_per_round)
            space["algorithm.global_lr"] = Range(root / SQRT_S_SPREAD, root * SQRT_S_SPREAD, log=True)
    if sp.server_mode(cfg.server.learning) != "off" and not sp.sets_gamma:  # FedDU sets γ_t itself
        space["server.gamma"] = GAMMA_SEARCH
    space.update({f"algorithm.{h.key}": h.search for h in sp.hyperparams if h.search is not None})
    if sp.distills:
        space.update({f"distill.{k}": r for k, r in distillation.SEARCH.items()})
    return space


def run_space(cfg, given: dict[str, Any], read: set[str]) -> dict[str, Range | list | Any]:
    """Run ``cfg``'s space: its default space with ``given`` (``[tune.space]``) over it; for a grid
    (``tune.sampler = 'grid'``) ``given`` alone, every other key at the config's value. ``read``: the dotted keys
    the run reads (a key of another rule, changed, would change nothing: refused in one line)."""
    space: dict[str, Any] = {} if cfg.tune.sampler == "grid" else dict(default_space(cfg))
    learns = SPECS[cfg.algorithm.name].server_mode(cfg.server.learning) != "off"
    for key, entry in given.items():
        if key.startswith("server.") and not learns:
            raise ValueError(f"tune.space.{key!r}: algorithm.name = {cfg.algorithm.name!r} runs without server "
                             "learning, so a trial would change nothing: expected it in the variants that learn on "
                             "the server")
        if key not in read:
            raise ValueError(f"tune.space.{key!r}: not a key algorithm.name = {cfg.algorithm.name!r} reads "
                             "(a trial would change nothing): expected one of "
                             + ", ".join(sorted(k for k in read if k.split(".")[0] in ("algorithm", "server",
                                                                                          "distill", "data"))[:40]))
        space[key] = parse_entry(key, entry)
    return space


def describe(space: dict[str, Any]) -> dict[str, str]:
    """The space in words, key by key, for tune.json and the report: '[0.001, 1] log', 'one of [...]', '= v'."""
    out = {}
    for key, entry in space.items():
        if isinstance(entry, Range):
            out[key] = (f"[{entry.low:g}, {entry.high:g}]" + (" log" if entry.log else "")
                        + (" integer" if entry.integer else "") + (" hard low" if entry.hard_low else "")
                        + (" hard high" if entry.hard_high else ""))
        elif isinstance(entry, list):
            out[key] = f"one of {entry!r}"
        else:
            out[key] = f"= {entry!r}"
    return out
