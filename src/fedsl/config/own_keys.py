"""Keys that only some choices read: a rule's own hyper-parameters, a dataset's own keys, an attack's, a robust
rule's, FedDF's [distill] and U. Who reads what is declared where the choices are (the specs, the dataset registry,
the attacks' and robust rules' modules); this module turns those declarations into the checks a config, a template
and ``--set`` apply."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from fedsl.algorithms import SPECS
from fedsl.algorithms.robust import READS as ROBUST_READS
from fedsl.config.tables import _HP, DistillConfig
from fedsl.core.attacks import READS as ATTACK_READS
from fedsl.data import registry


@dataclass(frozen=True)
class OwnKeys:
    """Keys of table ``section`` that only some choices of ``selector`` (``table.key``) read: ``readers`` maps each
    to the choices that do. Another choice's key, changed, would change nothing (a sweep of it would run one config
    many times): a run's config refuses it (``unread_key``); a template (a config with variants or a sweep) gives
    each run only the keys its choice reads and refuses one no run reads (``fedsl.config.expand``); ``--set``
    that switches the choice leaves the old one's keys behind (``without_unread``)."""

    section: str
    selector: str
    readers: dict[str, tuple[str, ...]]
    neutral: tuple[tuple[str, Any], ...] = ()  # (key, value): a value every choice may carry (it changes nothing)

    @property
    def selectors(self) -> tuple[str, ...]:
        """The keys the choice is made of (a --set or a sweep of any of them switches it)."""
        return (self.selector,)

    def choose(self, get: Callable[[str], Any]) -> Any:
        """The choice, from ``get`` (a selector's value, None where unset)."""
        return get(self.selector)

    def choice(self, cfg: BaseModel) -> Any:
        """The choice the selector (``table.key``) names in config ``cfg``, e.g. its algorithm's name."""
        return self.choose(lambda dotted: getattr(getattr(cfg, dotted.split(".")[0]), dotted.split(".")[1]))

    def choice_in(self, data: dict) -> Any:
        """The choice in config dict ``data`` (None where its selector is unset)."""
        return self.choose(lambda dotted: lookup(data, dotted))

    def reads(self, key: str, choice: Any) -> bool:
        return choice in self.readers[key]

    def set_away(self, table: BaseModel, key: str) -> bool:
        """Whether ``table``'s ``key`` is changed from its default to a value that is not neutral."""
        return changed(table, key) and (key, getattr(table, key)) not in self.neutral

    def only_with(self, key: str) -> str:
        """Who reads ``key``, in words: "algorithm.name = 'fedprox' or 'fedavg'"."""
        return f"{self.selector} = {' or '.join(repr(b) for b in self.readers[key])}"

    def named(self, choice: Any) -> str:
        """A choice in words (after "not" or "theirs:"): "'fedavg'"."""
        return repr(choice)


@dataclass(frozen=True)
class ServerLearningKeys(OwnKeys):
    """Server learning's keys (γ and its schedule, η0, B0, E_s, K0; w0 in FSL-p's parallel mode only): read by a run
    that learns on the server, whose mode is its algorithm's (FSL: incremental, FSL-p: parallel, FedAvg: off) unless
    ``server.learning`` adds it. ``server.gamma = 0`` is neutral: a run without server learning has γ = 0 (DS is
    recorded at γ = 0 beside FSL's γ in the paper's Fig. 3)."""

    @property
    def selectors(self) -> tuple[str, ...]:
        return ("algorithm.name", "server.learning")

    def choose(self, get: Callable[[str], Any]) -> Any:
        name, learning = get("algorithm.name"), get("server.learning") or "auto"
        return SPECS[name].server_mode(learning) if name in SPECS else None

    def only_with(self, key: str) -> str:
        learners = ", ".join(repr(n) for n, s in SPECS.items() if s.server_mode("auto") in self.readers[key])
        modes = " or ".join(repr(m) for m in self.readers[key])
        return f"server learning (algorithm.name = {learners}, or server.learning = {modes})"

    def named(self, choice: Any) -> str:
        return f"server learning {choice!r}"


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
    for key in rule.readers:
        if not rule.reads(key, choice) and rule.set_away(table, key):
            return (f"{rule.section}.{key} = {getattr(table, key)!r}: read only with {rule.only_with(key)}, not "
                    f"{rule.named(choice)}: expected it unset")
    return None


def without_unread(rule: OwnKeys, table: dict, choice: Any, keep: Callable[[str], bool] | None = None) -> dict:
    """``table``, the rule's section as a dict, without the keys ``choice`` does not read, save those ``keep`` names
    (set with it): a FedAvg run of a FedProx template, or ``--set algorithm.name=fedavg`` on a FedProx config, runs
    without μ."""
    drop = {k for k in rule.readers if not rule.reads(k, choice) and k in table and not (keep and keep(k))}
    return {k: v for k, v in table.items() if k not in drop} if drop else table


def switched(data: dict, base: dict) -> list[tuple[OwnKeys, Any]]:
    """The rules whose choice differs between config dicts ``data`` and ``base``, with ``data``'s choice."""
    return [(rule, rule.choice_in(data)) for rule in OWN_KEYS if rule.choice_in(data) != rule.choice_in(base)]

# [distill] and the unlabelled data U are read only by the algorithms that distil (their specs' ``distills``:
# FedDF); for the others U would be loaded and appended to the pool for nothing
_DISTILLERS = tuple(n for n, s in SPECS.items() if s.distills)
DISTILL_KEYS = OwnKeys("distill", "algorithm.name", {key: _DISTILLERS for key in DistillConfig.model_fields})
UNLABELLED_KEYS = OwnKeys("data", "algorithm.name", {"unlabelled": _DISTILLERS, "unlabelled_size": _DISTILLERS})
# server learning's keys: read when a run learns on the server (its mode, from algorithm.name and server.learning)
_LEARNING = ("incremental", "parallel")
SERVER_KEYS = ServerLearningKeys("server", "server learning", {
    **{key: _LEARNING for key in ("gamma", "gamma_schedule", "gamma_final", "gamma_every", "gamma_factor",
                                  "gamma_threshold", "gamma_shrink", "lr", "batch_size", "epochs", "steps")},
    "weight": ("parallel",)}, neutral=(("gamma", 0.0),))
OWN_KEYS: tuple[OwnKeys, ...] = (ALGORITHM_KEYS, DATA_KEYS, ATTACK_KEYS, ROBUST_KEYS, DISTILL_KEYS, UNLABELLED_KEYS,
                                 SERVER_KEYS)
