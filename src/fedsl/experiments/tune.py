"""``fedsl tune``: an Optuna study per variant of a config, judged on validation data, every variant the same budget.

A folder made by ``fedsl tune`` holds::

    tune.json             what was asked: the config, each variant's trial config and search space, the budget
    study.db              Optuna's studies (its embedded SQLite storage), one per variant, named after it
    VARIANT/trial-0007/   each trial's run folder (config.json, metrics.csv, summary.json, checkpoint.pt)

Each trial is a run of ``tune.rounds`` rounds with the sampled values, on the clients' data less the validation
split (``data.validation``), judged on ``final_val_accuracy``: the rolling validation accuracy at its last round.
The test set is never read by a study: its evaluations are in the trials' metrics.csv, as in any run, but neither
the objective nor the pruning reads them. The sampler is Optuna's TPE, seeded from ``tune.seed``, the variant and
the number of trials before (so a resumed study draws what an uninterrupted one would); the pruner (Optuna's
median rule, ``tune.prune``) stops a trial whose rolling validation accuracy trails the median of the trials
before at the same round. A variant's budget is ``tune.trials`` finished trials (complete, pruned or failed).

``fedsl resume DIR`` continues a study killed at any point (Ctrl-C, SIGTERM, kill -9): finished trials are kept; a
trial that was running is marked failed and run again with the same values, continuing its run folder from its
last checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
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
from fedsl.core.threads import CONCURRENT_ENV
from fedsl.experiments.build import check
from fedsl.experiments.callbacks import Callback
from fedsl.experiments.config import ConfigError, RunConfig, validate
from fedsl.experiments.loading import set_dotted
from fedsl.experiments.sweep import expand_runs
from fedsl.experiments.tune_space import describe, run_space

TUNE_FILE = "tune.json"
STUDY_FILE = "study.db"
TRIAL_NAME = "trial-{:04d}"

Log = Callable[[str], None]


def optuna_module():
    """Optuna, or a ConfigError of one line saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("fedsl tune needs Optuna: pip install 'fedsl[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass
class VariantStudy:
    """One variant's study: its trial config (the run every trial starts from) and search space."""

    variant: str
    trial_config: dict[str, Any]
    space: dict[str, Any]


def plan(cfg: RunConfig, data_checks: bool = True) -> dict[str, VariantStudy]:
    """Each variant's trial config and space (``tune_space``), checked before any trial: every key of a space is one
    its run reads and every value in its range validates (a ConfigError of one line otherwise). ``data_checks``:
    also the checks that build the data (``build.check``), which a worker of a study its driver planned skips."""
    if cfg.sweep:
        raise ConfigError("sweep: a config with a [sweep] is not tuned: expected variants (each tuned on its own, "
                          "the same budget each); [tune.space] says which keys a study searches")
    out: dict[str, VariantStudy] = {}
    for _, (variant, run_cfg) in expand_runs(cfg.model_copy(update={"seeds": []})).items():
        t = run_cfg.tune
        data = run_cfg.model_dump()
        data["rounds"] = t.rounds or run_cfg.rounds
        if not run_cfg.data.validation:
            data["data"]["validation"] = t.validation
        data["name"] = variant
        trial_cfg = validate(data)
        try:  # what needs the data (a batch larger than a client keeps after the validation split): before any trial
            if data_checks:
                check(trial_cfg)
        except ConfigError as e:
            raise ConfigError((f"variants.{variant}: " if cfg.variants else "") + f"{e} (the trials hold out "
                              f"data.validation = {trial_cfg.data.validation} of each client's samples)") from None
        try:
            space = run_space(trial_cfg, t.space, set(_flat_keys(data)))
        except ValueError as e:
            raise ConfigError(f"variants.{variant}: {e}" if cfg.variants else str(e)) from None
        for key, entry in space.items():  # each key at the ends of its range: a key of another rule is refused
            for value in _corners(entry):
                try:
                    validate(_with(data, {key: value}))
                except ConfigError as e:
                    raise ConfigError(f"tune.space.{key!r} = {value!r}" + (f" (variant {variant})" if cfg.variants
                                                                           else "") + f": {e}") from None
        if t.sampler == "grid":
            ranges = [k for k, e in space.items() if isinstance(e, Range)]
            if ranges:
                raise ConfigError("tune.sampler = 'grid'" + (f" (variant {variant})" if cfg.variants else "")
                                  + f": {', '.join(ranges)} has a range, not a list: expected a list of values (or "
                                  "one value) in [tune.space] for every key a grid searches")
            size = math.prod(len(e) for e in space.values() if isinstance(e, list))
            if t.trials > size:
                raise ConfigError(f"tune.trials = {t.trials} with tune.sampler = 'grid'"
                                  + (f" (variant {variant})" if cfg.variants else "")
                                  + f": expected at most the grid's {size} combinations")
        out[variant] = VariantStudy(variant, data, space)
    return out


def grid_points(space: dict[str, Any], seed: int, variant: str) -> list[dict[str, Any]]:
    """Every combination of the space's lists, in an order drawn from (seed, variant): a budget smaller than the
    grid takes a uniform sample of it."""
    import itertools
    import random
    lists = {k: v for k, v in space.items() if isinstance(v, list)}
    points = [dict(zip(lists, combo)) for combo in itertools.product(*lists.values())]
    random.Random(f"{seed}/{variant}").shuffle(points)
    return points


def _flat_keys(data: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in data.items():
        if isinstance(v, dict) and k not in ("variants", "sweep", "quick", "tune"):
            out += _flat_keys(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def _corners(entry: Any) -> list:
    if isinstance(entry, Range):
        return [int(entry.low), int(entry.high)] if entry.integer else [entry.low, entry.high]
    return list(entry) if isinstance(entry, list) else [entry]


def _with(data: dict, values: dict[str, Any]) -> dict:
    out = copy.deepcopy(data)
    for key, value in values.items():
        set_dotted(out, key, value)
    return out


def fingerprint(studies: dict[str, VariantStudy], t) -> str:
    """A digest of what the studies ask (trial configs, spaces, budget, metric, sampler): a study file is only
    continued by the same question. A trial config enters by the keys it sets away from their defaults, so that a
    key a later fedsl adds (at its default, which changes nothing) leaves the question the same."""
    text = json.dumps({v: [_set_keys(validate(s.trial_config)), describe(s.space)] for v, s in studies.items()},
                      sort_keys=True, default=str)
    text += json.dumps([t.trials, t.metric, t.seed, t.prune, t.startup_trials, t.sampler])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _set_keys(cfg: RunConfig) -> dict[str, Any]:
    """``cfg``'s keys that differ from their defaults, table by table (the [tune] table apart: the digest lists what
    of it matters)."""
    from pydantic import BaseModel

    from fedsl.experiments.config import changed
    out: dict[str, Any] = {}
    for key, field in type(cfg).model_fields.items():
        value = getattr(cfg, key)
        if key == "tune":
            continue
        if isinstance(value, BaseModel):
            table = {k: getattr(value, k) for k in type(value).model_fields if changed(value, k)}
            if table:
                out[key] = table
        elif field.is_required() or value != field.get_default(call_default_factory=True):
            out[key] = value
    return out


class _Pruning(Callback):
    """Reports each evaluation's rolling validation accuracy to the trial; stops the run when the pruner says so."""

    def __init__(self, trial, optuna) -> None:
        self.trial, self.optuna = trial, optuna

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        value = metrics.get("rolling_val_accuracy")
        if round == 0 or value is None or not math.isfinite(value):
            return
        self.trial.report(float(value), step=round)
        if self.trial.should_prune():
            raise self.optuna.TrialPruned(f"round {round}: rolling validation accuracy {value:.4f}")


class Tuner:
    """The studies of one tune folder, run one trial after another."""

    def __init__(self, out: str | Path, cfg: RunConfig, studies: dict[str, VariantStudy], log: Log) -> None:
        self.optuna = optuna_module()
        self.out, self.cfg, self.studies, self.log = Path(out), cfg, studies, log
        self.storage = f"sqlite:///{(self.out / STUDY_FILE).resolve()}"
        self.key = fingerprint(studies, cfg.tune)

    def study(self, variant: str):
        o, t = self.optuna, self.cfg.tune
        study = o.create_study(study_name=variant, storage=self.storage, direction="maximize", load_if_exists=True)
        if study.user_attrs.get("fingerprint", self.key) != self.key:
            raise ConfigError(f"{self.out / STUDY_FILE}: study {variant!r} was made by another config or budget: "
                              "expected a new --out folder")
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
            study.sampler = o.samplers.TPESampler(seed=seed, n_startup_trials=t.startup_trials)
        # no pruning in a trial's first quarter: early accuracy says little of where a step size ends
        warmup = self.studies[variant].trial_config["rounds"] // 4
        study.pruner = (o.pruners.MedianPruner(n_startup_trials=t.startup_trials, n_warmup_steps=warmup)
                        if t.prune else o.pruners.NopPruner())
        return study

    def finished(self, study) -> int:
        S = self.optuna.trial.TrialState
        return sum(tr.state in (S.COMPLETE, S.PRUNED, S.FAIL) and "rerun" not in tr.user_attrs
                   for tr in study.trials)

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
                    self.log(f"{variant}: trial {tr.number} was interrupted: it runs again with the same values")

    def run(self, workers: int = 1, ray=None) -> None:
        """Every variant's trials up to its budget: one after another, or in ``workers`` processes that share the
        studies (each asks for its next trial under a lock, so the budget is never exceeded), here or as tasks of a
        Ray cluster (``ray``: a ``fedsl.experiments.ray_backend.RayBackend``)."""
        if ray is not None:
            ray.run_workers(_work, (str(self.out.resolve()), workers), workers, self.out.resolve(), log=self.log)
            return
        if workers > 1:
            _in_processes(self.out, workers)
            return
        for variant in self.studies:
            while (asked := self.ask(variant)) is not None:
                self.trial(variant, *asked)

    def ask(self, variant: str):
        """(study, the next trial) of ``variant``, or None when its budget is taken (finished and running trials)."""
        S = self.optuna.trial.TrialState
        with _locked(self.out / ".ask.lock"):
            study = self.study(variant)
            running = sum(tr.state == S.RUNNING and "rerun" not in tr.user_attrs for tr in study.trials)
            if self.finished(study) + running >= self.cfg.tune.trials:
                return None
            return study, study.ask()

    def trial(self, variant: str, study, trial) -> None:
        o, vs = self.optuna, self.studies[variant]
        values = {}
        for key, entry in vs.space.items():
            if isinstance(entry, Range):
                values[key] = (trial.suggest_int(key, int(entry.low), int(entry.high), log=entry.log)
                               if entry.integer else trial.suggest_float(key, entry.low, entry.high, log=entry.log))
            elif isinstance(entry, list):
                values[key] = trial.suggest_categorical(key, entry)
            else:
                values[key] = entry
        folder_name = trial.user_attrs.get("folder", TRIAL_NAME.format(trial.number))
        trial.set_user_attr("folder", folder_name)
        folder = self.out / variant / folder_name
        n = self.finished(study) + 1
        from fedsl.experiments.runner import run
        data = _with(vs.trial_config, values)
        data["name"] = f"{variant}-{folder_name}"
        shown = ", ".join(f"{k.split('.')[-1]}={_short(v)}" for k, v in values.items())
        try:
            summary = run(validate(data), folder, resume=(folder / "config.json").is_file(), log=lambda s: None,
                          progress=False, callbacks=[_Pruning(trial, o)])
        except o.TrialPruned as e:
            study.tell(trial, state=o.trial.TrialState.PRUNED)
            self.log(f"{variant}: trial {n}/{self.cfg.tune.trials} ({shown}): pruned at {e}")
            return
        except ConfigError as e:
            study.tell(trial, state=o.trial.TrialState.FAIL)
            self.log(f"{variant}: trial {n}/{self.cfg.tune.trials} ({shown}): refused: {e}")
            return
        value = summary.get(self.cfg.tune.metric)
        if summary.get("status") != "completed" or value is None or not math.isfinite(value):
            study.tell(trial, state=o.trial.TrialState.FAIL)
            self.log(f"{variant}: trial {n}/{self.cfg.tune.trials} ({shown}): {summary.get('status')}")
            return
        study.tell(trial, float(value))
        self.log(f"{variant}: trial {n}/{self.cfg.tune.trials} ({shown}): validation {value:.4f} "
                 f"(best {study.best_value:.4f})")


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
    tuner = Tuner(out, cfg, studies, log)
    record = {"config": cfg.model_dump(), "fingerprint": tuner.key,
              "trials": cfg.tune.trials, "metric": cfg.tune.metric,
              "variants": {v: {"rounds": s.trial_config["rounds"], "validation": s.trial_config["data"]["validation"],
                               "space": describe(s.space)} for v, s in studies.items()}}
    tmp = out / (TUNE_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(out / TUNE_FILE)
    return tuner


def planned_config(out: str | Path) -> RunConfig:
    """The config a tune folder's studies were planned from (its tune.json)."""
    try:
        return validate(json.loads((Path(out) / TUNE_FILE).read_text())["config"])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{Path(out) / TUNE_FILE}: cannot be read ({e}): expected a folder written by `fedsl tune`") \
            from None


def reopen(out: str | Path, log: Log, worker: bool = False) -> Tuner:
    """The tuner of an existing tune folder (``fedsl resume``), its interrupted trials queued again. A ``worker`` of
    a running study leaves the trials running (its other workers' are running, not interrupted) and the data
    checks to the driver, which made them."""
    out = Path(out)
    cfg = planned_config(out)
    record = json.loads((out / TUNE_FILE).read_text())
    studies = plan(cfg, data_checks=not worker)
    tuner = Tuner(out, cfg, studies, log)
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
        from fedsl.experiments.config import OWN_KEYS, lookup
        from fedsl.experiments.loading import deep_merge, has_dotted

        def reads(over: dict, key: str) -> bool:
            section, _, name = key.partition(".")
            merged = deep_merge(data, over)
            return all(lookup(merged, r.selector) in r.readers[name] for r in OWN_KEYS
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


def results(out: str | Path, top: int = 3) -> list[dict[str, Any]]:
    """Each variant's study: trials finished (complete, pruned, failed), the best value and values, the top trials
    and the spread of their values (what a comparison reports beside its chosen values)."""
    optuna = optuna_module()
    out = Path(out)
    record = json.loads((out / TUNE_FILE).read_text())
    storage = f"sqlite:///{(out / STUDY_FILE).resolve()}"
    S = optuna.trial.TrialState
    rows = []
    for variant in record["variants"]:
        try:
            study = optuna.load_study(study_name=variant, storage=storage)
        except KeyError:
            rows.append({"variant": variant, "complete": 0, "pruned": 0, "failed": 0, "best": None})
            continue
        trials = [t for t in study.trials if "rerun" not in t.user_attrs]
        done = sorted((t for t in trials if t.state == S.COMPLETE), key=lambda t: -t.value)
        rows.append({"variant": variant, "complete": len(done), "pruned": sum(t.state == S.PRUNED for t in trials),
                     "failed": sum(t.state == S.FAIL for t in trials), "budget": record["trials"],
                     "best": done[0].value if done else None, "params": done[0].params if done else {},
                     "folder": done[0].user_attrs.get("folder") if done else None,
                     "top": [(t.number, t.value, t.params) for t in done[:top]],
                     "top_spread": (done[0].value - done[min(top, len(done)) - 1].value) if done else None,
                     "values": [(t.number, t.value) for t in trials if t.state == S.COMPLETE]})
    return rows


def write_report(out: str | Path) -> Path:
    """best.json (each variant's chosen values, its top trials and their spread) and trials.png (each trial's
    validation accuracy, and the best so far, per variant)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    rows = results(out)
    (out / "best.json").write_text(json.dumps(rows, indent=1, default=str))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in rows:
        if r.get("values"):
            xs, ys = zip(*r["values"])
            line = ax.plot(xs, ys, "o", ms=4, alpha=0.6, label=r["variant"])[0]
            best = [max(ys[:i + 1]) for i in range(len(ys))]
            ax.step(xs, best, where="post", color=line.get_color())
    ax.set_xlabel("trial")
    ax.set_ylabel("validation accuracy (final, rolling)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "trials.png", dpi=120)
    plt.close(fig)
    return out / "trials.png"
