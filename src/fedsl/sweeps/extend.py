"""`fedsl resume DIR --rounds T`: a run, or every run of a group, taken on to T rounds, as if it had been asked
for T rounds from the start (`fedsl run ... --set rounds=T`): the same model, checkpoint, metrics.csv rows and
summary.json, bit for bit, wall times aside.

The rounds are functions of (seed, round, client) and of the run's state, which its checkpoint keeps (a completed
run keeps the one of its last round, ``run_files.Checkpoints``), so the rounds after T0 continue from there. What
the run of T0 rounds did that a run of T rounds does not is undone in its folder first (``prepare``):

- config.json's ``rounds`` (and group.json's config's) becomes T;
- metrics.csv keeps the rows a run of T rounds writes: evaluations that only the end of T0 asked for (round T0, and
  with ``eval_final_window`` each of the last ``rolling_window`` rounds before it) are dropped, and the rolling
  accuracies of the rows kept are computed again over the rows kept, as the run computes them;
- summary.json becomes that of a run stopped at T0 (status 'interrupted'; the fine-tuning control of x_T0 goes).

What makes a run of T rounds differ from its first round on cannot be undone, and is refused in one line naming
its key (``_refusal``): a γ schedule over the T rounds (``server.gamma_schedule`` linear or cosine), a noise
multiplier calibrated over them (``privacy.target_epsilon``), and the clients' states (SCAFFOLD's c_i) that a
completed run's checkpoint no longer holds. A diverged run is relabelled when a run of T rounds diverges at the
same round with the same rows, else refused. A run not finished (interrupted, failed, killed) takes T as its new
target, T at least its config's rounds.

``prepare`` writes config.json first and summary.json last: killed half-way, the same command does it again.
"""

from __future__ import annotations

import csv
import json
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedsl.config.base import ROUNDS_MAX
from fedsl.config.schema import ConfigError, RunConfig, validate, validate_saved
from fedsl.engine import metrics
from fedsl.runs import checkpoint
from fedsl.runs.results import RunDir, atomic_write

FINISHED = ("completed", "diverged")
# summary.json's fields of the fine-tuning control after the last round (``build.finetune``): a run extended from a
# completed one must not keep those of x_T0
FINETUNED = ("final_accuracy_finetuned", "final_loss_finetuned", "finetune")

Action = Literal["continue", "relabel", "done"]


@dataclass(frozen=True)
class Extension:
    """One run's part in an extension to T rounds.

    Attributes:
        name: the run's name (its folder's).
        rd: its folder.
        cfg: its config at T rounds (what config.json becomes).
        done: the rounds it has done (a finished run's ``rounds_done``; else its checkpoint's round, 0 without one).
        action: "continue" (its rounds go on to T), "relabel" (a diverged run: a run of T rounds diverges at the same
            round with the same rows, only ``rounds`` changes), "done" (it already ran T rounds: nothing to do).
    """

    name: str
    rd: RunDir
    cfg: RunConfig
    done: int
    action: Action


def with_rounds(cfg: RunConfig, rounds: int) -> RunConfig:
    """``cfg`` at T = ``rounds`` (validated as `--set rounds=T` is)."""
    if not 1 <= rounds <= ROUNDS_MAX:
        raise ConfigError(f"--rounds {rounds}: expected a number of rounds from 1 to {ROUNDS_MAX:,}")
    return validate({**cfg.model_dump(), "rounds": rounds})


def group_target(cfg: RunConfig, rounds: int) -> RunConfig:
    """A group's config at T = ``rounds``; refused when a variant or a sweep sets ``rounds`` itself (`--set rounds=T`
    does not reach such runs, so no single T extends them)."""
    if "rounds" in cfg.sweep:
        raise ConfigError(f"--rounds {rounds}: the group sweeps over rounds = {cfg.sweep['rounds']}: expected a group "
                          "whose runs share the top level's rounds")
    for vname, over in cfg.variants.items():
        if isinstance(over, dict) and "rounds" in over:
            raise ConfigError(f"--rounds {rounds}: variants.{vname} sets rounds = {over['rounds']!r} itself: expected "
                              "a group whose runs share the top level's rounds")
    return with_rounds(cfg, rounds)


def evaluated(cfg: RunConfig, done: int) -> bool:
    """Whether a run of ``cfg`` writes metrics.csv's row of round ``done`` (``RunSession.needs_eval``)."""
    return cfg.evaluates(done) or bool(cfg.diag_every and done % cfg.diag_every == 0)


def plan(name: str, rd: RunDir, cfg: RunConfig) -> Extension:
    """Run ``name``'s extension to ``cfg.rounds`` (its folder ``rd`` as it is), or a ConfigError of one line: T not
    above the rounds done, or something of the run that a run of T rounds does otherwise from round 1 on."""
    T, summary = cfg.rounds, rd.read_summary()
    status = summary.get("status")
    ckpt = checkpoint.load(rd.checkpoint_file, mmap=True)  # a bad file: CorruptCheckpoint, one line
    if status in FINISHED:
        done = int(summary.get("rounds_done", ckpt.round if ckpt else 0))
        if summary.get("rounds") == T:  # extended already (the same command again, after it was stopped)
            return Extension(name, rd, cfg, done, "done")
        if done >= T:
            raise ConfigError(f"--rounds {T}: run {name!r} has done {done} rounds: expected more than {done}")
    else:
        done = ckpt.round if ckpt else 0
        planned = rd.read_config().get("rounds")
        if isinstance(planned, int) and T < planned:
            # its rows were those of a run of `planned` rounds, which evaluates fewer of the rounds before T
            raise ConfigError(f"--rounds {T}: run {name!r} is not finished ({done} of its {planned} rounds): expected "
                              f"--rounds of at least {planned}, or `fedsl resume` alone to finish its {planned}")
        if done >= T:
            raise ConfigError(f"--rounds {T}: run {name!r} has done {done} rounds: expected more than {done}")
    if why := _refusal(cfg, T):
        raise ConfigError(f"--rounds {T}: run {name!r}: {why}, so its rounds cannot be extended bit for bit: run it "
                          f"anew for {T} rounds (`fedsl run ... --set rounds={T}`)")
    if status == "diverged":
        return Extension(name, rd, cfg, done, _diverged(name, rd, cfg, done))
    from fedsl.algorithms import spec
    if ckpt is not None and spec(cfg.algorithm.name).client_state and not ckpt.state.clients:
        held = ", ".join(spec(cfg.algorithm.name).client_state)
        raise ConfigError(f"--rounds {T}: run {name!r}: algorithm.name = {cfg.algorithm.name!r} keeps clients' "
                          f"states ({held}) between rounds, which a completed run's checkpoint does not hold, so its "
                          f"rounds cannot be extended bit for bit: run it anew for {T} rounds "
                          f"(`fedsl run ... --set rounds={T}`)")
    if ckpt is not None and cfg.model.batchnorm == "local" and not ckpt.state.clients:
        raise ConfigError(f"--rounds {T}: run {name!r}: model.batchnorm = 'local' keeps each client's BatchNorm γ, β "
                          "between rounds, which a completed run's checkpoint does not hold, so its rounds cannot be "
                          f"extended bit for bit: run it anew for {T} rounds (`fedsl run ... --set rounds={T}`)")
    return Extension(name, rd, cfg, done, "continue")


def _refusal(cfg: RunConfig, T: int) -> str | None:
    """What of ``cfg`` moves with T from round 1 on (None: nothing)."""
    s, p = cfg.server, cfg.privacy
    if s.gamma_schedule in ("linear", "cosine"):
        return f"server.gamma_schedule = {s.gamma_schedule!r} moves γ_t over the T rounds (t/(T−1))"
    if p.enabled and p.target_epsilon is not None and math.isfinite(p.target_epsilon):  # ε = inf: z = 0 at any T
        return (f"privacy.target_epsilon = {p.target_epsilon:g} calibrates the noise multiplier z for T rounds (more "
                "rounds, more noise in each)")
    return None


def _diverged(name: str, rd: RunDir, cfg: RunConfig, done: int) -> Action:
    """"relabel" when a run of T rounds diverges at round ``done`` too: it evaluates exactly the rounds this run
    evaluated (the divergence test counts evaluations) and round ``done``, where this one stopped; else a refusal.
    A run of T rounds evaluates a subset of those a shorter run evaluated, so it is enough that it evaluates each."""
    extra = [int(r["round"]) for r in rd.read_metrics() if r["round"] > 0 and not evaluated(cfg, int(r["round"]))]
    if not extra and evaluated(cfg, done):
        return "relabel"
    at = extra[0] if extra else done
    raise ConfigError(f"--rounds {cfg.rounds}: run {name!r} diverged at round {done}, counting an evaluation of "
                      f"round {at} that a run of {cfg.rounds} rounds does not make (eval_final_window), so that run "
                      f"may diverge elsewhere: run it anew for {cfg.rounds} rounds (`fedsl run ... --set "
                      f"rounds={cfg.rounds}`)")


def prepare(ext: Extension) -> None:
    """Make ``ext``'s folder that of a run of T rounds stopped after its rounds done (module docstring)."""
    if ext.action == "done":
        return
    rd, cfg = ext.rd, ext.cfg
    atomic_write(rd.config_file, lambda p: p.write_text(json.dumps(cfg.model_dump(), indent=2, ensure_ascii=False)))
    summary = rd.read_summary()
    if ext.action == "relabel":
        if summary:
            rd.write_summary({**summary, "rounds": cfg.rounds})
        return
    if rd.metrics_file.is_file():
        _keep_rows(rd, cfg, ext.done)
    if summary:
        summary = {k: v for k, v in summary.items() if k not in FINETUNED}
        rd.write_summary({**summary, "rounds": cfg.rounds, "status": "interrupted", "rounds_done": ext.done})


def _keep_rows(rd: RunDir, cfg: RunConfig, done: int) -> None:
    """metrics.csv with the rows up to round ``done`` that a run of ``cfg`` writes, their rolling accuracies
    computed as ``RunSession._rolled`` does over the rows kept; the other columns' text as it is."""
    with open(rd.metrics_file, newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        rows = [r for r in reader if r.get("round")
                and int(r["round"]) <= done and (int(r["round"]) == 0 or evaluated(cfg, int(r["round"])))]
    window = cfg.rolling_window
    acc: deque = deque(maxlen=window)
    val: deque = deque(maxlen=window)
    for r in rows:
        t = int(r["round"])
        if t == 0:  # x_0's rolling accuracy is its accuracy (RunSession.begin), in no window
            continue
        r["rolling_accuracy"] = _rolled(acc, t, r["accuracy"], window)
        if r.get("val_accuracy"):
            r["rolling_val_accuracy"] = _rolled(val, t, r["val_accuracy"], window)

    def write(p: Path) -> None:
        with open(p, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns)
            w.writerows([[r[c] for c in columns] for r in rows])

    atomic_write(rd.metrics_file, write)


def _rolled(window: deque, t: int, value: str, size: int) -> float:
    window.append((t, float(value)))
    return float(metrics.rolling([r for r, _ in window], [v for _, v in window], size)[-1])


def write_group_config(path: Path, cfg: RunConfig) -> None:
    """group.json with ``cfg`` (the group's config at T) as its config: `fedsl resume` then starts and continues its
    runs at T."""
    spec = json.loads((path / "group.json").read_text())
    spec["config"] = cfg.model_dump()
    atomic_write(path / "group.json", lambda p: p.write_text(json.dumps(spec, indent=2, ensure_ascii=False)))


def _check_target(plans: list[Extension], rounds: int, where: Path) -> None:
    """A ConfigError when no run of ``plans`` has anything to do: they all ran T rounds already."""
    if all(e.action == "done" for e in plans):
        raise ConfigError(f"--rounds {rounds}: {str(where)!r} has run {rounds} rounds already: expected more than "
                          f"{rounds}")


def extend_group(path: Path, cfg: RunConfig, rounds: int) -> RunConfig:
    """Make group folder ``path`` (its config ``cfg``, group.json's) that of a group of T = ``rounds`` rounds whose
    runs stopped where they are; returns the group's config at T, for ``compare.run_group(..., resume=True)``. Every
    run is checked before anything is written; group.json is written first (module docstring)."""
    from fedsl.config.expand import expand_runs
    target = group_target(cfg, rounds)
    plans, unstarted = [], False
    for rname, (_, rcfg) in expand_runs(target).items():
        rd = RunDir(path / rname)
        if rd.is_run():
            plans.append(plan(rname, rd, rcfg))
        else:  # never started: `fedsl resume` starts it at T
            unstarted = True
    if not unstarted:
        _check_target(plans, rounds, path)
    write_group_config(path, target)
    for e in plans:
        prepare(e)
    return target


def extend_runs(path: Path, runs: dict[str, RunDir], rounds: int) -> None:
    """Make the run folders ``runs`` (a run folder ``path``, or the runs of a group written without its config)
    those of runs of T = ``rounds`` rounds stopped where they are, each from its config.json: `fedsl resume` then
    continues them as any unfinished run. Every run is checked before anything is written."""
    plans = [plan(name, rd, with_rounds(validate_saved(rd.read_config()), rounds))
             for name, rd in runs.items() if rd.is_run()]
    _check_target(plans, rounds, path)
    for e in plans:
        prepare(e)
