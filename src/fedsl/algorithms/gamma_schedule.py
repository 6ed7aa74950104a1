"""γ over the rounds: γ_t for server learning's step γ_t·η0.

The paper keeps γ constant and notes (Section 3.2) that a diminishing γ could help once
the model nears a stationary point of F, where ∇f0 stops pointing downhill for F.
- constant: γ_t = γ
- step: γ_t = γ · factor^⌊t / every⌋
- linear: from γ to ``final`` over the T rounds
- cosine: γ_t = final + (γ - final)·(1 + cos(π t/T))/2
- inv_sqrt: γ_t = γ / √(t + 1)
- adaptive: the paper's descent condition (Eq. grad_f0_cond_angle) asks ∇f0 and ∇F to
  make an acute angle. Each round we measure cos θ_t between -∇f0(x_t) and the clients'
  mean update Δ_t from x_t (the server's stand-in for -∇F); while cos θ_t < ``threshold``
  γ shrinks by ``shrink``, otherwise it recovers by ``1/shrink`` per round up to γ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Kind = Literal["constant", "step", "linear", "cosine", "inv_sqrt", "adaptive"]


@dataclass(frozen=True)
class GammaSchedule:
    """How γ_t moves from γ over the rounds; γ itself is ``ServerLearning.gamma`` (stored once)."""

    kind: Kind = "constant"
    final: float = 0.0  # linear / cosine end value
    every: int = 100  # step: rounds between decays
    factor: float = 0.5  # step: decay factor
    rounds: int = 1000  # T, for linear / cosine
    threshold: float = 0.0  # adaptive: smallest cos θ_t that counts as agreement
    shrink: float = 0.5  # adaptive: γ ← shrink·γ on disagreement

    def value(self, t: int, gamma: float, current: float | None = None) -> float:
        """γ_t for round t (0-based) from γ = ``gamma``; ``current`` is the adaptive schedule's running γ."""
        g = gamma
        if self.kind == "constant":
            return g
        if self.kind == "step":
            return g * self.factor ** (t // self.every)
        if self.kind == "linear":
            return g + (self.final - g) * min(t / max(self.rounds - 1, 1), 1.0)
        if self.kind == "cosine":
            return self.final + (g - self.final) * (1 + math.cos(math.pi * min(t / max(self.rounds - 1, 1), 1.0))) / 2
        if self.kind == "inv_sqrt":
            return g / math.sqrt(t + 1)
        return g if current is None else current  # adaptive

    def adapt(self, gamma: float, current: float, cos_theta: float) -> float:
        """The adaptive rule's γ for the next round, given this round's γ_t = ``current`` and cos θ_t; it
        recovers at most up to γ = ``gamma``."""
        if not math.isfinite(cos_theta) or cos_theta < self.threshold:
            return current * self.shrink
        return min(gamma, current / self.shrink)
