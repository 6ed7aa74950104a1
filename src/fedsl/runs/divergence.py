"""When a run has diverged and stops (status 'diverged'): a test loss that is not finite, or one above
``diverge_loss`` × max(initial loss, ln L) for ``diverge_patience`` evaluations in a row.

Not a callback: it decides whether the run goes on, which a callback (an observer of the run) cannot,
and a loss that is not finite must stop the run before any callback hears of its round (it leaves no
row in metrics.csv).
"""

from __future__ import annotations

import math
from typing import Any

from fedsl.config.schema import RunConfig


class DivergenceGuard:
    """The divergence test of one run; ``history``: metrics.csv's rows kept on resume (the bound and the
    count of evaluations above it are taken up from them)."""

    def __init__(self, cfg: RunConfig, num_classes: int, history: list[dict[str, Any]]) -> None:
        self.name, self.factor, self.patience = cfg.name, cfg.diverge_loss, cfg.diverge_patience
        self.chance = math.log(num_classes)  # ln L, the loss of a uniform guess
        self.bound = math.inf
        if history and history[0]["round"] == 0:
            self.set_initial(history[0]["loss"])
        self.above = 0  # consecutive evaluations above the bound
        for r in history[1:]:
            self.above = self.above + 1 if r["loss"] > self.bound else 0

    def set_initial(self, loss: float) -> None:
        """The bound, relative to x_0's loss (or chance's, ln L, if larger); none when diverge_loss = 0."""
        f = self.factor
        self.bound = f * max(loss, self.chance) if f > 0 and math.isfinite(loss) else math.inf

    def not_finite(self, done: int, loss: float) -> str | None:
        """Why the run stops at round ``done`` if its loss is not finite (None: it is)."""
        if math.isfinite(loss):
            return None
        return f"{self.name}: loss is {loss} at round {done}: stopping (status 'diverged')"

    def observe(self, done: int, loss: float) -> str | None:
        """Count round ``done``'s evaluation; why the run stops there (None: it goes on)."""
        self.above = self.above + 1 if loss > self.bound else 0
        if self.above < self.patience:
            return None
        return (f"{self.name}: loss {loss:.4g} above {self.bound:.4g} (diverge_loss × initial loss) for "
                f"{self.above} evaluations at round {done}: stopping (status 'diverged')")
