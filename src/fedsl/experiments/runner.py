"""Run one configured experiment: build data, model and algorithm, loop rounds, store results.

This is where I/O, logging and checkpoints live; the rounds themselves are the
simulator's (``fedsl.engine.simulator``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from fedsl.algorithms import Algorithm, Pretraining
from fedsl.core import threads
from fedsl.core.privacy_accounting import Budget
from fedsl.core.types import Params
from fedsl.data.datasets import build_federation
from fedsl.data.federation import Federation
from fedsl.engine import metrics
from fedsl.engine.diagnostics import measure
from fedsl.engine.executors import make_executor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import RoundInfo, RunState, Simulator
from fedsl.engine.stacked import StackedSimulator, same_tensor
from fedsl.experiments import tracking
from fedsl.experiments.callbacks import Callback, CallbackList, MetricsFile, RunStart
from fedsl.experiments.config import ConfigError, RunConfig
from fedsl.experiments.placement import resolve_device, tables_on_host
from fedsl.experiments.progress import RunProgress
from fedsl.experiments.resolve import Setting, format_hparams, privacy_budget, resolve
from fedsl.experiments.results import RunDir, is_group
from fedsl.models import build_model

Log = Callable[[str], None]


@dataclass
class Prepared:
    cfg: RunConfig
    fed: Federation
    sim: Simulator
    algorithm: Algorithm
    pretrain: Pretraining | None
    hparams: list[Setting]
    device: torch.device
    privacy: Budget | None = None  # the DP accounting (privacy.clip set): ε per row of metrics.csv, summary.json


def finetune(sim: Simulator, cfg: RunConfig, x: Params) -> dict | None:
    """The 'FedAvg, then fine-tune on D0' control: ``server.finetune_epochs`` epochs of SGD on D0 from the
    final model ``x`` (step ``server.finetune_lr``, default η_l; batches of B0 = ``server.batch_size`` or B, at
    most n0), then one test evaluation. The summary fields it gives (None: no fine-tuning configured)."""
    s, a = cfg.server, cfg.algorithm
    if not s.finetune_epochs:
        return None
    lr = s.finetune_lr or a.local_lr
    batch = min(s.batch_size or a.batch_size, sim.fed.n0)
    acc, loss = sim.evaluate(sim.finetune(x, s.finetune_epochs, lr, batch))
    return {"final_accuracy_finetuned": acc, "final_loss_finetuned": loss,
            "finetune": {"epochs": s.finetune_epochs, "lr": lr, "batch_size": batch}}


def make_model(cfg: RunConfig, fed: Federation) -> FunctionalModel:
    """The configured model as a pure function; a model the engine cannot run is a ConfigError."""
    try:
        return FunctionalModel(build_model(cfg.model.name, fed.num_classes, fed.input_shape, cfg.seed, cfg.model.init))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_representation(cfg: RunConfig, algorithm: Algorithm, fm: FunctionalModel) -> None:
    """A rule whose local loss reads the model's representation z (MOON) needs a model that exposes one."""
    if algorithm.spec is not None and algorithm.spec.needs_representation and not fm.has_representation:
        raise ConfigError(f"algorithm.name = {cfg.algorithm.name!r} reads the model's representation, but model.name = "
                          f"{cfg.model.name!r} has none: expected a model with methods features(x) -> z and "
                          "head(z) -> logits (the built-in mlp, small_cnn, cifar_cnn, emnist_cnn; not linear)")


@dataclass
class Built:
    """What ``check`` built of a run, on the CPU, for ``prepare`` to take over (once: ``prepare``
    moves the model to the run's device and dtype), so that a checked run is built only once."""
    fed: Federation
    algorithm: Algorithm
    pretrain: Pretraining | None
    hparams: list[Setting]
    fm: FunctionalModel

    def nbytes(self) -> int:
        """Memory it holds beyond the data pool that runs share: the model and the index arrays."""
        model = sum(p.numel() * p.element_size() for p in self.fm.module.parameters())
        return model + sum(c.nbytes for c in self.fed.clients) + self.fed.server.nbytes


# How much a sweep's checks keep for its runs to take over (the first runs' builds; the others
# are built again by ``prepare``, cheaply: decoded data and its tensors are memoised per process).
KEEP_BYTES = 256 * 2**20


def check(cfg: RunConfig, _models_seen: set | None = None, *, keep: bool = False) -> Built | None:
    """Every check that needs the data or the model (sizes, batch vs client data, n0), without training.

    ``_models_seen``: (model, init, classes, input shape) already built by earlier checks of
    the same sweep; a model is built once per such key, not once per run (40,000 runs).
    ``keep``: return what was built (the run's federation, algorithm and seeded model), for
    ``prepare(cfg, built=...)``.
    """
    resolve_device(cfg.device, cfg.compile)
    tracking.require(cfg.tracking)
    fed = build_federation(cfg.data, cfg.seed)
    algorithm, pretrain, hp = resolve(cfg, fed)
    key = (cfg.model.name, cfg.model.init, fed.num_classes, tuple(fed.input_shape))
    fm = None
    if keep or _models_seen is None or key not in _models_seen:
        fm = make_model(cfg, fed)
        if _models_seen is not None:
            _models_seen.add(key)
    if algorithm.spec is not None and algorithm.spec.needs_representation:
        check_representation(cfg, algorithm, fm or make_model(cfg, fed))
    return Built(fed, algorithm, pretrain, hp, fm) if keep else None


def check_all(runs: dict[str, RunConfig], progress: Callable[[int], None] | None = None,
              keep_bytes: int = KEEP_BYTES) -> dict[str, Built]:
    """``check`` every run of a sweep before any work; returns what the checks built for the first
    runs (up to about ``keep_bytes``), by run name, for ``run_group(..., built=...)``.

    ``progress(i)`` is called after the i-th run's check.
    """
    models: set = set()
    built: dict[str, Built] = {}
    left = keep_bytes
    for i, (name, cfg) in enumerate(runs.items(), 1):
        b = check(cfg, models, keep=left > 0)
        if b is not None:
            built[name] = b
            left -= b.nbytes()
        if progress is not None:
            progress(i)
    return built


def prepare(cfg: RunConfig, pools: list[Federation] | None = None, built: Built | None = None) -> Prepared:
    """Data, model, algorithm and simulator of ``cfg``.

    ``pools`` (stacked runs): federations prepared before; a pool or test set equal to
    one of theirs is shared rather than held twice (a CIFAR-10 pool is 600 MB).
    ``built``: what ``check(cfg, keep=True)`` built (taken over, not built again).
    """
    device = resolve_device(cfg.device, cfg.compile)
    dtype = getattr(torch, cfg.dtype)
    # process-wide: with other work on the cores, spinning OpenMP threads wait on each other
    # (measured: 2 threads 10x slower than 1 on a loaded 2-core machine); 0 = a safe automatic number
    threads.apply(cfg.threads)
    if device.type == "cuda":
        # cuDNN's fastest convolution backward accumulates with atomics: results then agree
        # to rounding only, run to run; deterministic algorithms make them bit-identical.
        torch.backends.cudnn.deterministic = cfg.deterministic
        torch.backends.cudnn.benchmark = not cfg.deterministic
    if built is None:
        fed = build_federation(cfg.data, cfg.seed)
        algorithm, pretrain, hp = resolve(cfg, fed)
        fm = make_model(cfg, fed)
    else:
        fed, algorithm, pretrain, hp, fm = built.fed, built.algorithm, built.pretrain, built.hparams, built.fm
    check_representation(cfg, algorithm, fm)
    fm.module.to(device=device, dtype=dtype)
    executor = make_executor(cfg.executor, fm, device, cfg.compile)
    on_device = fed.to(device, dtype)
    if pools is not None:
        on_device = _share_tensors(on_device, pools)
    d = sum(p.numel() for p in fm.module.parameters())
    sim = Simulator(fm, on_device, algorithm, executor, cfg.algorithm.clients_per_round, cfg.seed,
                    cfg.eval_batch_size, cfg.eval_precision, tables_on_host(cfg, device, algorithm, fed.num_clients, d),
                    cfg.participation, cfg.byzantine)
    return Prepared(cfg, fed, sim, algorithm, pretrain, hp, device, privacy_budget(cfg, fed))


def _share_tensors(fed: Federation, pools: list[Federation]) -> Federation:
    """``fed`` with its pool and test set replaced by equal tensors of ``pools`` (then added to them)."""
    x, y, xt, yt = fed.x, fed.y, fed.x_test, fed.y_test
    for p in pools:
        if same_tensor(p.x, x) and same_tensor(p.y, y):
            x, y = p.x, p.y
        if same_tensor(p.x_test, xt) and same_tensor(p.y_test, yt):
            xt, yt = p.x_test, p.y_test
    fed = replace(fed, x=x, y=y, x_test=xt, y_test=yt)
    pools.append(fed)
    return fed


def _without_tables(state: RunState) -> RunState:
    """``state`` less its clients' tables: what a checkpoint of a run that nothing resumes keeps."""
    return RunState(state.x, state.algo, state.gamma)


class RunSession:
    """One run's bookkeeping around the rounds: its folder, checkpoints, metrics, summary, progress.

    ``run`` drives one session with its own simulator; ``run_stacked`` drives several in
    lock-step with a ``StackedSimulator``. Either way a session decides when to evaluate,
    records each finished round, and keeps every finished round resumable.
    """

    def __init__(self, cfg: RunConfig, out: str | Path, *, resume: bool, log: Log, progress: bool | None,
                 prep: Prepared | None = None, built: Built | None = None, callbacks: Sequence[Callback] = ()) -> None:
        self.cfg, self.log = cfg, log
        self.rd = rd = RunDir(out)
        for p in rd.remove_stale_tmp():
            log(f"{cfg.name}: removed {p.name}, left by a write that was killed")
        self.prep = prep = prep or prepare(cfg, built=built)
        self.sim = sim = prep.sim
        self.start, self.wall0, history = 0, 0.0, []
        self.state: RunState | None = None
        if resume:
            started = rd.read_summary().get("threads")
            if not cfg.threads and isinstance(started, int) and 0 < started != torch.get_num_threads():
                # automatic threads follow the machine's load, and float sums (so results, to the last
                # bit) follow the thread count: the resumed rounds use the count the run started with
                torch.set_num_threads(started)
            ckpt = rd.load_checkpoint()
            if ckpt is not None:
                self.start, self.wall0 = ckpt.round, float(ckpt.extra.get("wall_time", 0.0))

                def dev(d, device=prep.device):
                    return {k: dev(v, device) if isinstance(v, dict) else v.to(device=device, dtype=sim.dtype)
                            for k, v in d.items()}

                s = ckpt.state  # the clients' tables where the simulator keeps them (they may live in host memory)
                self.state = RunState(dev(s.x), dev(s.algo), s.gamma, dev(s.clients, sim.tables_device))
                history = rd.truncate_metrics(self.start)
            elif rd.is_run():
                rd.truncate_metrics(-1)  # no checkpoint (checkpoint_every = 0): the run starts over, round 0 too
            log(f"{cfg.name}: resuming at round {self.start + 1} of {cfg.rounds}")
        else:
            rd.create(cfg.model_dump())
        fed = prep.fed
        log(f"{cfg.name}: {prep.algorithm.name} on {cfg.data.dataset} — N={fed.num_clients}, n={fed.n}, "
            f"n0={fed.n0}, test={len(fed.y_test)}, {cfg.rounds} rounds, {sim.executor.name} executor on {prep.device}\n"
            + format_hparams(prep.hparams))
        self.summary = rd.read_summary() if resume else {}
        self.summary.update({
            "name": cfg.name, "algorithm": prep.algorithm.name, "dataset": cfg.data.dataset, "seed": cfg.seed,
            "rounds": cfg.rounds, "device": str(prep.device), "executor": sim.executor.name,
            "threads": torch.get_num_threads(),
            "server_data": {"size": fed.n0, "class_histogram": fed.server_histogram()},
            "test_data": {"size": len(fed.y_test),
                          "class_histogram": torch.bincount(fed.y_test.cpu(), minlength=fed.num_classes).tolist()},
            "inputs": {"normalize": cfg.data.normalize,
                       **({"mean": fed.input_stats[0], "std": fed.input_stats[1]} if fed.input_stats else {})},
            "model_init": cfg.model.init,
            "hyperparameters": {h.symbol: {"value": h.value, "source": h.source} for h in prep.hparams},
        })
        if cfg.attack.kind != "none":  # who was malicious: ⌊f·N⌋ ids, the same every round
            self.summary["attack"] = {"kind": cfg.attack.kind, "fraction": cfg.attack.fraction,
                                      "malicious_count": len(sim.malicious), "malicious": sim.malicious.tolist()}
        # round 0 (x_0's accuracy) is a row of metrics.csv for the curves, but not part of the
        # paper's metrics (rolling, final accuracy, rise time, T_a), which are over rounds 1..T
        self.rounds = [int(r["round"]) for r in history if r["round"] > 0]
        self.accs = [r["accuracy"] for r in history if r["round"] > 0]
        # divergence: the loss bound is relative to x_0's loss (or chance's, ln L, if larger)
        self.loss_bound = math.inf
        if history and history[0]["round"] == 0:
            self._set_loss_bound(history[0]["loss"])
        self.above = 0  # consecutive evaluations above the bound (counted again from the kept rows)
        for r in history[1:]:
            self.above = self.above + 1 if r["loss"] > self.loss_bound else 0
        self.done = self.start
        self.t_start = time.perf_counter()
        self.bar = RunProgress(cfg.name, cfg.rounds, self.start, log,
                             sys.stdout.isatty() if progress is None else progress)
        # metrics.csv and the progress first, then the config's trackers, then the caller's callbacks
        self.callbacks = CallbackList([MetricsFile(rd), self.bar, *tracking.trackers(cfg.tracking), *callbacks])
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
        acc, loss = sim.evaluate(self.state.x)
        self.summary["initial_accuracy"] = acc
        self._set_loss_bound(loss)
        diag = asdict(measure(sim.fm, self.state.x, sim.fed)) if cfg.diag_every else {}
        if diag:
            self.summary["initial_diagnostics"] = diag
        self.callbacks.on_evaluation(0, {"accuracy": acc, "loss": loss, "rolling_accuracy": acc, **diag,
                                         **self._epsilon(0)})
        if self.prep.pretrain is not None:
            self.log(f"{cfg.name}: pretrained on D0, test accuracy {self.summary['initial_accuracy']:.4f}")
        if cfg.checkpoint_every:
            self.rd.save_checkpoint(0, self.state, 0.0)

    def _epsilon(self, done: int) -> dict[str, float]:
        """metrics.csv's ``epsilon``: DP's ε after ``done`` rounds at δ (empty without privacy)."""
        budget = self.prep.privacy
        return {} if budget is None else {"epsilon": budget.epsilon(done)}

    def _set_loss_bound(self, initial_loss: float) -> None:
        f = self.cfg.diverge_loss
        chance = math.log(self.prep.fed.num_classes)
        self.loss_bound = f * max(initial_loss, chance) if f > 0 and math.isfinite(initial_loss) else math.inf

    def wall(self) -> float:
        return self.wall0 + time.perf_counter() - self.t_start

    def needs_eval(self, done: int) -> bool:
        """Whether the model after round ``done`` is evaluated (and recorded)."""
        c = self.cfg
        return c.evaluates(done) or bool(c.diag_every and done % c.diag_every == 0)

    def record(self, t: int, state: RunState, info: RoundInfo, evaluated: tuple[float, float] | None) -> bool:
        """Keep round t's result; False when the run diverged and must stop: a non-finite loss, or a
        loss above ``loss_bound`` for ``diverge_patience`` evaluations in a row."""
        cfg, sim = self.cfg, self.sim
        self.state, self.done = state, t + 1
        done = self.done
        measured = {"wall_time": round(self.wall(), 4), "gamma": info.gamma, "cos_theta": info.cos_theta,
                    "comm_params": info.comm_params}
        if evaluated is not None:
            acc, loss = evaluated
            if not math.isfinite(loss):
                self.log(f"{cfg.name}: loss is {loss} at round {done}: stopping (status 'diverged')")
                return False
            self.rounds.append(done)
            self.accs.append(acc)
            w = cfg.rolling_window  # the window holds at most its last w evaluations (distinct rounds)
            roll = metrics.rolling(self.rounds[-w:], self.accs[-w:], w)[-1]
            diag = cfg.diag_every and done % cfg.diag_every == 0
            scores = {"accuracy": acc, "loss": loss, "rolling_accuracy": float(roll),
                      **(asdict(measure(sim.fm, state.x, sim.fed)) if diag else {})}
            self.callbacks.on_evaluation(done, scores)
            measured.update(scores)
            measured.update(self._epsilon(done))  # on the rows written only: an accountant call each (cached)
        self.callbacks.on_round_end(done, measured)  # metrics.csv's row, the progress, the trackers
        if evaluated is not None:
            self.above = self.above + 1 if loss > self.loss_bound else 0
            if self.above >= cfg.diverge_patience:
                self.log(f"{cfg.name}: loss {loss:.4g} above {self.loss_bound:.4g} (diverge_loss × initial loss) for "
                         f"{self.above} evaluations at round {done}: stopping (status 'diverged')")
                return False
        if done == cfg.rounds:
            # the run is over and nothing resumes a finished run: its clients' tables (N × d each, 2.2 GB for
            # SCAFFOLD on 1,000 CIFAR clients; 262 GB for Fig. 5's 120 SCAFFOLD/FedDyn runs) are not kept
            self.rd.save_checkpoint(done, _without_tables(state), self.wall())
        elif cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
            try:
                self.rd.save_checkpoint(done, state, self.wall())
            except OSError as e:  # a full disk costs resume granularity, not the rounds in memory: train on
                self.log(f"{cfg.name}: could not write the checkpoint of round {done} ({e}); training goes on, "
                         f"an interruption resumes from round {self.rd.checkpoint_round() or 0}")
        return True

    def finish(self, status: str) -> dict:
        """Close the run with ``status``: a last checkpoint unless completed, summary.json, ``on_run_end``."""
        self.bar.close()
        if status != "completed" and self.state is not None:  # keep finished rounds resumable; a diverged
            # run is never resumed (FINISHED), so it keeps no clients' tables either
            state = _without_tables(self.state) if status == "diverged" else self.state
            try:
                self.rd.save_checkpoint(self.done, state, self.wall())
            except OSError as e:  # a full disk must not turn a Ctrl-C into a failure of the whole sweep: the
                # last checkpoint stays (written atomically), and the run resumes from it
                self.log(f"{self.cfg.name}: could not write the checkpoint of round {self.done} ({e}); "
                         "it resumes from its last checkpoint")
        self.summary.update(metrics.summarize(self.rounds, self.accs, self.cfg.rolling_window))
        if self.prep.privacy is not None:  # ε after the rounds done, with δ, z, C, q and the accountant
            self.summary["privacy"] = self.prep.privacy.record(self.done)
        if status == "completed" and self.state is not None:
            tuned = finetune(self.sim, self.cfg, self.state.x)  # after round T only (server.finetune_epochs)
            if tuned is not None:
                self.summary.update(tuned)
                self.log(f"{self.cfg.name}: fine-tuned on D0 for {tuned['finetune']['epochs']} epochs: test "
                         f"accuracy {tuned['final_accuracy_finetuned']:.4f}")
        self.summary.update({"status": status, "rounds_done": self.done, "wall_time": round(self.wall(), 3)})
        self.rd.write_summary(self.summary)
        self.callbacks.on_run_end(self.summary)
        if status == "interrupted":
            # a run of a group resumes with its group (whose other runs may be unfinished too)
            group = self.rd.path.parent
            target = group if is_group(group) else self.rd.path
            self.log(f"{self.cfg.name}: interrupted after round {self.done}; continue with: fedsl resume {target}")
        return self.summary


def run(cfg: RunConfig, out: str | Path, *, resume: bool = False, log: Log = print,
        progress: bool | None = None, stop_after: int | None = None, built: Built | None = None,
        callbacks: Sequence[Callback] = ()) -> dict:
    """Run ``cfg`` into folder ``out`` (or continue it with ``resume``); returns summary.json's content.

    ``stop_after`` ends the process's work after that many rounds in this call (tests use it
    to simulate interruptions); the run stays resumable. ``built``: what ``check`` built of it.
    ``callbacks``: told of the run's start, evaluations, rounds and end (``fedsl.experiments.callbacks``),
    after metrics.csv, the progress and the trackers of ``cfg.tracking``.
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
            if not s.record(t, state, info, s.sim.evaluate(state.x) if s.needs_eval(t + 1) else None):
                status = "diverged"
                break
        else:
            status = "completed"
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
    ``check`` built of each (or None); ``callbacks``: each run's own callbacks (as ``run``'s).
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
            evals = dict(zip(need, stacked.evaluate([states[i].x for i in need], need))) if need else {}
            keep = []
            for i, s in enumerate(active):
                if s.record(t, states[i], infos[i], evals.get(i)):
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
