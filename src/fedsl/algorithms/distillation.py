"""Ensemble distillation on the server's unlabelled data: FedDF's fusion (Lin, Kong, Stich & Jaggi, NeurIPS 2020).

After the clients' round, the server starts from the average of the round's client models x̄_t and trains it to
match the ensemble of those models on unlabelled data U (the server's round that runs it: ``server_round``):

    z̄(u)    = (1/S) Σ_{i∈S} f(x_i, u)                          the ensemble's logits (uniform mean, "avg_logits")
    ℓ(y; u) = KL(softmax(z̄(u)/T) ‖ softmax(f(y, u)/T))        per sample, averaged over a batch of U
    y_0 = x̄_t;  K steps of Adam on ℓ, batches of B drawn from U's training part, step size cosine-annealed to 0
    x_{t+1} = the y_k with the lowest ℓ on U's validation part (checked every ``eval_every`` steps); stop when
              it has not improved for ``patience`` steps (early stopping)

What is the paper's and what is ours. The paper (Section 4 and Algorithm 1, as we recall them; we could not read
its text here) fuses from the FedAvg model with Adam at step size 10^-3, cosine annealing, 10^4 steps per round
and early stopping when the validation performance plateaus for 10^3 steps. The authors' code (epfml's
federated-learning-public-code, ``pcode/aggregation/noise_knowledge_transfer.py`` and ``adv_knowledge_transfer.py``,
read in public copies) adds what we follow too: batches of 128, validation every 100 steps, the teachers'
logits averaged uniformly, KL(teacher ‖ student) of temperature-T softmaxes averaged over the batch (no T²
factor; T = 1), the student's gradient clipped to norm 5 before Adam (β = (0.9, 0.999), ε = 10^-8, torch's
defaults), the student in training mode (dropout on) and the teachers in evaluation mode, the best validated model
returned. Ours:

- The validation signal. The authors validate the student's accuracy on a labelled validation set; the server
  here has no labels for U, so it holds out ``val_fraction`` of U (drawn once per run from the seed) and measures
  the same KL against the ensemble there: distillation stops when the student stops getting closer to the
  ensemble on data it does not train on. The code's default patience is 2,000 steps; we keep the paper's 10^3.
- The batches of U and the dropout keys come from the run's seed and the round (``fedsl.core.rng``), so a round
  is a function of (state, t) in every runtime: stacked runs and Flower match the simulator.
- The teachers' logits are computed once per round for the samples the round's batches and the validation part
  use (not per step): the same numbers, S forward passes per sample instead of per step.
- The averaged start x̄_t is the rule's (FedAvg's x_t + η_g·mean Δ_i with η_g = 1: the plain mean of the client
  models, or n_i-weighted with ``algorithm.weighted = true``, the paper's weighting).

This module holds the settings and the arithmetic, a pure function of the models, the forward functions the
engine gives it and the batches it planned; it imports nothing of ``fedsl.algorithms`` but the shared types.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import grad

from fedsl.algorithms.spec import Range
from fedsl.core.types import Params

BETAS = (0.9, 0.999)  # Adam's moment decays (torch's defaults, which the authors' code uses)
EPS = 1e-8  # Adam's ε (torch's default)
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s guard: coefficient = max_norm / (norm + 1e-6)

Forward = Callable[..., torch.Tensor]  # (params, inputs[, dropout key, samples' weights]) -> logits


@dataclass(frozen=True)
class Distillation:
    """FedDF's settings (the config's ``[distill]`` table takes its defaults from here; the module docstring says
    which are the paper's, the authors' code's and ours).

    Attributes:
        lr: Adam's step size (paper: 10^-3).
        temperature: T of the softmaxes the KL compares (authors' code: 1).
        steps: K, distillation steps per round at most (paper: 10^4).
        batch_size: B, unlabelled samples per step (authors' code: 128).
        eval_every: steps between validations (authors' code: 100).
        patience: stop when the validation KL has not improved for this many steps (paper: 10^3).
        val_fraction: share of U held out for validation, drawn once per run (ours: 0.1; 0 = no validation: K
            steps, the last model).
        schedule: "cosine" (the step size annealed from ``lr`` to 0 over K steps, as the authors') or "constant".
        clip: the gradient's norm is clipped to this before each Adam step (authors' code: 5; 0 = no clipping).
    """

    lr: float = 1e-3
    temperature: float = 1.0
    steps: int = 10_000
    batch_size: int = 128
    eval_every: int = 100
    patience: int = 1_000
    val_fraction: float = 0.1
    schedule: Literal["cosine", "constant"] = "cosine"
    clip: float = 5.0

    def step_size(self, k: int) -> float:
        """The step size of step k (0-based): ``lr``, or cosine-annealed lr·(1 + cos(πk/K))/2 (torch's
        CosineAnnealingLR with T_max = K and η_min = 0, stepped after every step)."""
        if self.schedule == "constant":
            return self.lr
        return self.lr * (1 + math.cos(math.pi * k / self.steps)) / 2


SCHEDULES = ("cosine", "constant")

# Where each default of ``Distillation`` comes from (the printed hyper-parameter table and summary.json say it):
# the paper's text, the authors' code, or our choice.
PAPER, CODE = "FedDF's paper", "FedDF's code"
# What a tuning study searches of FedDF by default (``fedsl tune``): Adam's step size over three decades around the
# paper's 1e-3, and the steps per round from 10 to the paper's 10^4 (log scale: a few steps to many; the paper's
# 10^4 is its budget, not widened).
SEARCH = {"lr": Range(1e-5, 1e-2, log=True), "steps": Range(10, 10_000, log=True, integer=True, hard_high=True)}

ORIGIN = {"lr": PAPER, "temperature": CODE, "steps": PAPER, "batch_size": CODE, "eval_every": CODE, "patience": PAPER,
          "val_fraction": "ours", "schedule": PAPER, "clip": CODE}


def split(n: int, fraction: float, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Positions of U's (training, validation) parts: round(fraction·n) of n held out (at least 1 and at most
    n - 1 when fraction > 0 and n >= 2; none otherwise), drawn from ``gen``; each sorted."""
    k = min(max(round(fraction * n), 1), n - 1) if fraction > 0 and n >= 2 else 0
    order = gen.permutation(n)
    return np.sort(order[k:]), np.sort(order[:k])


@dataclass
class EarlyStopping:
    """The stopping rule: after each validation at step j with value v (lower is better), the best so far is kept
    (a strict improvement moves it), and distillation stops once j - (the best's step) >= ``patience``."""

    patience: int
    best: float = math.inf
    best_step: int | None = None
    history: list[tuple[int, float]] = field(default_factory=list)

    def update(self, step: int, value: float) -> tuple[bool, bool]:
        """Record the validation at ``step``: (whether it is the best so far, whether to stop now)."""
        self.history.append((step, value))
        better = value < self.best
        if better or self.best_step is None:  # the first validation is the reference, even when it is NaN
            self.best_step = step
            self.best = value if better else self.best
        return better, step - self.best_step >= self.patience


@dataclass
class Distilled:
    """A round's distillation: the model it returns, the steps it took (early stopping may end them before K),
    the step of the best validation (None: no validation) and every validation (step, KL)."""

    x: Params
    steps: int
    best_step: int | None
    history: list[tuple[int, float]]


def kl_to_ensemble(student_logits: torch.Tensor, ensemble_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(z̄/T) ‖ softmax(z/T)) of each sample [b] (the authors' F.kl_div of the softmaxes, per sample)."""
    log_q = F.log_softmax(student_logits / temperature, dim=1)
    log_p = F.log_softmax(ensemble_logits / temperature, dim=1)
    return (log_p.exp() * (log_p - log_q)).sum(1)


@torch.no_grad()
def ensemble_logits(predict: Forward, teachers: Params, inputs: torch.Tensor, chunk: int) -> torch.Tensor:
    """z̄ = (1/S) Σ_i f(x_i, u) for each row u of ``inputs`` (teachers stacked [S, ...], evaluation mode)."""
    s = next(iter(teachers.values())).shape[0]
    total = None
    for i in range(s):
        one = {n: v[i] for n, v in teachers.items()}
        z = torch.cat([predict(one, inputs[j:j + chunk]) for j in range(0, len(inputs), chunk)])
        total = z if total is None else total + z
    return total / s


@torch.no_grad()
def validation_kl(predict: Forward, params: Params, inputs: torch.Tensor, targets: torch.Tensor, temperature: float,
                  chunk: int) -> float:
    """The mean KL of the student ``params`` to the ensemble's logits ``targets`` on the validation ``inputs``."""
    total = sum(kl_to_ensemble(predict(params, inputs[j:j + chunk]), targets[j:j + chunk], temperature).sum()
                for j in range(0, len(inputs), chunk))
    return float(total / len(inputs))


def _clip(g: Params, max_norm: float) -> Params:
    """g scaled to norm at most ``max_norm`` (torch.nn.utils.clip_grad_norm_'s arithmetic)."""
    if max_norm <= 0:
        return g
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(v) for v in g.values()]))
    coef = torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)
    return {n: v * coef for n, v in g.items()}


def _adam(y: Params, g: Params, m: Params, v: Params, k: int, lr: float) -> tuple[Params, Params, Params]:
    """Step k (1-based) of Adam from y (torch.optim.Adam's single-tensor arithmetic): (y, m, v) after it."""
    b1, b2 = BETAS
    c1, c2 = 1 - b1 ** k, math.sqrt(1 - b2 ** k)
    m = {n: torch.lerp(m[n], g[n], 1 - b1) for n in y}
    v = {n: v[n] * b2 + (1 - b2) * g[n] * g[n] for n in y}
    y = {n: p - (lr / c1) * m[n] / (v[n].sqrt() / c2 + EPS) for n, p in y.items()}
    return y, m, v


def distill(d: Distillation, x_bar: Params, teachers: Params, student: Forward, predict: Forward,
            inputs: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor, keys: torch.Tensor, val: torch.Tensor,
            chunk: int = 500) -> Distilled:
    """One round's ensemble distillation from x̄_t (the module docstring).

    Args:
        d: the settings.
        x_bar: x̄_t, where the student starts.
        teachers: the round's client models x_i, stacked [S, ...].
        student: ``student(params, inputs, key, weights)``: the model's logits in training mode (dropout drawn from
            key; the batch's weights, 0 on padding, for a model whose BatchNorm counts samples by them).
        predict: ``predict(params, inputs)``: its logits in evaluation mode.
        inputs: the pool of samples (labels are never read).
        idx, weight, keys: the planned steps over U's training part: [K, B] pool indices, [K, B] weights (1/b on
            the b real samples of a batch, 0 on padding) and [K] dropout keys.
        val: pool indices of U's validation part (empty: no validation).
        chunk: samples per forward pass when computing logits without gradients.
    """
    steps = idx.shape[0]
    need = torch.unique(torch.cat([idx.reshape(-1), val]))  # the samples the round reads, teachers run once on each
    z = ensemble_logits(predict, teachers, inputs[need], chunk)
    table = torch.zeros(len(inputs), z.shape[1], dtype=z.dtype, device=z.device)
    table[need] = z
    val_x, val_z = inputs[val], table[val]
    temperature = d.temperature

    def loss(y: Params, xb: torch.Tensor, zb: torch.Tensor, wb: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        return (kl_to_ensemble(student(y, xb, key, wb), zb, temperature) * wb).sum()

    gradient = grad(loss)
    y = dict(x_bar)
    m = {n: torch.zeros_like(p) for n, p in y.items()}
    v = {n: torch.zeros_like(p) for n, p in y.items()}
    stop = EarlyStopping(d.patience)
    best: Params | None = None
    done = 0
    for k in range(steps):
        at = idx[k]
        g = _clip(gradient(y, inputs[at], table[at], weight[k], keys[k]), d.clip)
        y, m, v = _adam(y, g, m, v, k + 1, d.step_size(k))
        done = k + 1
        if len(val) and done % d.eval_every == 0:
            better, halt = stop.update(done, validation_kl(predict, y, val_x, val_z, temperature, chunk))
            if better:
                best = {n: p.clone() for n, p in y.items()}
            if halt:
                break
    return Distilled(best if best is not None else y, done, stop.best_step, stop.history)
