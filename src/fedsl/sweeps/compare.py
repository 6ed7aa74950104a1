"""Several runs side by side: a config's variants (× sweep points × seeds), run as a group.

A group folder holds ``group.json`` (run -> folder, variant, seed, swept parameters, and the
group's config) and one run folder per run. Its tables, ``comparison.md`` / ``.png`` and
``index.csv`` are written by ``fedsl.report.tables`` (the CLI does so once the group is done).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedsl.config.expand import expand_runs, get_dotted
from fedsl.config.schema import RunConfig
from fedsl.runs import runner
from fedsl.runs.build import Built
from fedsl.runs.memory import stack_limit
from fedsl.runs.results import CorruptCheckpoint, RunDir, atomic_write, is_group

FINISHED = ("completed", "diverged")  # statuses a re-run or resume skips


def run_group(cfg: RunConfig, out: str | Path, *, resume: bool = False, log=print, progress=None,
              built: dict[str, Built] | None = None, backend=None) -> list[dict]:
    """Run every (variant, seed) of ``cfg``; a config without variants is a group of one.

    ``built``: run name -> what ``build.check_all`` built of it (taken over, not built again).
    ``backend``: None runs the pending runs here, one after another (or stacked); otherwise an
    object whose ``run_units(out, units, resume=, log=)`` runs the units (lists of run names
    that advance together, with their configs) side by side and returns run -> summary
    (``fedsl.sweeps.parallel.LocalPool``, ``fedsl.sweeps.ray_backend.RayBackend``).
    Either way every run writes the same files into ``out/RUN/``.
    """
    out = Path(out)
    built = dict(built or {})
    named = expand_runs(cfg)
    runs = {r: c for r, (_, c) in named.items()}
    for rname in runs:  # names are checked in config; still, no run folder outside `out`
        _inside(out, rname, f"run {rname!r}")
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        spec = {r: {"dir": r, "variant": c.name, "base": v, "seed": c.seed,
                    "params": {k: get_dotted(c.model_dump(), k) for k in cfg.sweep}} for r, (v, c) in named.items()}
        # "config": the group's validated config, so `fedsl resume` can start runs that never began
        atomic_write(out / "group.json", lambda p: p.write_text(json.dumps(
            {"name": cfg.name, "description": cfg.description, "window": cfg.rolling_window, "runs": spec,
             "sweep": list(cfg.sweep), "plot": cfg.plot, "paper": cfg.paper, "paper_claims": cfg.paper_claims,
             "claims": [c.model_dump() for c in cfg.claims],
             "config": cfg.model_dump()}, indent=2, ensure_ascii=False)))
    summaries: dict[str, dict] = {}
    pending = {}
    for rname, rcfg in runs.items():
        rd = RunDir(out / rname)
        if resume and rd.read_summary().get("status") in FINISHED:
            summaries[rname] = rd.read_summary()
        else:
            pending[rname] = rcfg
    units = [(names, [pending[n] for n in names]) for names in stack_groups(pending, out, resume)]
    if backend is None:
        for names, cfgs in units:
            summaries.update(run_unit(out, names, cfgs, resume=resume, log=log, progress=progress,
                                      built=[built.pop(n, None) for n in names]))
    else:  # side by side (fedsl.sweeps.parallel), into the same run folders
        summaries.update(backend.run_units(out, units, resume=resume, log=log))
    return [summaries[r] for r in runs]


def run_unit(out: Path, names: list[str], cfgs: list[RunConfig], *, resume: bool, log=print, progress=None,
             built: list | None = None) -> dict[str, dict]:
    """Run one unit of a group (one run, or runs advanced together as a stack) into ``out/NAME``;
    returns run -> summary. A failed stack falls back to one run at a time; a failed run is
    recorded in its summary and does not raise. Runs already finished (a unit retried after its
    worker was lost) are skipped; interrupted ones continue from their checkpoints."""
    summaries: dict[str, dict] = {}
    built = built or [None] * len(names)
    pending = [i for i, n in enumerate(names) if RunDir(out / n).read_summary().get("status") not in FINISHED]
    for i, n in enumerate(names):
        if i not in pending:
            summaries[n] = RunDir(out / n).read_summary()
    if len(pending) > 1:
        try:
            outs = [out / names[i] for i in pending]
            for i, s in zip(pending, runner.run_stacked([cfgs[i] for i in pending], outs, resume=resume,
                                                         log=log, progress=progress,
                                                         built=[built[i] for i in pending])):
                summaries[names[i]] = s
            return summaries
        except Exception as e:  # noqa: BLE001 — recorded per run below; the sweep goes on
            log(f"stacked runs {', '.join(names[i] for i in pending)}: failed ({type(e).__name__}: {e}); "
                "running them one by one")
    for i in pending:
        rname, rd = names[i], RunDir(out / names[i])
        if rd.read_summary().get("status") in FINISHED:  # finished inside a stack before it failed
            summaries[rname] = rd.read_summary()
            continue
        try:
            summaries[rname] = runner.run(cfgs[i], rd.path, resume=resume and rd.is_run(), log=log,
                                          progress=progress, built=built[i])
        except Exception as e:  # noqa: BLE001 — one failed run must not stop a sweep; it is recorded
            log(f"{rname}: failed ({type(e).__name__}: {e}); the group goes on")
            summaries[rname] = rd.read_summary()
    return summaries


def stack_key(cfg: RunConfig) -> tuple:
    """Runs with equal keys may share a stack (the StackedSimulator checks the rest): among them what enters the
    clients' local step, which one vmapped step takes once (the rule's ``local_keys``, the clients' momentum and
    weight decay)."""
    from fedsl.algorithms import spec
    a = cfg.algorithm
    return (cfg.model.name, a.name, cfg.data.dataset, cfg.device, cfg.dtype, cfg.executor, cfg.compile,
            cfg.client_tables, cfg.eval_precision, cfg.rounds,
            *(getattr(a, k) for k in spec(a.name).local_keys), a.client_momentum, a.weight_decay, cfg.server.learning)


def stack_groups(pending: dict[str, RunConfig], out: Path, resume: bool, limit: int | None = None
                 ) -> list[list[str]]:
    """Pending runs in groups advanced together (at most ``limit``, else ``memory.stack_limit``); order is kept
    within a key.

    On resume, only runs whose checkpoints are at the same round share a group.
    """
    groups: dict[tuple, list[str]] = {}
    for name, cfg in pending.items():
        try:
            start = RunDir(out / name).checkpoint_round() if resume else None
        except CorruptCheckpoint:  # a unit of its own: it fails there with one line, the others go on
            start = f"unreadable {name}"
        groups.setdefault((stack_key(cfg), start or 0), []).append(name)
    result = []
    for names in groups.values():
        size = limit or stack_limit(pending[names[0]])
        result.extend(names[i:i + size] for i in range(0, len(names), size))
    return result


def group_spec(path: str | Path) -> dict:
    """The group's ``group.json`` ({} for a single run folder)."""
    return json.loads((path / "group.json").read_text()) if is_group(path) else {}


def group_config(path: str | Path) -> RunConfig | None:
    """The config a group was started with (group.json's "config"); None for a single run folder
    or a group written before fedsl kept it."""
    from fedsl.config.schema import validate
    data = group_spec(Path(path)).get("config")
    return validate(data) if data is not None else None


def _inside(root: Path, rel, what: str) -> Path:
    """``root / rel``; a ConfigError unless that is a folder inside ``root`` (after resolving '..' and links)."""
    from fedsl.config.schema import ConfigError
    if not isinstance(rel, str) or not rel:
        raise ConfigError(f"{what}: folder {rel!r}: expected a folder name inside {str(root)!r}")
    p = root / rel
    r, q = root.resolve(), p.resolve()
    if q == r or not q.is_relative_to(r):
        raise ConfigError(f"{what}: folder {rel!r} is outside {str(root)!r}: expected a folder name inside it")
    return p


def group_runs(path: str | Path) -> dict[str, RunDir]:
    """Run name -> its folder (a single run folder is a group of one)."""
    path = Path(path)
    spec = group_spec(path)
    if spec:  # a tampered group.json must not send a resume outside the group folder
        return {r: RunDir(_inside(path, s.get("dir") if isinstance(s, dict) else None,
                                  f"{str(path / 'group.json')!r} run {r!r}"))
                for r, s in spec["runs"].items()}
    return {path.name: RunDir(path)}
