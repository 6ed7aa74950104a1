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
from fedsl.core.attacks import READS as ATTACK_READS
from fedsl.data import registry
from fedsl.experiments.config_tables import _HP, DistillConfig


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

# [distill] and the unlabelled data U are read only by the algorithms that distil (their specs' ``distills``:
# FedDF); for the others U would be loaded and appended to the pool for nothing
_DISTILLERS = tuple(n for n, s in SPECS.items() if s.distills)
DISTILL_KEYS = OwnKeys("distill", "algorithm.name", {key: _DISTILLERS for key in DistillConfig.model_fields})
UNLABELLED_KEYS = OwnKeys("data", "algorithm.name", {"unlabelled": _DISTILLERS, "unlabelled_size": _DISTILLERS})
OWN_KEYS: tuple[OwnKeys, ...] = (ALGORITHM_KEYS, DATA_KEYS, ATTACK_KEYS, ROBUST_KEYS, DISTILL_KEYS, UNLABELLED_KEYS)
