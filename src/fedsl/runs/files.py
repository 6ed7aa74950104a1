"""A run folder's files, kept through the run's callbacks (``fedsl.runs.callbacks``):

    metrics.csv      MetricsFile    one row per evaluated round, appended as it happens
    checkpoint.pt    Checkpoints    x_0, every ``checkpoint_every`` rounds, round T, and where a run stops
    summary.json     RunSummary     the run's set-up, x_0's accuracy, and at its end the paper's metrics

``fedsl.runs.runner`` puts them first in a run's callbacks, in this order, so that a
checkpoint of round t is never on disk before metrics.csv's row of round t (a resume keeps the
rows up to its checkpoint's round).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Callable

import torch

from fedsl.engine import metrics
from fedsl.engine.diagnostics import Diagnostics
from fedsl.engine.simulator import RunState
from fedsl.runs.callbacks import Callback
from fedsl.runs.results import CLIENT_COLUMNS, RunDir

if TYPE_CHECKING:
    from fedsl.runs.build import Prepared

Log = Callable[[str], None]
DIAGNOSTICS = tuple(f.name for f in fields(Diagnostics))  # ξ², G², cos(∇F, ∇f0): metrics on the rounds measured


class MetricsFile(Callback):
    """metrics.csv: one row per evaluated round (x_0's row at round 0), appended and flushed as it happens."""

    def __init__(self, rd: RunDir) -> None:
        self.rd = rd

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        if round == 0:  # x_0 is no round: its row is written here, the others with their round's numbers
            self.rd.append_metrics({"round": 0, "wall_time": 0.0, **metrics})

    def on_round_end(self, round: int, metrics: dict[str, Any]) -> None:
        if "accuracy" in metrics:
            self.rd.append_metrics({"round": round, **metrics})


def without_tables(state: RunState) -> RunState:
    """``state`` less its clients' tables: what a checkpoint of a run that nothing resumes keeps."""
    return state.server_part()


class Checkpoints(Callback):
    """checkpoint.pt, so that every finished round stays resumable: x_0's (with ``checkpoint_every``), one
    every ``checkpoint_every`` rounds, round T's, and at the round a run stops early (interrupted, failed,
    diverged).

    A checkpoint holds the run's state (x_t, the server state, γ_t, the clients' tables), which the
    callbacks are not told: ``current()`` gives it (None before x_0) and the run's wall time so far.
    """

    def __init__(self, rd: RunDir, name: str, every: int, rounds: int, log: Log,
                 current: Callable[[], tuple[RunState | None, float]]) -> None:
        self.rd, self.name, self.every, self.rounds, self.log, self.current = rd, name, every, rounds, log, current

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        if round == 0 and self.every:
            state, _ = self.current()
            self.rd.save_checkpoint(0, state, 0.0)

    def on_round_end(self, round: int, metrics: dict[str, Any]) -> None:
        if round == self.rounds:
            # the run is over and nothing resumes a finished run: its clients' tables (N × d each, 2.2 GB for
            # SCAFFOLD on 1,000 CIFAR clients; 262 GB for Fig. 5's 120 SCAFFOLD/FedDyn runs) are not kept
            state, wall = self.current()
            self.rd.save_checkpoint(round, without_tables(state), wall)
        elif self.every and round % self.every == 0:
            state, wall = self.current()
            try:
                self.rd.save_checkpoint(round, state, wall)
            except OSError as e:  # a full disk costs resume granularity, not the rounds in memory: train on
                self.log(f"{self.name}: could not write the checkpoint of round {round} ({e}); training goes on, "
                         f"an interruption resumes from round {self.rd.checkpoint_round() or 0}")

    def on_run_end(self, summary: dict[str, Any]) -> None:
        state, wall = self.current()
        if summary["status"] == "completed" or state is None:
            return
        # keep finished rounds resumable; a diverged run is never resumed (FINISHED), so it keeps no clients'
        # tables either
        if summary["status"] == "diverged":
            state = without_tables(state)
        done = summary["rounds_done"]
        try:
            self.rd.save_checkpoint(done, state, wall)
        except OSError as e:  # a full disk must not turn a Ctrl-C into a failure of the whole sweep: the
            # last checkpoint stays (written atomically), and the run resumes from it
            self.log(f"{self.name}: could not write the checkpoint of round {done} ({e}); "
                     "it resumes from its last checkpoint")


def uses_server_data(prep: Prepared) -> bool:
    """Whether the run reads D0: server learning (FSL, FSL-p, FedDU, D0 only, a rule + SL), DS's shared data,
    FLTrust's reference update, pretraining on D0, the fine-tuning control after round T, the diagnostics
    (ξ² and cos(∇F, ∇f0) measure ∇f0 on D0), or FedDF's distillation on D0's images (``data.unlabelled = 'server'``)."""
    alg = prep.algorithm
    return bool(alg.server_learning is not None or alg.share_server_data
                or (alg.robust is not None and alg.robust.root is not None)
                or (alg.distillation is not None and prep.cfg.data.unlabelled == "server")
                or prep.pretrain is not None or prep.cfg.server.finetune_epochs or prep.cfg.diag_every)


def server_data_record(prep: Prepared) -> dict[str, Any]:
    """summary.json's ``server_data``: D0's size, source (``data.server_source``) and class histogram for a run that
    reads D0; for one that does not
    (SCAFFOLD, FedDyn, FedAvg beside FSL in one preset), size 0, with the size of the D0 its config drew all the
    same (``drawn_unused``: the same seed draws the same D0 for every variant, and D0 drawn IID without overlap
    is kept out of the clients' data whether or not the run reads it). A run that distils (FedDF) adds ``unlabelled``:
    the size and source of the unlabelled data U it distils on."""
    fed = prep.fed
    extra = {}
    if prep.algorithm.distillation is not None:
        extra = {"unlabelled": {"size": len(fed.unlabelled), "source": prep.cfg.data.unlabelled}}
    if uses_server_data(prep):
        return {"size": fed.n0, "source": prep.cfg.data.server_source, "class_histogram": fed.server_histogram(),
                **extra}
    return {"size": 0, "class_histogram": [], **({"drawn_unused": fed.n0} if fed.n0 else {}), **extra}


class RunSummary(Callback):
    """summary.json: the run's set-up (data, model, device, hyper-parameters with their sources), x_0's
    accuracy, and at its end the paper's metrics over rounds 1..T (final accuracy, rise time, T_a), DP's ε,
    the fine-tuning control's accuracy, its status, rounds done and wall time. A run with a validation set
    (``data.validation``) adds its size (``validation_size``) and ``final_val_accuracy``, the rolling validation
    accuracy at the last round, computed as ``final_accuracy``.

    It hears the evaluations as a callback, but ``write`` is called by the run before ``on_run_end``: the
    summary it writes is what every callback's ``on_run_end`` is given.
    """

    def __init__(self, rd: RunDir, prep: Prepared, history: list[dict[str, Any]], *, resumed: bool) -> None:
        cfg, fed, sim = prep.cfg, prep.fed, prep.sim
        self.rd, self.window, self.privacy = rd, cfg.rolling_window, prep.privacy
        self.fields = rd.read_summary() if resumed else {}
        self.fields.update({
            "name": cfg.name, "algorithm": prep.algorithm.name, "dataset": cfg.data.dataset, "seed": cfg.seed,
            "rounds": cfg.rounds, "device": str(prep.device), "executor": sim.executor.name,
            "threads": torch.get_num_threads(),
            "server_data": server_data_record(prep),
            "test_data": {"size": len(fed.y_test),
                          "class_histogram": torch.bincount(fed.y_test.cpu(), minlength=fed.num_classes).tolist()},
            "inputs": {"normalize": cfg.data.normalize,
                       **({"mean": fed.input_stats[0], "std": fed.input_stats[1]} if fed.input_stats else {})},
            "model_init": cfg.model.init,
            "hyperparameters": {h.symbol: {"value": h.value, "source": h.source} for h in prep.hparams},
        })
        if len(fed.validation):  # data.validation: the samples set aside (a run without any records nothing of it)
            self.fields["validation_size"] = len(fed.validation)
        if cfg.attack.kind != "none":  # who was malicious: ⌊f·N⌋ ids, the same every round
            self.fields["attack"] = {"kind": cfg.attack.kind, "fraction": cfg.attack.fraction,
                                     "malicious_count": len(sim.malicious), "malicious": sim.malicious.tolist()}
        # round 0 (x_0's accuracy) is a row of metrics.csv for the curves, but not part of the
        # paper's metrics (rolling, final accuracy, rise time, T_a), which are over rounds 1..T
        self.rounds = [int(r["round"]) for r in history if r["round"] > 0]
        self.accs = [r["accuracy"] for r in history if r["round"] > 0]
        self.validated = len(fed.validation) > 0
        valid = [r for r in history if r["round"] > 0 and r.get("val_accuracy") is not None]
        self.val_rounds, self.val_accs = [int(r["round"]) for r in valid], [r["val_accuracy"] for r in valid]
        for r in history:  # eval_per_client: the last evaluation's (a resumed run's, until it evaluates again)
            self._clients(r)

    def _clients(self, row: dict[str, Any]) -> None:
        """summary.json's final_client_acc_mean / _std / _worst10: the clients' accuracies at the last evaluation
        (``eval_per_client``; not a rolling mean: the spread of one model)."""
        if row.get("client_acc_mean") is not None:
            self.fields.update({f"final_{c}": row[c] for c in CLIENT_COLUMNS})

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        if round == 0:
            self.fields["initial_accuracy"] = metrics["accuracy"]
            diag = {k: metrics[k] for k in DIAGNOSTICS if k in metrics}
            if diag:
                self.fields["initial_diagnostics"] = diag
        else:
            self.rounds.append(round)
            self.accs.append(metrics["accuracy"])
            if "val_accuracy" in metrics:
                self.val_rounds.append(round)
                self.val_accs.append(metrics["val_accuracy"])
            self._clients(metrics)

    def write(self, status: str, done: int, wall: float, finetuned: dict[str, Any] | None) -> dict[str, Any]:
        """Close the summary with ``status`` after ``done`` rounds and write summary.json; returns its content."""
        self.fields.update(metrics.summarize(self.rounds, self.accs, self.window))
        if self.validated:  # the rolling validation accuracy at the last round, as final_accuracy is the test's
            self.fields["final_val_accuracy"] = metrics.final_accuracy(self.val_rounds, self.val_accs, self.window)
        if self.privacy is not None:  # ε after the rounds done, with δ, z, C, q and the accountant
            self.fields["privacy"] = self.privacy.record(done)
        if finetuned is not None:
            self.fields.update(finetuned)
        self.fields.update({"status": status, "rounds_done": done, "wall_time": round(wall, 3)})
        self.rd.write_summary(self.fields)
        return self.fields
