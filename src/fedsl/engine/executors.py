"""Executors: run LocalSGD for the S clients of a round, from one global model.

Both call the same ``FunctionalModel.sgd_step``; they differ only in how clients are
scheduled:
- ``SequentialExecutor``: a plain loop over clients and their real steps (no padding).
  On a small CPU this was as fast or faster than vmap (measured, see issue 2/6).
- ``VectorisedExecutor``: the S clients step together, ``torch.func.vmap`` over stacked
  parameters; padded steps have zero weight and are exact no-ops. What fills a GPU.
They agree to float rounding (tests compare them in float64).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch.func import vmap

from fedsl.core.types import Params
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import BatchPlan


class Executor(Protocol):
    name: str

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float,
                  correction=None, optimizer=None) -> Params:
        """Final parameters of each planned client, stacked on a leading dim [S, ...].

        ``correction`` (an ``algorithms.Correction``) adds prox·(y - params) + linear_i to
        every local gradient (FedProx, SCAFFOLD, FedDyn). ``optimizer`` (an
        ``algorithms.ClientOptimizer``) replaces the SGD step (None: LocalSGD).
        """
        ...

    def local_sgd_many(self, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
                       lrs: list[float], correction=None, optimizer=None) -> Params:
        """Client j of ``plan`` starts from ``starts[j]`` with step ``lrs[j]``: the clients of
        several runs (``StackedSimulator``) in one call; each client's prox anchor is its start."""
        ...


class SequentialExecutor:
    name = "sequential"

    def __init__(self, fm: FunctionalModel) -> None:
        self.fm = fm

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float,
                  correction=None, optimizer=None) -> Params:
        self.fm.train(True)
        finals = [self._client(params, plan, j, x, y, lr, params, correction, optimizer)
                  for j in range(plan.num_clients)]
        return {n: torch.stack([f[n] for f in finals]) for n in params}

    def local_sgd_many(self, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
                       lrs: list[float], correction=None, optimizer=None) -> Params:
        """Like ``local_sgd`` but client j starts from ``starts[j]`` with step ``lrs[j]`` (stacked runs)."""
        self.fm.train(True)
        # the caller's tensors as they are: their memory layout picks the convolution algorithm
        finals = [self._client(p, plan, j, x, y, lrs[j], p, correction, optimizer) for j, p in enumerate(starts)]
        return {n: torch.stack([f[n] for f in finals]) for n in starts[0]}

    def _client(self, p: Params, plan: BatchPlan, j: int, x: torch.Tensor, y: torch.Tensor, lr: float,
                anchor: Params, correction, optimizer=None) -> Params:
        """Client j's real steps (no padding) from p; ``anchor`` is its x_t for prox terms."""
        corrected = correction is not None and correction.active
        lin = {n: v[j] for n, v in correction.linear.items()} if corrected and correction.linear else None
        state = optimizer.init(p) if optimizer is not None else None
        for k in range(plan.steps[j]):
            w = plan.weight[j, k]
            b = int((w > 0).sum())  # real samples come first; the rest is padding
            idx = plan.idx[j, k, :b]
            if optimizer is not None:
                p, state = self.fm.optimizer_step(p, state, x[idx], y[idx], w[:b], plan.keys[j, k], lr, anchor,
                                                  correction.prox if corrected else 0.0, lin, optimizer)
            elif corrected:
                p = self.fm.corrected_step(p, x[idx], y[idx], w[:b], plan.keys[j, k], lr, anchor,
                                           correction.prox, lin)
            else:
                p = self.fm.sgd_step(p, x[idx], y[idx], w[:b], plan.keys[j, k], lr)
        return p


class VectorisedExecutor:
    name = "vectorised"

    def __init__(self, fm: FunctionalModel) -> None:
        self.fm = fm
        # randomness='different' keeps any user module with its own random ops legal under vmap;
        # fedsl's dropout takes its randomness from the (batched) key instead.
        self._step = vmap(fm.sgd_step, in_dims=(0, 0, 0, 0, 0, None), randomness="different")

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float,
                  correction=None, optimizer=None) -> Params:
        self.fm.train(True)
        s = plan.num_clients
        stacked = {n: p.unsqueeze(0).expand(s, *p.shape).contiguous() for n, p in params.items()}
        if optimizer is not None:
            return self._with_optimizer(stacked, params, None, plan, x, y, lr, None, correction, optimizer)
        step = self._step
        if correction is not None and correction.active:
            lin_dim = 0 if correction.linear is not None else None
            corrected = vmap(self.fm.corrected_step, in_dims=(0, 0, 0, 0, 0, None, None, None, lin_dim),
                             randomness="different")

            def step(p, xb, yb, wb, kb, lr_):
                return corrected(p, xb, yb, wb, kb, lr_, params, correction.prox, correction.linear)
        for k in range(plan.max_steps):
            idx = plan.idx[:, k]  # [S, B]
            stacked = step(stacked, x[idx], y[idx], plan.weight[:, k], plan.keys[:, k], lr)
        return stacked

    def local_sgd_many(self, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
                       lrs: list[float], correction=None, optimizer=None) -> Params:
        """Like ``local_sgd`` but client j starts from ``starts[j]`` with step ``lrs[j]`` (stacked runs)."""
        self.fm.train(True)
        stacked = {n: torch.stack([p[n] for p in starts]) for n in starts[0]}
        anchors = stacked
        lr = torch.tensor(lrs, dtype=stacked[next(iter(stacked))].dtype, device=plan.idx.device)
        if optimizer is not None:
            return self._with_optimizer(stacked, anchors, 0, plan, x, y, lr, 0, correction, optimizer)
        if correction is not None and correction.active:
            lin_dim = 0 if correction.linear is not None else None
            corrected = vmap(self.fm.corrected_step, in_dims=(0, 0, 0, 0, 0, 0, 0, None, lin_dim),
                             randomness="different")

            def step(p, xb, yb, wb, kb, lr_):
                return corrected(p, xb, yb, wb, kb, lr_, anchors, correction.prox, correction.linear)
        else:
            step = vmap(self.fm.sgd_step, in_dims=(0, 0, 0, 0, 0, 0), randomness="different")
        for k in range(plan.max_steps):
            idx = plan.idx[:, k]
            stacked = step(stacked, x[idx], y[idx], plan.weight[:, k], plan.keys[:, k], lr)
        return stacked

    def _with_optimizer(self, stacked: Params, anchors: Params, anchor_dim, plan: BatchPlan, x: torch.Tensor,
                        y: torch.Tensor, lr, lr_dim, correction, optimizer) -> Params:
        """The clients' steps with a ``ClientOptimizer``: its state is stacked over clients and
        carried through the steps; padded steps leave both untouched."""
        corrected = correction is not None and correction.active
        prox = correction.prox if corrected else 0.0
        linear = correction.linear if corrected else None
        step = vmap(self.fm.optimizer_step, in_dims=(0, 0, 0, 0, 0, 0, lr_dim, anchor_dim, None,
                                                     0 if linear is not None else None, None),
                    randomness="different")
        state = optimizer.init(stacked)
        for k in range(plan.max_steps):
            idx = plan.idx[:, k]
            stacked, state = step(stacked, state, x[idx], y[idx], plan.weight[:, k], plan.keys[:, k], lr, anchors,
                                  prox, linear, optimizer)
        return stacked


EXECUTORS = {"sequential": SequentialExecutor, "vectorised": VectorisedExecutor}


def make_executor(name: str, fm: FunctionalModel, device: torch.device) -> SequentialExecutor | VectorisedExecutor:
    """``auto`` picks by device, from measurement: sequential on CPU, vectorised on CUDA."""
    if name == "auto":
        name = "vectorised" if device.type == "cuda" else "sequential"
    if name not in EXECUTORS:
        raise ValueError(f"executor = {name!r}: expected one of {['auto', *EXECUTORS]}")
    return EXECUTORS[name](fm)
