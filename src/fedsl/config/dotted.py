"""Dotted keys over nested dicts (``"server.gamma"`` is ``data["server"]["gamma"]``): the few operations that reading
a config (``loading``), expanding it into runs (``fedsl.sweeps.sweep``) and a study's trials (``fedsl.tune``) share."""

from __future__ import annotations

import copy
from typing import Any

from fedsl.config.base import ConfigError


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
