"""Callbacks: what a run tells the code that watches it, as it happens.

A run calls its callbacks, in order, at four moments::

    on_run_start(run)                       once, before anything is evaluated (a resumed run: at its resumption)
    on_evaluation(round, metrics)           the model after ``round`` was evaluated (round 0: x_0, a new run only)
    on_round_end(round, metrics)            every round t = 1..T, after its evaluation (if any)
    on_run_end(summary)                     once, with summary.json's content (also when interrupted or failed)

``on_evaluation``'s metrics: ``accuracy``, ``loss``, ``rolling_accuracy`` (and the non-IIDness diagnostics
``xi2``, ``G2``, ``cos_F_f0`` on the rounds they are measured). ``on_round_end``'s metrics: ``wall_time``
(seconds since the run started), ``gamma`` (γ_t of server learning, else None), ``cos_theta`` (when
measured, else None), ``comm_params``, and on an evaluated round the evaluation's metrics too (with
``privacy.clip`` set, also ``epsilon``: DP's ε after the round; round 0's evaluation has ε = 0). A round
whose loss is not finite ends the run (status 'diverged') before these calls, as it leaves no row in
metrics.csv.

The runner keeps a run's files (``fedsl.runs.files``: metrics.csv, checkpoint.pt, summary.json)
and its progress display through the same calls (they come first in the list), and the trackers of
``fedsl.runs.tracking`` are callbacks too. Subclass ``Callback`` and override what you need::

    class Print(Callback):
        def on_evaluation(self, round, metrics):
            print(round, metrics["accuracy"])

    runner.run(cfg, "runs/x", callbacks=[Print()])

Resume: a resumed run calls ``on_run_start`` with ``resumed=True`` and ``first_round`` = the checkpoint's
round + 1, then reports the rounds from there on. Rounds after the checkpoint that the interrupted process
had already reported are reported again (metrics.csv drops its rows of them first; the trackers hide or
skip them, see ``fedsl.runs.tracking``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunStart:
    """What ``on_run_start`` knows of the run."""

    name: str  # the run's name (a group's run: variant and seed in it)
    out: Path  # the run's folder (config.json, metrics.csv, ...): trackers write under it
    config: dict[str, Any]  # the validated config (config.json's content)
    rounds: int  # T
    resumed: bool = False  # continued by `fedsl resume` (or resume=True)
    first_round: int = 0  # the first round this process reports: 0 for a new run, checkpoint round + 1 on resume
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # resolved symbols: η_l, η_g, γ, K0, n0, ...


class Callback:
    """Base class of a run's callbacks: every method does nothing; override those you need."""

    def on_run_start(self, run: RunStart) -> None:
        """Once per process that works on the run, before its first evaluation or round."""

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        """The model after ``round`` rounds was evaluated (0: the initial model x_0)."""

    def on_round_end(self, round: int, metrics: dict[str, Any]) -> None:
        """Round ``round`` (1..T) is done; ``metrics`` holds its numbers (None where not measured)."""

    def on_run_end(self, summary: dict[str, Any]) -> None:
        """The run stopped: ``summary['status']`` is 'completed', 'diverged', 'interrupted', 'failed', or the status
        of a ``StopRun`` a callback raised (a tuning study's 'pruned')."""


class StopRun(Exception):
    """Raised by a callback's ``on_evaluation`` to end its run after that round: the round is recorded as any
    (metrics.csv, checkpoint), then the run closes with ``status`` (summary.json), its folder kept. A run of a
    stack leaves it alone; the others go on. A tuning study stops a pruned trial so (status 'pruned')."""

    def __init__(self, reason: str, status: str = "stopped") -> None:
        super().__init__(reason)
        self.reason, self.status = reason, status


class CallbackList(Callback):
    """Several callbacks called as one, in their order."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)

    def on_run_start(self, run: RunStart) -> None:
        for c in self.callbacks:
            c.on_run_start(run)

    def on_evaluation(self, round: int, metrics: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_evaluation(round, metrics)

    def on_round_end(self, round: int, metrics: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_round_end(round, metrics)

    def on_run_end(self, summary: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_run_end(summary)

