"""Drive runs: loop the rounds of one run (``run``) or of several in lock-step (``run_stacked``).

A run is built by ``fedsl.runs.build``; its rounds are the simulator's (``fedsl.engine.simulator``).
``RunSession`` is one run's side of the loop: it resumes from the run's checkpoint, decides when to
evaluate, and tells the run's callbacks of each evaluation and round; those keep its files
(``fedsl.runs.files``: metrics.csv, checkpoint.pt, summary.json), its progress and its
trackers. ``DivergenceGuard`` (``fedsl.runs.divergence``) stops a run that diverged.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from fedsl.config.resolve import format_hparams
from fedsl.config.schema import ConfigError, RunConfig
from fedsl.data.federation import Federation
from fedsl.engine import metrics
from fedsl.engine.client_state import ClientStore
from fedsl.engine.diagnostics import measure
from fedsl.engine.simulator import RoundInfo, RunState
from fedsl.engine.stacked import StackedSimulator
from fedsl.runs import tracking
from fedsl.runs.build import Built, Prepared, finetune, prepare
from fedsl.runs.callbacks import Callback, CallbackList, RunStart, StopRun
from fedsl.runs.divergence import DivergenceGuard
from fedsl.runs.files import Checkpoints, MetricsFile, RunSummary
from fedsl.runs.progress import RunProgress
from fedsl.runs.results import RunDir, is_group

Log = Callable[[str], None]


class RunSession:
    """One run's side of the rounds: its folder, resumption, evaluations, callbacks and divergence guard.

    ``run`` drives one session with its own simulator; ``run_stacked`` drives several in
    lock-step with a ``StackedSimulator``. Either way a session decides when to evaluate,
    records each finished round, and its callbacks keep every finished round resumable.
    """

    def __init__(self, cfg: RunConfig, out: str | Path, *, resume: bool, log: Log, progress: bool | None,
                 prep: Prepared | None = None, built: Built | None = None, callbacks: Sequence[Callback] = ()) -> None:
        refuse_group(cfg)
        self.cfg, self.log = cfg, log
        self.rd = rd = RunDir(out)
        for p in rd.remove_stale_tmp():
            log(f"{cfg.name}: removed {p.name}, left by a write that was killed")
        self.prep = prep = prep or prepare(cfg, built=built)
        self.sim = sim = prep.sim
        sim.run_folder = rd.path  # a store of the clients' states on disk keeps its file here
        self.start, self.wall0, history = 0, 0.0, []
        self.state: RunState | None = None
        if resume:
            started = rd.read_summary().get("threads")
            if not cfg.threads and isinstance(started, int) and 0 < started != torch.get_num_threads():
                # automatic threads follow the machine's load, and float sums (so results, to the last
                # bit) follow the thread count: the resumed rounds use the count the run started with
                torch.set_num_threads(started)
            # a store on disk is rebuilt from the checkpoint's rows read from the file, not held in memory at once
            ckpt = rd.load_checkpoint(mmap=cfg.client_state.on_disk)
            if ckpt is not None:
                self.start, self.wall0 = ckpt.round, float(ckpt.extra.get("wall_time", 0.0))

                s = ckpt.state  # the clients' states where the simulator keeps them (host memory, a file, ...)
                try:
                    clients = sim.place_clients(s.clients)
                except ValueError as e:
                    raise ConfigError(f"{rd.checkpoint_file}: {e}") from None
                self.state = s.moved(lambda v: v.to(device=prep.device, dtype=sim.dtype), clients)
                history = rd.truncate_metrics(self.start)
            elif rd.is_run():
                rd.truncate_metrics(-1)  # no checkpoint (checkpoint_every = 0): the run starts over, round 0 too
            log(f"{cfg.name}: resuming at round {self.start + 1} of {cfg.rounds}")
        else:
            rd.create(cfg.model_dump(), validation=len(prep.fed.validation) > 0, per_client=cfg.eval_per_client)
        fed = prep.fed
        log(f"{cfg.name}: {prep.algorithm.name} on {cfg.data.dataset} — N={fed.num_clients}, n={fed.n}, "
            f"n0={fed.n0}, test={len(fed.y_test)}, {cfg.rounds} rounds, {sim.executor.name} executor on {prep.device}\n"
            + format_hparams(prep.hparams))
        self.summary = RunSummary(rd, prep, history, resumed=resume)
        # the rolling accuracy's window: at most its last w evaluations (distinct rounds), not round 0's
        self.window = deque(((int(r["round"]), r["accuracy"]) for r in history if r["round"] > 0),
                            maxlen=cfg.rolling_window)
        # the validation accuracy's, alike (data.validation: its rows carry val_accuracy)
        self.val_window = deque(((int(r["round"]), r["val_accuracy"]) for r in history
                                 if r["round"] > 0 and r.get("val_accuracy") is not None), maxlen=cfg.rolling_window)
        self.guard = DivergenceGuard(cfg, fed.num_classes, history)
        self.done = self.start
        self.t_start = time.perf_counter()
        self.bar = RunProgress(cfg.name, cfg.rounds, self.start, log,
                               sys.stdout.isatty() if progress is None else progress)
        # the run's files first (metrics.csv before checkpoint.pt), then the progress, the config's trackers
        # and the caller's callbacks
        files = [MetricsFile(rd), Checkpoints(rd, cfg.name, cfg.checkpoint_every, cfg.rounds, log, self.current),
                 self.summary]
        self.callbacks = CallbackList([*files, self.bar, *tracking.trackers(cfg.tracking), *callbacks])
        self.callbacks.on_run_start(RunStart(
            cfg.name, rd.path, cfg.model_dump(), cfg.rounds, resumed=resume,
            first_round=self.start + 1 if self.state is not None else 0,
            hyperparameters={h.symbol: h.value for h in prep.hparams}))
        self.t_start = self.bar.t0 = time.perf_counter()  # wall_time counts the run's work, not the trackers' set-up

    def begin(self, state: RunState | None = None) -> None:
        """Round 0 of a new run: x_0 (``state``, or the simulator's), its accuracy, a checkpoint."""
        if self.state is not None:
            return
        cfg, sim = self.cfg, self.sim
        self.state = state if state is not None else sim.initial_state(self.prep.pretrain)
        acc, loss = sim.evaluate(self.state.x, self.state.clients)
        self.guard.set_initial(loss)
        diag = asdict(measure(sim.fm, self.state.x, sim.fed)) if cfg.diag_every else {}
        val = sim.evaluate_validation(self.state.x, self.state.clients)
        valid = {} if val is None else {"val_accuracy": val[0], "val_loss": val[1], "rolling_val_accuracy": val[0]}
        # metrics.csv's row 0, x_0's checkpoint, summary.json's initial accuracy (and diagnostics), ...
        clients = sim.evaluate_clients(self.state.x, self.state.clients) if cfg.eval_per_client else {}
        self.callbacks.on_evaluation(0, {"accuracy": acc, "loss": loss, "rolling_accuracy": acc, **valid, **diag,
                                         **clients, **self._epsilon(0)})
        if self.prep.pretrain is not None:
            self.log(f"{cfg.name}: pretrained on D0, test accuracy {acc:.4f}")

    def _validation(self, done: int, state: RunState) -> dict[str, float]:
        """metrics.csv's ``val_accuracy``, ``val_loss`` and ``rolling_val_accuracy`` of the model after round
        ``done`` (the rolling mean over the window of ``rolling_accuracy``); empty without a validation set."""
        val = self.sim.evaluate_validation(state.x, state.clients)
        if val is None:
            return {}
        roll = self._rolled(self.val_window, done, val[0])
        return {"val_accuracy": val[0], "val_loss": val[1], "rolling_val_accuracy": roll}

    def _rolled(self, window: deque, done: int, value: float) -> float:
        """``value`` of round ``done`` appended to ``window``; the window's rolling mean (``metrics.rolling``)."""
        window.append((done, value))
        return float(metrics.rolling([r for r, _ in window], [a for _, a in window], self.cfg.rolling_window)[-1])

    def _epsilon(self, done: int) -> dict[str, float]:
        """metrics.csv's ``epsilon``: DP's ε after ``done`` rounds at δ (empty without privacy)."""
        budget = self.prep.privacy
        return {} if budget is None else {"epsilon": budget.epsilon(done)}

    def wall(self) -> float:
        return self.wall0 + time.perf_counter() - self.t_start

    def current(self) -> tuple[RunState | None, float]:
        """The run's state after its last recorded round (None before x_0) and its wall time so far."""
        return self.state, self.wall()

    def needs_eval(self, done: int) -> bool:
        """Whether the model after round ``done`` is evaluated (and recorded)."""
        c = self.cfg
        return c.evaluates(done) or bool(c.diag_every and done % c.diag_every == 0)

    def record(self, t: int, state: RunState, info: RoundInfo, evaluated: tuple[float, float] | None) -> bool:
        """Keep round t's result; False when the run diverged and must stop (``DivergenceGuard``). A callback's
        ``StopRun`` is raised again once the round is recorded whole (its row, its checkpoint)."""
        cfg, sim = self.cfg, self.sim
        self.state, self.done, stopped = state, t + 1, None
        done = self.done
        measured = {"wall_time": round(self.wall(), 4), "gamma": info.gamma, "cos_theta": info.cos_theta,
                    "comm_params": info.comm_params}
        if evaluated is not None:
            acc, loss = evaluated
            if stop := self.guard.not_finite(done, loss):
                self.log(stop)
                return False
            diag = cfg.diag_every and done % cfg.diag_every == 0
            scores = {"accuracy": acc, "loss": loss, "rolling_accuracy": self._rolled(self.window, done, acc),
                      **self._validation(done, state),
                      **(sim.evaluate_clients(state.x, state.clients) if cfg.eval_per_client else {}),
                      **(asdict(measure(sim.fm, state.x, sim.fed)) if diag else {})}
            try:
                self.callbacks.on_evaluation(done, scores)
            except StopRun as e:
                stopped = e
            measured.update(scores)
            measured.update(self._epsilon(done))  # on the rows written only: an accountant call each (cached)
        self.callbacks.on_round_end(done, measured)  # metrics.csv's row, the checkpoint, the progress, the trackers
        if stopped is not None:
            self.log(f"{cfg.name}: stopped after round {done}: {stopped.reason}")
            try:
                raise stopped
            finally:  # the exception's traceback holds this frame: no reference back to it (a cycle of the run)
                stopped = None
        if evaluated is not None and (stop := self.guard.observe(done, loss)):
            self.log(stop)
            return False
        return True

    def finish(self, status: str) -> dict:
        """Close the run with ``status``: summary.json, then ``on_run_end`` (a last checkpoint unless completed)."""
        self.bar.close()
        tuned = None
        if status == "completed" and self.state is not None:
            # after round T only (server.finetune_epochs)
            tuned = finetune(self.sim, self.cfg, self.state.x, self.state.clients)
            if tuned is not None:
                self.log(f"{self.cfg.name}: fine-tuned on D0 for {tuned['finetune']['epochs']} epochs: test "
                         f"accuracy {tuned['final_accuracy_finetuned']:.4f}")
        summary = self.summary.write(status, self.done, self.wall(), tuned)
        self.callbacks.on_run_end(summary)
        # the checkpoint callback holds self.current: without it the session (its simulator, data and models) is
        # freed when the caller lets go, not at the next full garbage collection (rare in a long study)
        self.callbacks = CallbackList([])
        if self.state is not None and isinstance(self.state.clients, ClientStore):
            # its file is a working copy: the checkpoint holds the rows a resumed run rebuilds it from
            self.state.clients.close(remove=True)
        if status == "interrupted":
            # a run of a group resumes with its group (whose other runs may be unfinished too)
            group = self.rd.path.parent
            target = group if is_group(group) else self.rd.path
            self.log(f"{self.cfg.name}: interrupted after round {self.done}; continue with: fedsl resume {target}")
        return summary


def refuse_group(cfg: RunConfig) -> None:
    """A config with variants, a sweep or a list of seeds is a group of runs (``compare.run_group``, what `fedsl run`
    runs), not one run: refused in one line rather than run as its top level alone."""
    what = [f"variants {', '.join(cfg.variants)}"] if cfg.variants else []
    what += [f"a sweep over {', '.join(cfg.sweep)}"] if cfg.sweep else []
    what += [f"seeds = {cfg.seeds}"] if cfg.seeds else []
    if what:
        raise ConfigError(f"config {cfg.name!r} is a group of runs ({'; '.join(what)}) and run() runs one: expected "
                          "fedsl.sweeps.compare.run_group(cfg, out) for all of them, as `fedsl run` runs it, or "
                          "one of them: fedsl.config.expand.expand_variants(cfg)[RUN_NAME]")


def run(cfg: RunConfig, out: str | Path, *, resume: bool = False, log: Log = print,
        progress: bool | None = None, stop_after: int | None = None, built: Built | None = None,
        callbacks: Sequence[Callback] = ()) -> dict:
    """Run ``cfg`` into folder ``out`` (or continue it with ``resume``); returns summary.json's content.

    ``stop_after`` ends the process's work after that many rounds in this call (tests use it
    to simulate interruptions); the run stays resumable. ``built``: what ``build.check`` built of it.
    ``callbacks``: told of the run's start, evaluations, rounds and end (``fedsl.runs.callbacks``),
    after the run's files, the progress and the trackers of ``cfg.tracking``.
    """
    s = RunSession(cfg, out, resume=resume, log=log, progress=progress, built=built, callbacks=callbacks)
    status = "running"
    try:
        s.begin()
        for t in range(s.start, cfg.rounds):
            if stop_after is not None and s.done - s.start >= stop_after:
                status = "interrupted"
                break
            state, info = s.sim.round(s.state, t)
            if not s.record(t, state, info, s.sim.evaluate(state.x, state.clients) if s.needs_eval(t + 1) else None):
                status = "diverged"
                break
        else:
            status = "completed"
    except StopRun as e:  # a callback ended the run (a pruned trial): recorded whole, closed with its status
        status = e.status
    except KeyboardInterrupt:
        s.finish("interrupted")
        raise
    except BaseException:
        s.finish("failed")
        raise
    finally:
        getattr(s.sim.executor, "close", lambda: None)()  # executor = 'processes': its workers end with the run
    return s.finish(status)


def run_stacked(cfgs: list[RunConfig], outs: list[str | Path], *, resume: bool = False, log: Log = print,
                progress: bool | None = None, stop_after: int | None = None,
                built: list[Built | None] | None = None,
                callbacks: list[Sequence[Callback]] | None = None) -> list[dict]:
    """Run several configs in lock-step with a ``StackedSimulator``: one executor call per round
    for all their clients. Each run keeps its own folder, checkpoints and summary, exactly as
    ``run`` would write them; a run that diverges leaves the stack and the others go on.

    The runs must be stackable (same model, algorithm kind, device, rounds) and start at the
    same round (all new, or all resumed from the same checkpoint round). ``built``: what
    ``build.check`` built of each (or None); ``callbacks``: each run's own callbacks (as ``run``'s; one that
    raises ``StopRun`` ends its run alone).
    """
    if len(cfgs) != len(outs) or not cfgs:
        raise ValueError(f"run_stacked needs as many output folders as configs, got {len(cfgs)} and {len(outs)}")
    pools: list[Federation] = []
    sessions = [RunSession(c, o, resume=resume and RunDir(o).is_run(), log=log, progress=False,
                           prep=prepare(c, pools, b), callbacks=cb)
                for c, o, b, cb in zip(cfgs, outs, built or [None] * len(cfgs), callbacks or [()] * len(cfgs))]
    starts = {s.start for s in sessions}
    if len(starts) > 1 or len({c.rounds for c in cfgs}) > 1:
        raise ValueError(f"stacked runs must start at one round and share T, got starts {sorted(starts)} "
                         f"and rounds {sorted({c.rounds for c in cfgs})}")
    start, rounds = starts.pop(), cfgs[0].rounds
    active = list(sessions)
    results: dict[int, dict] = {}
    stacked = StackedSimulator([s.sim for s in active])
    for s in active:
        s.begin()  # x_0 of the new runs (pretraining, initial accuracy); resumed runs have theirs
    last = start
    try:
        for t in range(start, rounds):
            if stop_after is not None and t - start >= stop_after:
                break
            states, infos = stacked.round([s.state for s in active], t)
            if t + 1 < rounds and (stop_after is None or t + 1 - start < stop_after):
                stacked.prepare(t + 1)  # the next round's host work, while the device still computes this one
            need = [i for i, s in enumerate(active) if s.needs_eval(t + 1)]
            evals = dict(zip(need, stacked.evaluate([states[i].x for i in need], need,
                                                     [states[i].clients for i in need]))) if need else {}
            keep = []
            for i, s in enumerate(active):
                try:
                    kept = s.record(t, states[i], infos[i], evals.get(i))
                except StopRun as e:  # this run alone ends (a pruned trial); the others go on
                    results[id(s)] = s.finish(e.status)
                    continue
                if kept:
                    keep.append(s)
                else:
                    results[id(s)] = s.finish("diverged")
            if len(keep) < len(active) and keep:
                stacked = StackedSimulator([s.sim for s in keep])
            active, last = keep, t + 1
            if not active:
                break
        status = "completed" if last >= rounds else "interrupted"
        for s in active:
            results[id(s)] = s.finish(status)
    except KeyboardInterrupt:
        for s in active:
            results[id(s)] = s.finish("interrupted")
        raise
    except BaseException:
        for s in active:
            results[id(s)] = s.finish("failed")
        raise
    log(f"stacked {len(sessions)} runs ({stacked.executor.name} executor): "
        + ", ".join(f"{s.rd.path.name} {results[id(s)]['status']}" for s in sessions))
    return [results[id(s)] for s in sessions]
