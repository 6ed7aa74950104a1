"""Several runs side by side: run a config's variants, then a table and a plot.

A group folder holds ``group.json`` (variant -> sub-folder) and one run folder per
variant, plus ``comparison.md`` and ``comparison.png`` once all are done.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedsl.experiments import runner
from fedsl.experiments.config import RunConfig, expand_variants
from fedsl.experiments.results import RunDir
from fedsl.report.plots import accuracy_curves

COLUMNS = ("run", "status", "final_accuracy", "rise_time", "T_0.5", "rounds_done", "wall_time")


def is_group(path: str | Path) -> bool:
    return (Path(path) / "group.json").is_file()


def run_group(cfg: RunConfig, out: str | Path, *, resume: bool = False, log=print, progress=None) -> list[dict]:
    """Run every variant of ``cfg`` (a config without variants is a group of one)."""
    out = Path(out)
    variants = expand_variants(cfg)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        (out / "group.json").write_text(json.dumps(
            {"name": cfg.name, "description": cfg.description, "runs": {v: v for v in variants}}, indent=2))
    summaries = []
    for vname, vcfg in variants.items():
        rd = RunDir(out / vname)
        if resume and rd.read_summary().get("status") in ("completed", "diverged"):
            summaries.append(rd.read_summary())
            continue
        summaries.append(runner.run(vcfg, rd.path, resume=resume and rd.is_run(), log=log, progress=progress))
    write_comparison(out, cfg.name, cfg.rolling_window)
    return summaries


def group_runs(path: str | Path) -> dict[str, RunDir]:
    path = Path(path)
    if is_group(path):
        spec = json.loads((path / "group.json").read_text())
        return {v: RunDir(path / sub) for v, sub in spec["runs"].items()}
    return {path.name: RunDir(path)}


def table_rows(path: str | Path) -> list[dict]:
    rows = []
    for vname, rd in group_runs(path).items():
        s = rd.read_summary()
        rows.append({"run": vname, **{c: s.get(c) for c in COLUMNS[1:]}})
    return rows


def fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4f}" if v < 10 else f"{v:.1f}"
    return str(v)


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |\n" for r in rows)


def write_comparison(path: str | Path, title: str, window: int = 20) -> tuple[Path, Path]:
    """comparison.md (table) and comparison.png (accuracy curves) in ``path``."""
    path = Path(path)
    rows = table_rows(path)
    curves = {}
    for vname, rd in group_runs(path).items():
        m = rd.read_metrics()
        curves[vname] = ([r["round"] for r in m], [r["accuracy"] for r in m], [r["rolling_accuracy"] for r in m])
    png = accuracy_curves(curves, path / "comparison.png", title, window)
    md = path / "comparison.md"
    md.write_text(f"# {title}\n\nFinal accuracy = rolling mean over {window} rounds at the last round; rise time = "
                  f"first round reaching 90% of it; T_0.5 = first round whose rolling accuracy reaches 0.5.\n\n"
                  + markdown_table(rows) + "\n![accuracy curves](comparison.png)\n")
    return md, png
