"""Merge collected run groups of one config into one folder: the variants (or seeds) that ran as separate calls.

    python reproduction/merge.py reproduction/NAME GROUP [GROUP ...]

A preset run one variant at a time (``fedsl run --preset P --variants V``, then
``reproduction/collect.py``) gives one folder per variant; the claims compare variants, so they need
them in one group. The groups must agree on everything but the runs, the config's variants and its
seeds (the same preset, settings and claims), and their runs must be distinct. The result is what one
``fedsl run`` of all of them would have kept: group.json with every run (in the order of GROUP ...),
the config's variants and seeds joined, each run's metrics.csv and summary.json, and index.csv
written from them. NAME may be one of the GROUPs (to add seeds to a folder).

A preset that gained variants since its first groups ran (serverdata-cifar10's FedCLG and FedDUM) is merged too:
- its description and claims are the last group's (the preset's as it is now);
- settings that change no number of a run may differ (``checkpoint_every``: resume is bit-exact; ``data.data_dir``:
  where the data lay); the first group's are kept;
- a key one group's config lacks (added to fedsl since) takes the other's value;
- a key that only some algorithms read (``fedsl.config.own_keys``: FedDF's ``[distill]``, FedDUM's
  ``feddum_beta``) may differ where no run of one of the two groups reads it (``fedsl run --variants`` sets such a
  key back to its default when the variants it runs do not read it): the merged config takes the value of the
  group whose runs read it. Any other difference stops the merge.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from fedsl.report.tables import write_index

MAY_DIFFER = ("variants", "seeds")  # config keys that differ between calls of one preset
NEWER = ("description", "claims")  # what a preset gains with its variants: the last group's
NO_NUMBER = ("checkpoint_every", "data.data_dir")  # settings no number of a run depends on: the first group's
MISSING = object()


def _algorithms(source: Path, spec: dict) -> set[str]:
    """The algorithms the group's runs ran (each run's summary.json)."""
    return {json.loads((source / r["dir"] / "summary.json").read_text()).get("algorithm")
            for r in spec["runs"].values() if (source / r["dir"] / "summary.json").is_file()}


def _reads(section: str, key: str, algorithms: set[str]) -> bool:
    """Whether a run of one of ``algorithms`` reads ``section.key`` (True for a key every run reads)."""
    from fedsl.config.own_keys import OWN_KEYS
    for rule in OWN_KEYS:
        if rule.section == section and key in rule.readers and rule.selector == "algorithm.name":
            return bool(algorithms & set(rule.readers[key]))
    return True


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def merge_configs(first: dict, later: dict, first_algs: set[str], later_algs: set[str]) -> dict:
    """The config of two groups of one preset (module docstring): the first's, with what the later adds, or a
    SystemExit naming the first key they disagree on."""
    out = json.loads(json.dumps(first))
    for section in sorted(set(first) | set(later)):
        a, b = first.get(section, MISSING), later.get(section, MISSING)
        if section in (*MAY_DIFFER, *NEWER, *NO_NUMBER) or a == b or b is MISSING:
            continue
        if a is MISSING:
            out[section] = b
            continue
        if not (isinstance(a, dict) and isinstance(b, dict)):
            sys.exit(f"config {section} = {_short(a)} in the first group, {_short(b)} in a later one: "
                     "expected the same")
        for key in sorted(set(a) | set(b)):
            va, vb = a.get(key, MISSING), b.get(key, MISSING)
            if va == vb or vb is MISSING or f"{section}.{key}" in NO_NUMBER:
                continue
            if va is MISSING or not _reads(section, key, first_algs):
                out[section][key] = vb
            elif _reads(section, key, later_algs):
                sys.exit(f"config {section}.{key} = {_short(va)} in the first group, {_short(vb)} in a later one, "
                         "and runs of both read it: expected the same")
    return out


def merge(dest: Path, sources: list[Path]) -> list[str]:
    """Write the group of every run of ``sources`` into ``dest``; returns the run names."""
    specs = [json.loads((s / "group.json").read_text()) for s in sources]
    merged = json.loads(json.dumps(specs[0]))
    algs = _algorithms(sources[0], specs[0])
    for s, spec in zip(sources[1:], specs[1:]):
        rest = [k for k in set(spec) | set(merged)
                if k not in ("runs", "config", *NEWER) and spec.get(k) != merged.get(k)]
        if rest:
            sys.exit(f"{s}: not the same group as {sources[0]}: {sorted(rest)[0]} differs")
        later = _algorithms(s, spec)
        merged["config"] = merge_configs(merged.get("config", {}), spec.get("config", {}), algs, later)
        algs |= later
        for k in NEWER:
            if k in spec:
                merged[k] = spec[k]
                if k in merged.get("config", {}) and k in spec.get("config", {}):
                    merged["config"][k] = spec["config"][k]
    merged["runs"], variants, seeds = {}, {}, []
    for s, spec in zip(sources, specs):
        for name, run in spec["runs"].items():
            if name in merged["runs"]:
                sys.exit(f"{s}: run {name!r} is in two of the groups")
            merged["runs"][name] = run
        variants.update(spec.get("config", {}).get("variants", {}))
        seeds += [x for x in spec.get("config", {}).get("seeds", []) if x not in seeds]
    if "config" in merged:
        merged["config"]["variants"], merged["config"]["seeds"] = variants, sorted(seeds)
    dest.mkdir(parents=True, exist_ok=True)
    for s, spec in zip(sources, specs):
        for run in spec["runs"].values():
            if s.resolve() == dest.resolve() or not (s / run["dir"]).is_dir():  # already here / never finished
                continue
            (dest / run["dir"]).mkdir(exist_ok=True)
            for f in ("metrics.csv", "summary.json"):
                shutil.copy2(s / run["dir"] / f, dest / run["dir"] / f)
    (dest / "group.json").write_text(json.dumps(merged, indent=2, ensure_ascii=False))  # as run_group writes it
    write_index(dest)
    return list(merged["runs"])


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    names = merge(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
    print(f"{len(names)} runs in {sys.argv[1]}")
