"""A run's folder: resolved config, per-round metrics, summary, checkpoint.

    config.json       the validated config (``fedsl run config.json`` re-runs it)
    metrics.csv       one row per evaluated round, appended and flushed as it happens
    summary.json      status, final accuracy, rise time, T_0.5, D0, hyper-parameters
    checkpoint.pt     the run's state after a round (``fedsl.runs.checkpoint``), written atomically
                      every ``checkpoint_every`` rounds

A crash keeps every row already in metrics.csv; ``fedsl resume`` drops the rows after
the checkpoint's round and recomputes them (bit-identically: all randomness is a
function of seed and round).
"""

from __future__ import annotations

import contextlib
import csv
import json
from pathlib import Path
from typing import Any, Iterator

from fedsl.runs import checkpoint
from fedsl.runs.checkpoint import Checkpoint, CorruptCheckpoint, atomic_write  # noqa: F401 - re-exported

# gamma: γ_t of server learning; cos_theta: cos of the angle between -∇f0 and the clients' update
# (when measured); comm_params: parameters sent down and up in the round (SCAFFOLD doubles it);
# xi2, G2, cos_F_f0: the paper's non-IIDness diagnostics every diag_every rounds (fedsl.engine.diagnostics);
# epsilon: DP's ε after the round at δ (privacy.clip set; fedsl.core.privacy_accounting).
METRIC_COLUMNS = ["round", "accuracy", "loss", "rolling_accuracy", "wall_time", "gamma", "cos_theta", "comm_params",
                  "xi2", "G2", "cos_F_f0", "epsilon"]
# a run with a validation set (data.validation > 0) has these columns too, after the others: the accuracy and loss
# on the validation set and its rolling accuracy; a run without one has METRIC_COLUMNS only, as before they existed
VALIDATION_COLUMNS = ["val_accuracy", "val_loss", "rolling_val_accuracy"]
# a run with eval_per_client has these too, last: the clients' accuracies (fedsl.engine.per_client)
CLIENT_COLUMNS = ["client_acc_mean", "client_acc_std", "client_acc_worst10"]


class FolderInUse(RuntimeError):
    """Another process holds a results folder's lock."""


@contextlib.contextmanager
def folder_lock(path: str | Path) -> Iterator[None]:
    """Hold ``path/.lock`` while the block runs: a second ``fedsl run``/``resume`` on the same folder
    stops with ``FolderInUse`` instead of writing the same files. The operating system drops the
    lock when the process ends, also on kill -9, so no stale lock outlives a crash. Where ``fcntl``
    does not exist (Windows), nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUse(f"{str(path)!r} is in use by another fedsl process: wait for it to end (or stop it), "
                              "then run `fedsl resume` on it") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)



def is_group(path: str | Path) -> bool:
    """Whether ``path`` is a group folder (``fedsl run`` of variants, seeds or a sweep: it holds group.json)."""
    return (Path(path) / "group.json").is_file()

class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._columns: list[str] | None = None

    config_file = property(lambda self: self.path / "config.json")
    metrics_file = property(lambda self: self.path / "metrics.csv")
    summary_file = property(lambda self: self.path / "summary.json")
    checkpoint_file = property(lambda self: self.path / "checkpoint.pt")

    def is_run(self) -> bool:
        return self.config_file.is_file()

    def remove_stale_tmp(self) -> list[Path]:
        """Delete temporary files of writes killed half-way (a CIFAR SCAFFOLD checkpoint's is 2.2 GB).

        Only one process works in a run folder at a time, so every such file is stale.
        """
        stale = [p for p in self.path.glob(".*.tmp") if p.is_file()] if self.path.is_dir() else []
        for p in stale:
            p.unlink(missing_ok=True)
        return stale

    def create(self, config: dict, validation: bool = False, per_client: bool = False) -> None:
        """A new run's folder: config.json and metrics.csv's header (with ``validation``: ``VALIDATION_COLUMNS``
        too; with ``per_client``: ``CLIENT_COLUMNS``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config_file, lambda p: p.write_text(json.dumps(config, indent=2, ensure_ascii=False)))
        self._columns = (METRIC_COLUMNS + (VALIDATION_COLUMNS if validation else [])
                         + (CLIENT_COLUMNS if per_client else []))
        with open(self.metrics_file, "w", newline="") as f:
            csv.writer(f).writerow(self._columns)

    def columns(self) -> list[str]:
        """metrics.csv's columns: its header's (``METRIC_COLUMNS``, and ``VALIDATION_COLUMNS`` in a run with a
        validation set), read once; ``METRIC_COLUMNS`` where there is no header yet."""
        if self._columns is None:
            header: list[str] = []
            if self.metrics_file.is_file():
                with open(self.metrics_file, newline="") as f:
                    header = next(csv.reader(f), [])
            self._columns = header or list(METRIC_COLUMNS)
        return self._columns

    def read_config(self) -> dict:
        return json.loads(self.config_file.read_text())

    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.metrics_file, "a", newline="") as f:
            csv.writer(f).writerow(["" if row.get(c) is None else row[c] for c in self.columns()])
            f.flush()

    def read_metrics(self) -> list[dict[str, float]]:
        if not self.metrics_file.is_file():
            return []
        with open(self.metrics_file, newline="") as f:
            rows = list(csv.DictReader(f))
        def value(k: str, v: str):
            if v == "" or v is None:
                return None
            return int(v) if k in ("round", "comm_params") else float(v)

        return [{k: value(k, v) for k, v in r.items()} for r in rows if r.get("round")]

    def truncate_metrics(self, last_round: int) -> list[dict[str, float]]:
        """Keep the rows up to ``last_round`` (the checkpoint's); returns them."""
        rows = [r for r in self.read_metrics() if r["round"] <= last_round]
        columns = self.columns()

        def write(p: Path) -> None:
            with open(p, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(columns)
                w.writerows([["" if r.get(c) is None else r[c] for c in columns] for r in rows])

        atomic_write(self.metrics_file, write)
        return rows

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.summary_file, lambda p: p.write_text(json.dumps(summary, indent=2, ensure_ascii=False)))

    def read_summary(self) -> dict[str, Any]:
        return json.loads(self.summary_file.read_text()) if self.summary_file.is_file() else {}

    def save_checkpoint(self, round_: int, state, wall_time: float) -> None:
        """The run's state after ``round_`` rounds: model, server state (momentum, SCAFFOLD's c, ...), γ_t and
        the clients' states (SCAFFOLD's c_i, ... as [N, ...] tables); ``wall_time`` in its records."""
        checkpoint.save(self.checkpoint_file, Checkpoint(round_, state, {"wall_time": wall_time}))

    def checkpoint_round(self) -> int | None:
        """The round of the last checkpoint, read without loading the tensors (memory-mapped)."""
        return checkpoint.read_round(self.checkpoint_file)

    def load_checkpoint(self, mmap: bool = False) -> Checkpoint | None:
        """The last checkpoint, or None; ``CorruptCheckpoint`` (one line: the file and what to do) when it
        cannot be read: cut short by a full disk or a partial copy, or not a checkpoint at all. ``mmap``: its
        tensors read from the file as they are used (``checkpoint.load``)."""
        return checkpoint.load(self.checkpoint_file, mmap=mmap)
