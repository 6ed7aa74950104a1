"""Merge collected run groups of one config into one folder: the variants (or seeds) that ran as separate calls.

    python reproduction/merge.py reproduction/NAME GROUP [GROUP ...]

A preset run one variant at a time (``fedsl run --preset P --variants V``, then
``reproduction/collect.py``) gives one folder per variant; the claims compare variants, so they need
them in one group. The groups must agree on everything but the runs, the config's variants and its
seeds (the same preset, settings and claims), and their runs must be distinct. The result is what one
``fedsl run`` of all of them would have kept: group.json with every run (in the order of GROUP ...),
the config's variants and seeds joined, each run's metrics.csv and summary.json, and index.csv
written from them. NAME may be one of the GROUPs (to add seeds to a folder).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from fedsl.report.tables import write_index

MAY_DIFFER = ("variants", "seeds")  # config keys that differ between calls of one preset


def _without(spec: dict) -> dict:
    """What must be equal across the groups: the spec less its runs, the config less MAY_DIFFER."""
    out = {k: v for k, v in spec.items() if k != "runs"}
    out["config"] = {k: v for k, v in spec.get("config", {}).items() if k not in MAY_DIFFER}
    return out


def merge(dest: Path, sources: list[Path]) -> list[str]:
    """Write the group of every run of ``sources`` into ``dest``; returns the run names."""
    specs = [json.loads((s / "group.json").read_text()) for s in sources]
    for s, spec in zip(sources[1:], specs[1:]):
        if _without(spec) != _without(specs[0]):
            sys.exit(f"{s}: not the same config as {sources[0]} (only the runs, variants and seeds may differ)")
    merged = json.loads(json.dumps(specs[0]))
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
