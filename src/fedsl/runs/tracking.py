"""Trackers: callbacks that follow a run in TensorBoard or MLflow, written under the run's folder, offline.

    tracking = ["tensorboard"]  writes RUN/tensorboard/events.out.tfevents.*   see: tensorboard --logdir RUN (or group)
    tracking = ["mlflow"]       writes RUN/mlflow.db (a local SQLite store)
                                see: mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db (needs the full `mlflow`)

(or ``fedsl run --track tensorboard``). Each needs its optional package: ``pip install 'fedsl[tensorboard]'``,
``pip install 'fedsl[mlflow]'``. A scalar is logged per metric under metrics.csv's column name
(``accuracy``, ``loss``, ``rolling_accuracy``, ``gamma``, ``cos_theta``, ``comm_params``, ``wall_time``, and
the diagnostics ``xi2``, ``G2``, ``cos_F_f0``), at step = the round (0: the initial model x_0); evaluated
metrics at the evaluated rounds, the others every round (where measured).

MLflow: MLflow 3 refuses its plain-folder store ('./mlruns', "maintenance mode") unless an environment
variable opts in, so the store is MLflow's own local alternative, one SQLite file per run. Nothing goes over
the network: no tracking server, and MLflow's usage telemetry is switched off (``MLFLOW_DISABLE_TELEMETRY``,
unless set otherwise) before mlflow is imported.

Resume (``fedsl resume``): the trackers continue the same TensorBoard log and the same MLflow run.
Rounds after the last checkpoint that the interrupted process had logged are run again; TensorBoard
hides the earlier copies (the resumed log starts with a restart marker at the first rerun round, which
TensorBoard's readers honour: ``purge_step``), MLflow keeps the earlier copy of each (metric, round) and
does not log it again (its store cannot delete points). A CPU run resumes bit for bit, so both hold the
same numbers as metrics.csv; a resumed CUDA run without ``deterministic = true`` may differ in the last
bits there. Both reach the disk at each evaluated round and every few seconds in between, so a process
killed outright (kill -9) may leave out the ``gamma``/``wall_time`` of the unevaluated rounds just before its
last checkpoint (those are not run again).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sqlite3
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from fedsl.config.schema import ConfigError
from fedsl.runs.callbacks import Callback, RunStart

# tracker name (= the extra that installs it) -> the modules it imports (MLflow's SQLite store: SQLAlchemy, alembic)
PACKAGES = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sqlalchemy", "alembic")}
FLUSH_SECONDS = 5.0  # how often unevaluated rounds' metrics reach the disk (evaluated rounds: at once)


def require(names: Sequence[str]) -> None:
    """ConfigError (one line, naming the extra to install) when a tracker's package is missing."""
    for name in names:
        if name not in PACKAGES:
            raise ConfigError(f"tracking = {list(names)!r}: unknown tracker {name!r}; "
                              "expected 'tensorboard' or 'mlflow'")
        for module in PACKAGES[name]:
            if importlib.util.find_spec(module) is None:
                raise ConfigError(f"tracking = {list(names)!r}: {name!r} needs the {module} package, which is not "
                                  f"installed here: pip install 'fedsl[{name}]'")


def trackers(names: Sequence[str]) -> list[Callback]:
    """The callbacks of ``tracking = names`` (duplicates once)."""
    names = list(dict.fromkeys(names))
    require(names)
    kinds = {"tensorboard": TensorBoardCallback, "mlflow": MLflowCallback}
    return [kinds[n]() for n in names]


def _scalars(metrics: dict[str, Any], skip: set[str] = frozenset()) -> dict[str, float]:
    """The numbers of ``metrics`` (not None, not strings), less ``skip``."""
    return {k: float(v) for k, v in metrics.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)}


class _Split(Callback):
    """Logs each evaluation's metrics at its evaluation, and at round end only the round's other numbers; asks
    for a flush to the disk after each evaluated round (and x_0's evaluation)."""

    def __init__(self) -> None:
        self._evaluated: tuple[int, set[str]] = (-1, set())

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        self._evaluated = (round, set(metrics))
        self.log(round, _scalars(metrics), flush=round == 0)  # rounds 1..T: flushed at their round end

    def on_round_end(self, round: int, metrics: dict[str, Any]) -> None:
        r, keys = self._evaluated
        self.log(round, _scalars(metrics, keys if r == round else set()), flush=r == round)

    def log(self, step: int, values: dict[str, float], flush: bool) -> None:
        raise NotImplementedError


class TensorBoardCallback(_Split):
    """TensorBoard event files in ``RUN/tensorboard`` (``log_dir`` to choose another folder)."""

    def __init__(self, log_dir: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.log_dir, self.writer = log_dir, None

    def on_run_start(self, run: RunStart) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            require(["tensorboard"])
            raise
        log_dir = self.log_dir if self.log_dir is not None else run.out / "tensorboard"
        # resumed: a restart marker at the first round this process logs, so that TensorBoard hides what
        # the interrupted process logged from there on (it is logged again)
        self.writer = SummaryWriter(str(log_dir), purge_step=run.first_round if run.resumed else None,
                                    flush_secs=int(FLUSH_SECONDS))
        if not run.resumed:
            rows = "\n".join(f"| {k} | {v} |" for k, v in run.hyperparameters.items())
            self.writer.add_text("hyperparameters", f"| symbol | value |\n|---|---|\n{rows}", 0)

    def log(self, step: int, values: dict[str, float], flush: bool) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        if flush:
            self.writer.flush()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


_MLFLOW_KEY = re.compile(r"[^\w.\- /]")  # characters MLflow refuses in a param or metric name


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow's import warnings and its database set-up's INFO lines are not the run's business."""
    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _params(config: dict[str, Any], hyperparameters: dict[str, Any]) -> dict[str, str]:
    """The run's parameters for MLflow: the config's scalar keys, dotted, and the resolved hyper-parameters."""
    out: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            elif v is None or isinstance(v, (bool, int, float, str)):
                out[f"{prefix}{k}"] = str(v)[:500]

    walk("", {k: v for k, v in config.items() if k not in ("paper", "claims", "quick", "variants", "sweep")})
    for symbol, value in hyperparameters.items():
        out[f"hp.{_MLFLOW_KEY.sub('_', symbol)}"] = str(value)
    return {k: v for k, v in out.items() if not _MLFLOW_KEY.search(k)}


# An empty MLflow store, as MLflow's migrations made it for this process's first run (in memory): the next
# runs' stores start as copies of it rather than migrating again (the migrations are the slow part).
_empty_store: sqlite3.Connection | None = None


def _copy_sqlite(src: sqlite3.Connection | str, dst: sqlite3.Connection | str) -> sqlite3.Connection:
    """Copy an SQLite database (a consistent snapshot: SQLite's backup API); returns the destination."""
    a = src if isinstance(src, sqlite3.Connection) else sqlite3.connect(src)
    b = dst if isinstance(dst, sqlite3.Connection) else sqlite3.connect(dst, check_same_thread=False)
    a.backup(b)
    for c in (a, b):
        if c is not src and c is not dst:
            c.close()
    return b


class MLflowCallback(_Split):
    """One MLflow run (experiment ``fedsl``) in a local SQLite store, ``RUN/mlflow.db`` (``db`` to choose another
    file); params: the config's keys and the resolved hyper-parameters (η_l, η_g, γ, K0, n0, ...)."""

    def __init__(self, db: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.db, self.client, self.run_id = db, None, None
        self.logged: dict[str, int] = {}  # metric -> last round already in the store (a resumed run skips those)
        self.pending: list = []
        self.last_flush = 0.0

    def on_run_start(self, run: RunStart) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when mlflow is imported: no network
        try:
            with _quiet_mlflow():
                from mlflow.tracking import MlflowClient
        except ImportError:
            require(["mlflow"])
            raise
        global _empty_store
        db = os.path.abspath(self.db if self.db is not None else run.out / "mlflow.db")
        fresh = not os.path.exists(db)
        if fresh and _empty_store is not None:
            _copy_sqlite(_empty_store, db)
        with _quiet_mlflow():
            self.client = c = MlflowClient(tracking_uri=f"sqlite:///{db}")
            if fresh and _empty_store is None:
                _empty_store = _copy_sqlite(db, sqlite3.connect(":memory:", check_same_thread=False))
            exp = c.get_experiment_by_name("fedsl")
            exp_id = exp.experiment_id if exp is not None else c.create_experiment(
                "fedsl", artifact_location=f"file:{os.path.dirname(db)}/mlflow-artifacts")  # never the cwd's ./mlruns
            found = c.search_runs([exp_id], max_results=1) if run.resumed else []
        if found:  # the same MLflow run goes on; what it holds already is not logged twice
            self.run_id = found[0].info.run_id
            c.update_run(self.run_id, status="RUNNING")
            for key in found[0].data.metrics:
                self.logged[key] = max(m.step for m in c.get_metric_history(self.run_id, key))
        else:
            self.run_id = c.create_run(exp_id, run_name=run.name, tags={"fedsl.out": str(run.out)}).info.run_id
            from mlflow.entities import Param
            params = [Param(k, v) for k, v in _params(run.config, run.hyperparameters).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                c.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step: int, values: dict[str, float], flush: bool) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.pending += [Metric(k, v, now, step) for k, v in values.items()
                         if step > self.logged.get(k, -1)]
        # one database transaction per evaluated round (or every few seconds), not per round
        if flush or time.monotonic() - self.last_flush > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        for i in range(0, len(self.pending), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=self.pending[i:i + 1000])
        self.pending, self.last_flush = [], time.monotonic()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        if self.client is None:
            return
        self.flush()
        status = summary.get("status")
        self.client.set_tag(self.run_id, "fedsl.status", str(status))  # 'diverged' is FAILED to MLflow
        self.client.set_terminated(self.run_id, status={"completed": "FINISHED", "interrupted": "KILLED"}.get(status,
                                                                                                         "FAILED"))
        self.client = None
