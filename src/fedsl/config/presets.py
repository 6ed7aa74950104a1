"""Presets: TOML configs shipped with the package (``fedsl run --preset NAME``)."""

from __future__ import annotations

import tomllib
from importlib import resources

from fedsl.config.schema import ConfigError


def _files() -> dict[str, object]:
    root = resources.files("fedsl.config") / "presets"
    return {p.name[:-5]: p for p in root.iterdir() if p.name.endswith(".toml")}


def names() -> list[str]:
    return sorted(_files())


def load(name: str) -> dict:
    """The preset's config as a dict (validate with ``fedsl.config.schema``)."""
    files = _files()
    if name not in files:
        raise ConfigError(f"preset {name!r} does not exist: expected one of {', '.join(sorted(files))}")
    return tomllib.loads(files[name].read_text(encoding="utf-8"))


def describe() -> list[tuple[str, str]]:
    return [(n, load(n).get("description", "")) for n in names()]
