"""A config expanded into its runs: one validated ``RunConfig`` per (variant, sweep point, seed), each named for its
folder; and the dotted keys over nested dicts (``"server.gamma"`` is ``data["server"]["gamma"]``) that the expansion,
reading a config (``loading``) and a study's trials (``fedsl.tune``) share."""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

from fedsl.config.schema import (
    NAME_MAX,
    OWN_KEYS,
    RUNS_MAX,
    ConfigError,
    OwnKeys,
    RunConfig,
    lookup,
    slug,
    validate,
)


def set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part, {}), dict):
            raise ConfigError(f"--set {key}: '{part}' is not a table")
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def get_dotted(data: dict, key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def has_dotted(data: dict, key: str) -> bool:
    try:
        get_dotted(data, key)
    except (KeyError, TypeError):  # a missing part, or a part under a non-table value
        return False
    return True


def _label(value: Any) -> str:
    """A sweep value in a run name: a float in short form (exact where the short form would round it,
    so 0.1 and 0.1000001 name two runs), characters outside the safe set written as '_'."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return slug(str(value))


def expand_variants(cfg: RunConfig, *, picked: bool = False) -> dict[str, RunConfig]:
    """One validated RunConfig per (variant, sweep point, seed).

    Runs are named ``VARIANT[-key=value...][-seedS]``; a run's ``name`` (what tables
    aggregate seeds over) is the part before ``-seedS``. Without variants the config itself
    is the one variant; without ``seeds`` each runs once with ``seed``. A variant that sets a
    swept key to one value is not swept over that key (e.g. DS pinned at ``server.gamma = 0`` in a
    sweep over γ, as in the paper's Fig. 3): it runs once per point of the other keys. One that
    sets it to a list runs at the sweep's values in that list (``variant_points``). ``picked``: the variants were
    picked out of a whole config (Flower's ``variant``), so a top-level algorithm none of them runs is not refused
    here (``_check_top_level_runs``).
    """
    return {run: c for run, (_, c) in expand_runs(cfg, picked=picked).items()}


def _reads(cfg: RunConfig, over: dict, key: str) -> bool:
    """Whether the variant with overrides ``over`` reads swept ``key`` (False only for a key of another algorithm,
    dataset, attack or robust rule than the variant's, its choice not swept itself)."""
    section, _, name = key.partition(".")
    def of(dotted: str):  # the variant's own value, else the template's (read off the config, not dumped)
        table, key = dotted.split(".")
        return get_dotted(over, dotted) if has_dotted(over, dotted) else getattr(getattr(cfg, table), key)

    for rule in OWN_KEYS:
        if rule.section == section and name in rule.readers and not any(s in cfg.sweep for s in rule.selectors):
            choice = rule.choose(of)
            return rule.reads(name, choice)
    return True


def only_variants(cfg: RunConfig, names: list[str]) -> RunConfig:
    """``cfg`` with only the variants ``names`` (``fedsl run --variants``), and the template's keys that only the
    others read back at their defaults: e.g. ``serverdata-cifar10``'s ``[distill]`` table, which its FedDF variants
    read, when only FedCLG runs. The runs kept are those the whole config makes (they would not inherit such a key
    either), and the smaller config is valid by itself (``expand_runs`` refuses a template key that no run reads)."""
    kept = {v: cfg.variants[v] for v in names}
    unread = [(section, key) for section, key in _template_keys(cfg)
              if not any(_reads(cfg, over, f"{section}.{key}") for over in kept.values() if isinstance(over, dict))]
    update: dict[str, Any] = {"variants": kept}
    theirs = [lookup(over, "algorithm.name") or cfg.algorithm.name for over in kept.values() if isinstance(over, dict)]
    if theirs and cfg.algorithm.name not in theirs:  # the kept runs all set their own: the template takes one of theirs
        update["algorithm"] = cfg.algorithm.model_copy(update={"name": theirs[0]})
    for section in dict.fromkeys(s for s, _ in unread):
        table = getattr(cfg, section)
        update[section] = table.model_copy(update={k: type(table).model_fields[k].default for s, k in unread
                                                   if s == section})
    return cfg.model_copy(update=update)


def variant_points(cfg: RunConfig, vname: str, over: dict) -> dict[str, list]:
    """The swept keys variant ``vname`` (overrides ``over``) runs over, each with its values, in the sweep's order:
    - a key the variant does not set: all the sweep's values;
    - a key it sets to one value: none (pinned there: not swept);
    - a key it sets to a list: the sweep's values that are in the list. Label flipping at f = 0 is the same run
      as sign flipping at f = 0 (nobody attacks), so a preset runs it once: ``attack.fraction = [0.1, 0.4]`` in
      a sweep over [0, 0.1, 0.4]. A quick form's shorter sweep keeps what it shares with the list.
    A sweep over a key whose values are lists themselves has no such selection (the list is one value).
    A key only other algorithms, datasets, attacks or robust rules read than the variant's is not swept for it
    (μ for a FedAvg variant in a sweep over μ): its runs would be one run repeated."""
    points: dict[str, list] = {}
    for key, values in cfg.sweep.items():
        if not has_dotted(over, key):
            if not _reads(cfg, over, key):
                continue
            points[key] = list(values)
            continue
        own = get_dotted(over, key)
        if not isinstance(own, list) or any(isinstance(v, list) for v in values):
            continue  # pinned
        chosen = [v for v in values if v in own]
        if not chosen:
            raise ConfigError(f"variants.{vname}: {key} = {own!r} selects none of the sweep's values {values!r}: "
                              "expected a list of some of them (or one value, to pin the variant there)")
        points[key] = chosen
    return points


def _template_keys(cfg: RunConfig) -> dict[tuple[str, str], tuple[OwnKeys, Any]]:
    """(section, key) -> (its rule, value) of the keys of a template (a config with variants or a sweep) that only
    some algorithms, datasets, attacks or robust rules read, set away from their defaults: the only such keys a run
    can inherit at another value than the default."""
    return {(rule.section, key): (rule, getattr(getattr(cfg, rule.section), key)) for rule in OWN_KEYS
            for key in rule.readers if rule.set_away(getattr(cfg, rule.section), key)}


def _not_inherited(merged: dict, template: dict[tuple[str, str], tuple[OwnKeys, Any]], own: set[str],
                   read: set[tuple[str, str]]) -> dict:
    """``merged`` (a run's config dict) without the template's keys its own algorithm, dataset, attack or robust
    rule does not read (a FedAvg variant of a FedProx template runs without μ); the template keys it reads are
    added to ``read``. A key the variant or the sweep sets itself (``own``) stays, and is refused if the run's
    choice does not read it."""
    for (section, key), (rule, _) in template.items():
        if f"{section}.{key}" in own or not isinstance(merged.get(section), dict):
            continue  # the variant's own (a section that is not a table: validation says so)
        if rule.reads(key, rule.choice_in(merged)):
            read.add((section, key))
        else:
            merged[section] = {k: v for k, v in merged[section].items() if k != key}  # the run takes the default
    return merged


def count_runs(cfg: RunConfig) -> int:
    """How many runs ``expand_runs`` gives (variants × their sweep points × seeds), without making them."""
    total = 0
    for vname, over in (cfg.variants or {cfg.name: {}}).items():
        points = variant_points(cfg, vname, over if isinstance(over, dict) else {})
        total += math.prod(len(v) for v in points.values()) * max(1, len(cfg.seeds))
    return total


def expand_runs(cfg: RunConfig, *, picked: bool = False) -> dict[str, tuple[str, RunConfig]]:
    """``expand_variants`` with each run's variant name: run name -> (variant, RunConfig)."""
    total = count_runs(cfg)
    if total > RUNS_MAX:
        raise ConfigError(f"sweep: {total} runs (variants × sweep points × seeds): expected at most {RUNS_MAX}; "
                          "split it into several configs")
    base = cfg.model_dump(exclude={"variants", "seeds", "sweep", "paper", "paper_claims", "claims", "paper_rounds",
                                   "plot", "quick"})
    variants = cfg.variants or {cfg.name: {}}
    template, read = _template_keys(cfg), set()  # the template's own keys, and those some run reads
    out: dict[str, tuple[str, RunConfig]] = {}
    origin: dict[str, str] = {}  # run name -> where it came from (to report two runs of one name)
    for vname, over in variants.items():
        if not isinstance(over, dict):
            raise ConfigError(f"variants.{vname}: expected a table of overrides")
        points = variant_points(cfg, vname, over)  # the variant's own keys are pinned, or a list of points
        keys = list(points)
        own = {f"{section}.{key}" for section, key in template  # the template keys the variant sets itself
               if has_dotted(over, f"{section}.{key}") or f"{section}.{key}" in keys}
        merged_variant = deep_merge(base, over)
        for point in itertools.product(*points.values()):
            # the run's folder name: the variant's (validated) name, then key=value with unsafe characters as '_'
            label = vname + "".join(f"-{slug(k.split('.')[-1])}={_label(v)}" for k, v in zip(keys, point))
            where = f"variants.{vname}" if cfg.variants else ""
            if keys:
                where = f"{where} sweep point {label}".strip()
            if len(label.encode("utf-8")) > NAME_MAX:
                raise ConfigError(f"{where + ': ' if where else ''}run name {label!r} is {len(label.encode('utf-8'))} "
                                  f"bytes long: expected at most {NAME_MAX} (it names the run's folder): shorten the "
                                  "variant name or sweep fewer keys")
            for seed in cfg.seeds or [None]:
                # copies of only the tables on the swept keys' paths (validation reads and never
                # changes its input): a 40,000-run sweep expands in seconds
                merged = dict(merged_variant)
                for k, v in zip(keys, point):
                    node = merged
                    for part in k.split(".")[:-1]:
                        child = node.get(part, {})
                        if isinstance(child, dict):
                            node[part] = child = dict(child)
                        node = child if isinstance(child, dict) else {}
                    node[k.split(".")[-1]] = copy.deepcopy(v)
                merged["name"] = label
                if seed is not None:
                    merged["seed"] = seed
                merged = _not_inherited(merged, template, own, read)
                try:
                    run_cfg = validate(merged)
                except ConfigError as e:
                    raise ConfigError(f"{where}: {e}" if where else str(e)) from None
                run = label if seed is None else f"{label}-seed{seed}"
                here = f"{where or 'the config'}" + ("" if seed is None else f" seed {seed}")
                if run in out:  # two runs, one folder: one would overwrite the other
                    raise ConfigError(f"run name {run!r} is given twice ({origin[run]}; {here}): expected distinct "
                                      "run names: rename a variant or make the swept values differ in their "
                                      "letters and digits")
                out[run], origin[run] = (vname, run_cfg), here
    for key in cfg.sweep:
        if not any(_reads(cfg, over, key) for over in variants.values() if isinstance(over, dict)):
            raise ConfigError(f"sweep over {key}: read by no variant of the config (a key of other algorithms, "
                              "datasets, attacks or robust rules than theirs, or of server learning): expected a "
                              "variant that reads it")
    for (section, key), (rule, value) in template.items():
        if (section, key) not in read:  # set for all runs, read by none: it would change nothing
            theirs = sorted({rule.choice(c) for _, c in out.values()})
            raise ConfigError(f"{section}.{key} = {value!r}: read only with {rule.only_with(key)}, and no run of "
                              f"the config has one (theirs: {', '.join(rule.named(t) for t in theirs)}): "
                              "expected it unset, or set in the variants that read it")
    if not picked:
        _check_top_level_runs(cfg, {c.algorithm.name for _, c in out.values()})
    return out


def _check_top_level_runs(cfg: RunConfig, theirs: set[str]) -> None:
    """One config, one experiment: with variants, the top level is their template, and its ``algorithm.name`` must be
    one a run has (``theirs``). Otherwise `fedsl run` would compare the variants without it while the top level reads
    as a run of its own (as ``runner.run``, given the config, ran it before it refused groups): refused in one line.
    (``only_variants`` keeps a subset of variants that does not run it valid.)"""
    top = cfg.algorithm.name
    if cfg.variants and top not in theirs:
        raise ConfigError(
            f"algorithm.name = {top!r} at the top level is run by no variant: "
            f"{'the variant ' if len(cfg.variants) == 1 else 'each of the variants '}{', '.join(cfg.variants)} "
            f"sets its own algorithm.name (the top level is the variants' template, not a run): expected a variant "
            f"that runs it, e.g. an empty [variants.{top}] table (the top level as it is), or the top level's "
            f"algorithm.name set to one of theirs ({', '.join(repr(t) for t in sorted(theirs))})")
