"""Reading a config: a TOML (or JSON) file or a preset's dict, the ``quick`` table and ``--set key=value``
overrides applied (dotted keys), then validated into a ``RunConfig`` (``fedsl.config.schema``).
Errors are ``ConfigError``: one line naming the key, the value and what is expected.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

from fedsl.config.expand import deep_merge, get_dotted, has_dotted, set_dotted  # noqa: F401 (deep_merge: its old home)
from fedsl.config.own_keys import lookup
from fedsl.config.schema import ROUNDS_MAX, ConfigError, RunConfig, switched, validate, without_unread


def read_file(path: str | Path) -> dict:
    """Read a TOML (or JSON) config file into a dict."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist: expected a path to a .toml file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e}") from None
    try:
        return json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"config file {str(p)!r} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: "
                          f"{e}") from None
    except RecursionError:
        raise ConfigError(f"config file {str(p)!r} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: "
                          "values nested too deeply") from None


def _parse_value(text: str) -> Any:
    """A --set value: a TOML value (number, bool, string, array) or else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text


def apply_overrides(data: dict, overrides: list[str], variants: list[str] | None = None) -> dict:
    """Apply ``key=value`` overrides (dotted keys, e.g. ``algorithm.gamma=0.5``). One that switches
    ``algorithm.name``, ``data.dataset``, ``attack.kind`` or ``robust.aggregator`` drops the keys only the choice
    before reads (``config.without_unread``), save those the overrides set too. One that a variant (of
    ``variants``, default all) or the sweep sets to another value is refused (``shadowed``): it would be ignored
    there without a word."""
    out = copy.deepcopy(data)
    keys = set()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set algorithm.local_lr=0.05")
        key, _, raw = item.partition("=")
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected a dotted key such as server.gamma")
        set_dotted(out, key, _parse_value(raw.strip()))
        keys.add(key)
        if problem := shadowed(out, key, raw.strip(), variants):
            raise ConfigError(f"--set {item!r}: {problem}")
    for rule, choice in switched(out, data):
        if any(s in keys for s in rule.selectors) and isinstance(out.get(rule.section), dict):
            out[rule.section] = without_unread(rule, out[rule.section], choice,
                                               lambda k, s=rule.section: f"{s}.{k}" in keys)
    return out


def shadowed(data: dict, key: str, raw: str, variants: list[str] | None = None) -> str | None:
    """Why an override ``key=raw`` would not reach every run of ``data`` (None: it would): a variant (of
    ``variants``, default all) that sets ``key`` to another value (variants apply after ``--set``), or the sweep,
    whose values replace it."""
    if key.split(".")[0] in ("variants", "sweep", "quick"):
        return None
    sweep = data.get("sweep")
    if isinstance(sweep, dict) and key in sweep:
        return (f"the sweep sets {key} to each of {sweep[key]!r} in turn, which replace this value: expected the "
                f"swept values instead (--set 'sweep={{\"{key}\" = [{raw}]}}' sweeps over this value alone, in "
                "place of the whole [sweep] table)")
    table = data.get("variants")
    if not isinstance(table, dict):
        return None
    value = get_dotted(data, key)
    names = [v for v in (variants or table) if v in table]
    own = [v for v in names if isinstance(table[v], dict) and has_dotted(table[v], key)
           and get_dotted(table[v], key) != value]
    if not own:
        return None
    who = (f"every variant ({', '.join(own)}) sets" if len(own) == len(names) else
           f"variant{'s' if len(own) > 1 else ''} {', '.join(own)} set{'' if len(own) > 1 else 's'}")
    return (f"{who} {key} itself, which replaces this value: expected --set variants.NAME.{key}={raw} for each "
            f"variant it should change (e.g. --set variants.{own[0]}.{key}={raw})")


def apply_quick(data: dict) -> dict:
    """The config's ``quick`` overrides applied (few rounds, one seed, small subsets)."""
    out = copy.deepcopy(data)
    quick = out.get("quick", {})
    if not isinstance(quick, dict):
        raise ConfigError("quick: expected a table of dotted overrides")
    for key, value in quick.items():
        set_dotted(out, key, copy.deepcopy(value))
    if isinstance(out.get("seeds"), list) and len(out["seeds"]) > 1:
        out["seeds"] = out["seeds"][:1]
    return out


def load(path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None,
         quick: bool = False, variants: list[str] | None = None) -> RunConfig:
    """Read, override and validate a config (``base`` is a preset's dict when no file is given).

    ``quick`` applies the config's ``quick`` table first; ``overrides`` come last, refused where one of
    ``variants`` (the variants that will run; default all) or the sweep would replace them.
    """
    data = read_file(path) if path is not None else copy.deepcopy(base or {})
    if path is not None:
        _import_dir_from_file(data, Path(path).expanduser().resolve().parent)
    rounds = data.get("rounds")
    if (data.get("paper") or data.get("paper_claims")) and "paper_rounds" not in data and \
            type(rounds) is int and 1 <= rounds <= ROUNDS_MAX:  # a bad `rounds` is reported as itself
        # the paper's numbers are for the run as written: remember its length before --quick/--set shorten it
        data["paper_rounds"] = rounds
    if quick:
        data = apply_quick(data)
    data = apply_overrides(data, overrides or [], variants)
    if path is not None and _imports_a_model(data) and isinstance(data.setdefault("model", {}), dict):
        # the config's own folder, looked in first for its model's module (fedsl run from anywhere finds it)
        data["model"].setdefault("import_dir", str(Path(path).expanduser().resolve().parent))
    return validate(data)


def _import_dir_from_file(data: dict, folder: Path) -> None:
    """A relative ``model.import_dir`` of a config file (top level or a variant's), taken from the file's folder
    ``folder``: the config means the folder beside it, wherever it is run from."""
    if not isinstance(data, dict):  # validation says what a config is
        return
    variants = data.get("variants")
    for table in [data, *(v for v in variants.values() if isinstance(v, dict))] if isinstance(variants, dict) \
            else [data]:
        model = table.get("model")
        if isinstance(model, dict) and isinstance(model.get("import_dir"), str) and model["import_dir"]:
            model["import_dir"] = str((folder / Path(model["import_dir"]).expanduser()).resolve())


def _imports_a_model(data: dict) -> bool:
    """Whether a run of config dict ``data`` imports its model (``model.name`` an import path 'module:factory':
    at the top level, in a variant, or among the swept values), so its file's folder is where that module is
    looked for first (``model.import_dir``)."""
    if not isinstance(data, dict):
        return False
    names = [lookup(data, "model.name")]
    variants = data.get("variants")
    for over in variants.values() if isinstance(variants, dict) else ():
        if isinstance(over, dict):
            names += [lookup(over, "model.name"), over.get("model.name")]
    sweep = data.get("sweep")
    if isinstance(sweep, dict) and isinstance(sweep.get("model.name"), list):
        names += sweep["model.name"]
    return any(isinstance(n, str) and ":" in n for n in names)
