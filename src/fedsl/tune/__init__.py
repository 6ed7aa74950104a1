"""``fedsl tune``: an Optuna study per variant of a config, judged on validation data, every variant the same budget.

The package: this module (the studies: trials asked, run alone or stacked, told), ``plan`` (each variant's trial
config and space, checked before any trial), ``edges`` (ranges widened at an edge) and ``report`` (best.json,
trials.png). It drives runs and groups (``fedsl.runs``, ``fedsl.sweeps``); the [tune] table and where studies live
(``fedsl.config.tune_space``, ``tune_storage``) are config, below it. It may import ``sweeps``, ``runs``, ``config`` and
everything below them; only the command line imports it.

A folder made by ``fedsl tune`` holds::

    tune.json             what was asked: the config, each variant's trial config and search space, the budget
    study.db              Optuna's studies, one per variant, named after it (``tune.storage``: or study.journal, or
                          a database server's, ``fedsl.config.tune_storage``)
    VARIANT/trial-0007/   each trial's run folder (config.json, metrics.csv, summary.json, checkpoint.pt)

Each trial is a run of ``tune.rounds`` rounds with the sampled values, on the clients' data less the validation
split (``data.validation``), judged on ``final_val_accuracy``: the rolling validation accuracy at its last round.
The test set is never read by a study: its evaluations are in the trials' metrics.csv, as in any run, but neither
the objective nor the pruning reads them. The sampler is Optuna's TPE (with its constant liar, so that trials asked
together differ), seeded from ``tune.seed``, the variant and the number of trials before (so a resumed study draws
what an uninterrupted one would); the pruner (``tune.pruner``: Optuna's median rule or Hyperband over rounds) stops
a trial early, which then counts the rounds it ran. A variant's budget is ``tune.trials`` finished trials
(complete, pruned or failed), or ``tune.budget_rounds`` rounds run.

``tune.stack`` trials are asked at once and run as stacked runs (``runner.run_stacked``) where their structure
agrees; a trial's metrics equal its run alone. A trial is named by its folder (``trial-0007``) everywhere: progress
lines, best.json, trials.png. When a variant's budget is spent and its best values lie at the edge of a range
that may be widened (``fedsl.tune.edges``), the range is widened and ``tune.edge_trials`` more trials
run, up to ``tune.edge_widenings`` times; the widened ranges are kept in the study.

``fedsl resume DIR`` continues a study killed at any point (Ctrl-C, SIGTERM, kill -9): finished trials are kept; a
trial that was running is marked failed and run again with the same values under the same name, continuing its run
folder from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsl.algorithms.spec import Range
from fedsl.config.expand import set_dotted
from fedsl.config.schema import ConfigError, RunConfig, validate
from fedsl.config.tune_space import describe
from fedsl.config.tune_storage import describe_storage, open_storage, study_name
from fedsl.core.threads import CONCURRENT_ENV
from fedsl.runs.callbacks import Callback, StopRun
from fedsl.tune import edges as tune_edges
from fedsl.tune.plan import VariantStudy, _with, fingerprint, grid_points, plan
from fedsl.tune.report import (
    STUDY_FILE,
    TRIAL_NAME,
    TUNE_FILE,
    optuna_module,
    planned_config,
    results,
    trial_index,
    write_report,
)

__all__ = ["STUDY_FILE", "TRIAL_NAME", "TUNE_FILE", "Tuner", "apply_best", "is_tune_folder", "plan", "planned_config",
           "reopen", "results", "start", "write_report"]
GPU_STACK = 8  # tune.stack = 'auto' on a GPU: trials asked at once (TPE learns less from trials still running)
HYPERBAND_MIN_SHARE = 9  # tune.pruner = 'hyperband': its smallest rung is rounds / 9 (three brackets at factor 3)

Log = Callable[[str], None]


class _Pruning(Callback):
    """Reports each evaluation's rolling validation accuracy to the trial; ends its run (status 'pruned') when the
    pruner says so."""

    def __init__(self, trial, optuna) -> None:
        self.trial, self.optuna = trial, optuna

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        value = metrics.get("rolling_val_accuracy")
        if round == 0 or value is None or not math.isfinite(value):
            return
        self.trial.report(float(value), step=round)
        if self.trial.should_prune():
            raise StopRun(f"round {round}: rolling validation accuracy {value:.4f}", status="pruned")


@dataclass
class _Trial:
    """A trial asked and ready to run: its values, config, folder and pruning callback."""

    trial: Any
    values: dict[str, Any]
    cfg: RunConfig | None  # None: its values were refused (ConfigError in ``refused``)
    folder: Path
    pruning: _Pruning
    refused: str = ""

    @property
    def name(self) -> str:
        return self.folder.name


class Tuner:
    """The studies of one tune folder: trials asked ``stack`` at a time and run one by one or stacked."""

    def __init__(self, out: str | Path, cfg: RunConfig, studies: dict[str, VariantStudy], log: Log,
                 prefix: str | None = None) -> None:
        self.optuna = optuna_module()
        self.out, self.cfg, self.studies, self.log = Path(out), cfg, studies, log
        self.key = fingerprint(studies, cfg.tune)
        self.prefix = prefix or self.key  # a shared database tells this folder's studies apart by it
        self.storage = open_storage(cfg.tune.storage, self.out)

    def study(self, variant: str):
        o, t = self.optuna, self.cfg.tune
        study = o.create_study(study_name=study_name(t.storage, self.prefix, variant), storage=self.storage,
                               direction="maximize", load_if_exists=True)
        if study.user_attrs.get("fingerprint", self.key) != self.key:
            raise ConfigError(f"{describe_storage(t.storage, self.out)}: study {variant!r} was made by another "
                              "config or budget: expected a new --out folder")
        if "fingerprint" not in study.user_attrs:  # written once, not at every trial asked
            study.set_user_attr("fingerprint", self.key)
        # the draw of trial n follows from (seed, variant, n) and the trials before: a trial run again after a kill
        # (marked "rerun") does not count, so a resumed study draws what an uninterrupted one would
        n = sum("rerun" not in tr.user_attrs for tr in study.trials)
        seed = int(hashlib.sha256(f"{t.seed}/{variant}/{n}".encode()).hexdigest()[:8], 16)
        if t.sampler == "grid":  # the grid's points queued once, in a seeded order; the sampler then draws nothing
            study.sampler = o.samplers.RandomSampler(seed=seed)
            if not study.trials:
                for point in grid_points(self.studies[variant].space, t.seed, variant)[:t.trials]:
                    study.enqueue_trial(point)
        else:
            study.sampler = o.samplers.TPESampler(seed=seed, n_startup_trials=t.startup_trials, constant_liar=True)
        study.pruner = self.pruner(variant)
        return study

    def rounds(self, variant: str) -> int:
        """The rounds of each trial of ``variant``."""
        return self.studies[variant].trial_config["rounds"]

    def pruner(self, variant: str):
        o, t, rounds = self.optuna, self.cfg.tune, self.rounds(variant)
        if t.pruning == "hyperband":
            return o.pruners.HyperbandPruner(min_resource=max(1, rounds // HYPERBAND_MIN_SHARE), max_resource=rounds,
                                             reduction_factor=3)
        if t.pruning == "median":  # no pruning in a trial's first quarter: early accuracy says little of its end
            return o.pruners.MedianPruner(n_startup_trials=t.startup_trials, n_warmup_steps=rounds // 4)
        return o.pruners.NopPruner()

    def space(self, variant: str, study) -> dict[str, Any]:
        """``variant``'s space now: as planned, with the ranges its study widened."""
        return tune_edges.from_json(self.studies[variant].space, study.user_attrs.get("space", {}))

    def stack(self, variant: str) -> int:
        """Trials asked at once (``tune.stack``; 'auto': ``GPU_STACK`` on a GPU, 1 on a CPU)."""
        t = self.cfg.tune
        if t.stack != "auto":
            return t.stack
        from fedsl.runs.placement import resolve_device
        device = resolve_device(self.studies[variant].trial_config.get("device", "auto"))
        return GPU_STACK if device.type == "cuda" else 1

    def fresh(self, study) -> list:
        """The study's trials that count (a trial run again after a kill is counted once, as its new trial)."""
        return [tr for tr in study.trials if "rerun" not in tr.user_attrs]

    def finished(self, study) -> int:
        S = self.optuna.trial.TrialState
        return sum(tr.state in (S.COMPLETE, S.PRUNED, S.FAIL) for tr in self.fresh(study))

    def budget_left(self, variant: str, study) -> int:
        """How many more trials ``variant`` may ask now: its budget (``tune.trials``, or ``tune.budget_rounds`` in
        rounds run, a finished trial counting the rounds it ran and a running one all its rounds), with
        ``tune.edge_trials`` more for each widening, less what is finished or running."""
        S, t = self.optuna.trial.TrialState, self.cfg.tune
        extra = study.user_attrs.get("widenings", 0) * t.edge_trials
        trials = self.fresh(study)
        running = sum(tr.state == S.RUNNING for tr in trials)
        if t.budget_rounds is None:
            return max(0, t.trials + extra - self.finished(study) - running)
        rounds = self.rounds(variant)
        spent = sum(tr.user_attrs.get("rounds_run", rounds) for tr in trials if tr.state != S.RUNNING)
        return max(0, math.ceil((t.budget_rounds + extra * rounds - spent) / rounds) - running)

    def rerun_interrupted(self) -> None:
        """Trials left running by a killed process: marked failed (not counted), their values queued again."""
        S = self.optuna.trial.TrialState
        for variant in self.studies:
            study = self.study(variant)
            for tr in study.trials:
                if tr.state == S.RUNNING:
                    study._storage.set_trial_user_attr(tr._trial_id, "rerun", True)
                    study._storage.set_trial_state_values(tr._trial_id, state=S.FAIL)
                    folder = tr.user_attrs.get("folder", TRIAL_NAME.format(tr.number))
                    study.enqueue_trial(tr.params, user_attrs={"folder": folder})
                    self.log(f"{variant}: {folder} was interrupted: it runs again with the same values")

    def run(self, workers: int = 1, ray=None) -> None:
        """Every variant's trials up to its budget: here, ``tune.stack`` at a time, or in ``workers`` processes
        that share the studies (each asks for its next trials under a lock, so the budget is never exceeded), here
        or as tasks of a Ray cluster (``ray``: a ``fedsl.sweeps.ray_backend.RayBackend``)."""
        if ray is not None:
            ray.run_workers(_work, (str(self.out.resolve()), workers), workers, self.out.resolve(), log=self.log)
            return
        if workers > 1:
            _in_processes(self.out, workers)
            return
        for variant in self.studies:
            while asked := self.ask(variant, self.stack(variant)):
                self.run_trials(variant, *asked)

    def ask(self, variant: str, k: int = 1):
        """(study, up to ``k`` new trials) of ``variant``, or None when its budget is taken (finished and running
        trials) and no range is widened. Each trial is named by its folder as it is asked."""
        S = self.optuna.trial.TrialState
        with _locked(self.out / ".ask.lock"):
            study = self.study(variant)
            left = self.budget_left(variant, study)
            if left == 0 and not any(tr.state == S.RUNNING for tr in study.trials) and self.widen(variant, study):
                study = self.study(variant)
                left = self.budget_left(variant, study)
            if left == 0:
                return None
            trials = [study.ask() for _ in range(min(k, left))]
            names = [tr.user_attrs.get("folder") for tr in study.trials if tr.user_attrs.get("folder")]
            index = 1 + max((trial_index(n) for n in names), default=-1)
            for tr in trials:
                if "folder" not in tr.user_attrs:
                    tr.set_user_attr("folder", TRIAL_NAME.format(index))
                    index += 1
            return study, trials

    def widen(self, variant: str, study) -> bool:
        """When ``variant``'s best values lie at an edge that may be widened: widen those ranges, keep them in the
        study and give it ``tune.edge_trials`` more trials (True); False when nothing is widened."""
        t, S = self.cfg.tune, self.optuna.trial.TrialState
        done = study.user_attrs.get("widenings", 0)
        complete = [tr for tr in study.trials if tr.state == S.COMPLETE]
        if t.sampler == "grid" or done >= t.edge_widenings or not complete:
            return False
        best = max(complete, key=lambda tr: tr.value)
        base = self.studies[variant].trial_config

        def allowed(key: str, value: float) -> bool:
            try:
                validate(_with(base, {key: value}))
                return True
            except ConfigError:
                return False
        space, said = tune_edges.widen(self.space(variant, study), best.params, allowed)
        if not said:
            return False
        study.set_user_attr("space", tune_edges.to_json(space))
        widened = any("->" in w for w in said.values())
        if widened:
            study.set_user_attr("widenings", done + 1)
            study.set_user_attr(f"widening-{done + 1}", said)
        folder = best.user_attrs.get("folder", TRIAL_NAME.format(best.number))
        self.log(f"{variant}: the best trial ({folder}) lies at an edge: "
                 + "; ".join(f"{k} {w}" for k, w in said.items())
                 + (f": {t.edge_trials} more trials" if widened else ""))
        return widened

    def prepare(self, variant: str, study, trial) -> _Trial:
        """``trial``'s values drawn from the variant's space, its config and folder."""
        vs = self.studies[variant]
        values = {}
        for key, entry in self.space(variant, study).items():
            if isinstance(entry, Range):
                values[key] = (trial.suggest_int(key, int(entry.low), int(entry.high), log=entry.log)
                               if entry.integer else trial.suggest_float(key, entry.low, entry.high, log=entry.log))
            elif isinstance(entry, list):
                values[key] = trial.suggest_categorical(key, entry)
            else:
                values[key] = entry
        folder = self.out / variant / trial.user_attrs["folder"]
        data = _with(vs.trial_config, values)
        data["name"] = f"{variant}-{folder.name}"
        try:
            cfg, refused = validate(data), ""
        except ConfigError as e:
            cfg, refused = None, str(e)
        return _Trial(trial, values, cfg, folder, _Pruning(trial, self.optuna), refused)

    def run_trials(self, variant: str, study, trials: list) -> None:
        """Run ``trials`` (asked together): those whose runs may share a stack together (``runner.run_stacked``;
        one by one if the stack fails), the others alone; then tell the study each one's end."""
        from fedsl.sweeps.compare import stack_groups
        ready = {}
        for tr in (self.prepare(variant, study, tr) for tr in trials):
            if tr.cfg is None:
                self.tell(variant, study, tr, None)
            else:
                ready[tr.name] = tr
        # a trial run again continues from its checkpoint: it stacks with trials at the same round (as a group's runs)
        for names in stack_groups({n: tr.cfg for n, tr in ready.items()}, self.out / variant, resume=True,
                                  limit=len(trials)):
            group = [ready[n] for n in names]
            summaries = self._stacked(group) if len(group) > 1 else {}
            for tr in group:
                if tr.name not in summaries:
                    summaries[tr.name] = self._alone(tr)
                self.tell(variant, study, tr, summaries[tr.name])

    def _stacked(self, group: list[_Trial]) -> dict[str, dict]:
        """Run ``group`` as stacked runs: trial name -> summary; {} when the stack failed (its trials then run
        alone, continuing their folders)."""
        from fedsl.runs.runner import run_stacked
        try:
            ends = run_stacked([tr.cfg for tr in group], [tr.folder for tr in group], resume=True,
                               log=lambda s: None, progress=False, callbacks=[[tr.pruning] for tr in group])
        except (ConfigError, ValueError, RuntimeError) as e:
            self.log(f"stacked trials {', '.join(tr.name for tr in group)}: {type(e).__name__}: {e}; "
                     "running them one by one")
            return {}
        return {tr.name: end for tr, end in zip(group, ends)}

    def _alone(self, tr: _Trial) -> dict | str:
        """Run one trial: its summary, or the ConfigError's line that refused it."""
        from fedsl.runs.results import RunDir
        from fedsl.runs.runner import run
        if RunDir(tr.folder).read_summary().get("status") in ("completed", "pruned", "diverged"):
            return RunDir(tr.folder).read_summary()  # ended inside a stack that then failed
        try:
            return run(tr.cfg, tr.folder, resume=(tr.folder / "config.json").is_file(), log=lambda s: None,
                       progress=False, callbacks=[tr.pruning])
        except ConfigError as e:
            return str(e)

    def tell(self, variant: str, study, tr: _Trial, summary: dict | str | None) -> None:
        """Tell the study how ``tr`` ended (complete with its value, pruned, or failed), with the rounds it ran."""
        o, t = self.optuna, self.cfg.tune
        S = o.trial.TrialState
        shown = ", ".join(f"{k.split('.')[-1]}={_short(v)}" for k, v in tr.values.items())
        said = f"{variant}: {tr.name} ({shown})"
        if not isinstance(summary, dict):  # refused before its first round: it ran none
            study._storage.set_trial_user_attr(tr.trial._trial_id, "rounds_run", 0)
            study.tell(tr.trial, state=S.FAIL)
            self.log(f"{said}: refused: {tr.refused or summary}")
            return
        study._storage.set_trial_user_attr(tr.trial._trial_id, "rounds_run", int(summary.get("rounds_done", 0)))
        value = summary.get(t.metric)
        if summary.get("status") == "pruned":
            study.tell(tr.trial, state=S.PRUNED)
            self.log(f"{said}: pruned after round {summary.get('rounds_done')}")
        elif summary.get("status") != "completed" or value is None or not math.isfinite(value):
            study.tell(tr.trial, state=S.FAIL)
            self.log(f"{said}: {summary.get('status')}")
        else:
            study.tell(tr.trial, float(value))
            self.log(f"{said}: validation {value:.4f} (best {study.best_value:.4f})")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` held inside (the processes of one study ask for trials one at a time)."""
    import fcntl
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _work(out: str, workers: int) -> None:
    """A worker process of ``run(workers)``: the folder's studies, trial after trial, one torch thread's share."""
    os.environ[CONCURRENT_ENV] = str(workers)
    reopen(out, print, worker=True).run()


def _in_processes(out: Path, workers: int) -> None:
    """``workers`` processes (spawned: no torch state inherited) running the folder's trials; Ctrl-C or SIGTERM stops
    them (their trials stay running in the study, and ``fedsl resume`` runs them again)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_work, args=(str(out), workers)) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    if any(p.exitcode for p in procs):
        raise ConfigError(f"a worker of the study in {out} stopped with exit code "
                          f"{next(p.exitcode for p in procs if p.exitcode)}: continue with `fedsl resume {out}`")


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def start(cfg: RunConfig, out: str | Path, log: Log) -> Tuner:
    """A new tune folder for ``cfg`` (its studies planned, tune.json written); refused when ``out`` holds anything."""
    out = Path(out)
    if out.exists() and any(p.name != ".lock" for p in out.iterdir()):
        hint = (f", or continue it with `fedsl resume {out}`" if (out / TUNE_FILE).is_file() else "")
        raise ConfigError(f"--out {str(out)!r} is not empty: choose a new folder{hint}")
    studies = plan(cfg)
    out.mkdir(parents=True, exist_ok=True)
    # a shared database holds many folders' studies: this folder's are told apart by a prefix of its own
    prefix = f"{cfg.name}-{fingerprint(studies, cfg.tune)}-{os.urandom(4).hex()}"
    tuner = Tuner(out, cfg, studies, log, prefix)
    record = {"config": cfg.model_dump(), "fingerprint": tuner.key, "study_prefix": prefix,
              "storage": describe_storage(cfg.tune.storage, out),
              "trials": cfg.tune.trials, "budget_rounds": cfg.tune.budget_rounds, "metric": cfg.tune.metric,
              "variants": {v: {"rounds": s.trial_config["rounds"], "validation": s.trial_config["data"]["validation"],
                               "space": describe(s.space), "ranges": tune_edges.to_json(s.space),
                               "choices": {k: e for k, e in s.space.items() if isinstance(e, list)}}
                           for v, s in studies.items()}}
    tmp = out / (TUNE_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(out / TUNE_FILE)
    return tuner


def reopen(out: str | Path, log: Log, worker: bool = False) -> Tuner:
    """The tuner of an existing tune folder (``fedsl resume``), its interrupted trials queued again. A ``worker`` of
    a running study leaves the trials running (its other workers' are running, not interrupted) and the data
    checks to the driver, which made them."""
    out = Path(out)
    cfg = planned_config(out)
    record = json.loads((out / TUNE_FILE).read_text())
    studies = plan(cfg, data_checks=not worker)
    tuner = Tuner(out, cfg, studies, log, record.get("study_prefix"))
    if tuner.key != record.get("fingerprint"):
        raise ConfigError(f"{out / TUNE_FILE}: its studies were planned differently by another fedsl version: "
                          "expected a new `fedsl tune` folder")
    if not worker:
        tuner.rerun_interrupted()
    return tuner


def apply_best(cfg: RunConfig, study: str | Path) -> RunConfig:
    """``cfg`` with each variant at the values its study chose (the best finished trial's), for the runs on fresh
    seeds that a tuned comparison reports on the test set. The trials' validation split is the study's: these
    runs train on what ``cfg`` says (``data.validation`` = 0 unless it sets it). A variant without a finished
    trial is refused in one line."""
    chosen = {r["variant"]: r for r in results(study)}
    data = cfg.model_dump()
    names = list(cfg.variants) or [cfg.name]
    for v in names:
        row = chosen.get(v)
        if row is None or row.get("best") is None:
            raise ConfigError(f"variant {v!r} has no finished trial in {Path(study) / STUDY_FILE}: expected its "
                              "study to have run (fedsl resume it)")
        target = data["variants"].setdefault(v, {}) if cfg.variants else data
        for key, value in row["params"].items():
            set_dotted(target, key, value)
    if cfg.variants:  # a template value that every variant reading it now sets itself is read by no run (refused)
        from fedsl.config.expand import deep_merge, has_dotted
        from fedsl.config.schema import OWN_KEYS

        def reads(over: dict, key: str) -> bool:
            section, _, name = key.partition(".")
            merged = deep_merge(data, over)
            return all(r.reads(name, r.choice_in(merged)) for r in OWN_KEYS
                       if r.section == section and name in r.readers)

        for key in {k for r in chosen.values() for k in r.get("params", {})}:
            if all(has_dotted(over, key) or not reads(over, key) for over in data["variants"].values()):
                *path, last = key.split(".")
                table = data
                for part in path:
                    table = table.get(part, {})
                table.pop(last, None)
    return validate(data)


def is_tune_folder(path: str | Path) -> bool:
    return (Path(path) / TUNE_FILE).is_file()
