"""Planning a tuning study: each variant's trial config and search space, checked before any trial, and the digest
of what the studies ask (``fingerprint``: a study is only continued by the same question)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from fedsl.algorithms.spec import Range
from fedsl.config.expand import expand_runs, set_dotted
from fedsl.config.schema import ConfigError, RunConfig, validate
from fedsl.config.tune_space import describe, run_space
from fedsl.runs.build import check


@dataclass
class VariantStudy:
    """One variant's study: its trial config (the run every trial starts from) and search space."""

    variant: str
    trial_config: dict[str, Any]
    space: dict[str, Any]


def plan(cfg: RunConfig, data_checks: bool = True) -> dict[str, VariantStudy]:
    """Each variant's trial config and space (``tune_space``), checked before any trial: every key of a space is one
    its run reads and every value in its range validates (a ConfigError of one line otherwise). ``data_checks``:
    also the checks that build the data (``build.check``), which a worker of a study its driver planned skips."""
    if cfg.sweep:
        raise ConfigError("sweep: a config with a [sweep] is not tuned: expected variants (each tuned on its own, "
                          "the same budget each); [tune.space] says which keys a study searches")
    out: dict[str, VariantStudy] = {}
    for _, (variant, run_cfg) in expand_runs(cfg.model_copy(update={"seeds": []})).items():
        t = run_cfg.tune
        data = run_cfg.model_dump()
        data["rounds"] = t.rounds or run_cfg.rounds
        if not run_cfg.data.validation:
            data["data"]["validation"] = t.validation
        data["name"] = variant
        trial_cfg = validate(data)
        try:  # what needs the data (a batch larger than a client keeps after the validation split): before any trial
            if data_checks:
                check(trial_cfg)
        except ConfigError as e:
            raise ConfigError((f"variants.{variant}: " if cfg.variants else "") + f"{e} (the trials hold out "
                              f"data.validation = {trial_cfg.data.validation} of each client's samples)") from None
        try:
            space = run_space(trial_cfg, t.space, set(_flat_keys(data)))
        except ValueError as e:
            raise ConfigError(f"variants.{variant}: {e}" if cfg.variants else str(e)) from None
        for key, entry in space.items():  # each key at the ends of its range: a key of another rule is refused
            for value in _corners(entry):
                try:
                    validate(_with(data, {key: value}))
                except ConfigError as e:
                    raise ConfigError(f"tune.space.{key!r} = {value!r}" + (f" (variant {variant})" if cfg.variants
                                                                           else "") + f": {e}") from None
        if t.sampler == "grid":
            ranges = [k for k, e in space.items() if isinstance(e, Range)]
            if ranges:
                raise ConfigError("tune.sampler = 'grid'" + (f" (variant {variant})" if cfg.variants else "")
                                  + f": {', '.join(ranges)} has a range, not a list: expected a list of values (or "
                                  "one value) in [tune.space] for every key a grid searches")
            size = math.prod(len(e) for e in space.values() if isinstance(e, list))
            if t.trials > size:
                raise ConfigError(f"tune.trials = {t.trials} with tune.sampler = 'grid'"
                                  + (f" (variant {variant})" if cfg.variants else "")
                                  + f": expected at most the grid's {size} combinations")
        out[variant] = VariantStudy(variant, data, space)
    return out


def grid_points(space: dict[str, Any], seed: int, variant: str) -> list[dict[str, Any]]:
    """Every combination of the space's lists, in an order drawn from (seed, variant): a budget smaller than the
    grid takes a uniform sample of it."""
    import itertools
    import random
    lists = {k: v for k, v in space.items() if isinstance(v, list)}
    points = [dict(zip(lists, combo)) for combo in itertools.product(*lists.values())]
    random.Random(f"{seed}/{variant}").shuffle(points)
    return points


def _flat_keys(data: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in data.items():
        if isinstance(v, dict) and k not in ("variants", "sweep", "quick", "tune"):
            out += _flat_keys(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def _corners(entry: Any) -> list:
    if isinstance(entry, Range):
        return [int(entry.low), int(entry.high)] if entry.integer else [entry.low, entry.high]
    return list(entry) if isinstance(entry, list) else [entry]


def _with(data: dict, values: dict[str, Any]) -> dict:
    out = copy.deepcopy(data)
    for key, value in values.items():
        set_dotted(out, key, value)
    return out


def fingerprint(studies: dict[str, VariantStudy], t) -> str:
    """A digest of what the studies ask (trial configs, spaces, budget, metric, sampler): a study file is only
    continued by the same question. A trial config enters by the keys it sets away from their defaults, so that a
    key a later fedsl adds (at its default, which changes nothing) leaves the question the same."""
    text = json.dumps({v: [_set_keys(validate(s.trial_config)), describe(s.space)] for v, s in studies.items()},
                      sort_keys=True, default=str)
    text += json.dumps([t.trials, t.metric, t.seed, t.prune, t.startup_trials, t.sampler])
    # keys added since the first studies enter only away from their defaults: an older folder keeps its digest
    later = {k: getattr(t, k) for k in ("pruner", "budget_rounds", "stack", "edge_trials", "edge_widenings")
             if getattr(t, k) != type(t).model_fields[k].default}
    if later:
        text += json.dumps(later, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _set_keys(cfg: RunConfig) -> dict[str, Any]:
    """``cfg``'s keys that differ from their defaults, table by table (the [tune] table apart: the digest lists what
    of it matters)."""
    from pydantic import BaseModel

    from fedsl.config.schema import changed
    out: dict[str, Any] = {}
    for key, field in type(cfg).model_fields.items():
        value = getattr(cfg, key)
        if key == "tune":
            continue
        if isinstance(value, BaseModel):
            table = {k: getattr(value, k) for k in type(value).model_fields if changed(value, k)}
            if table:
                out[key] = table
        elif field.is_required() or value != field.get_default(call_default_factory=True):
            out[key] = value
    return out
