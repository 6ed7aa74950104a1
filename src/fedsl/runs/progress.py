"""A run's progress: a rich progress bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import time
from typing import Callable

from fedsl.runs.callbacks import Callback

Log = Callable[[str], None]


class RunProgress(Callback):
    """A rich progress bar on a terminal; plain log lines otherwise."""

    def __init__(self, name: str, total: int, start: int, log: Log, live: bool) -> None:
        self.log, self.total, self.name = log, total, name
        self.start, self.t0 = start, time.perf_counter()
        self.last = "-"  # the last measured accuracy and its round, shown between evaluations
        self.bar = None
        self.every = max(1, total // 20)
        if live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self.bar = Progress(TextColumn(f"[bold]{name}[/]"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("acc {task.fields[acc]}"), TextColumn("{task.fields[rate]} rounds/s"),
                                TimeRemainingColumn())
            self.task = self.bar.add_task(name, total=total, completed=start, acc="-", rate="-")
            self.bar.start()

    def update(self, round_: int, acc: float | None, rate: float) -> None:
        if acc is not None:
            self.last = f"{acc:.4f} @r{round_}"
        acc_s = f"{acc:.4f}" if acc is not None else self.last
        if self.bar is not None:
            self.bar.update(self.task, completed=round_, acc=acc_s, rate=f"{rate:.2f}")
        elif round_ % self.every == 0 or round_ == self.total:
            self.log(f"{self.name}: round {round_}/{self.total}  acc {acc_s}  {rate:.2f} rounds/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def on_round_end(self, round: int, metrics: dict) -> None:
        self.update(round, metrics.get("accuracy"), (round - self.start) / max(time.perf_counter() - self.t0, 1e-9))

    def on_run_end(self, summary: dict) -> None:
        self.close()
