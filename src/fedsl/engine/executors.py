"""Executors: run the client half of an algorithm for the planned clients of a round.

Both run ``algorithms.base.client_update`` (``client_init``, a ``client_step`` per batch,
``client_final``) with the model's gradient; they differ only in how clients are scheduled:
- ``SequentialExecutor``: ``client_update`` itself, one client after another over its real
  steps (no padding). On a small CPU this was as fast or faster than vmap (measured, issue 2/6).
- ``VectorisedExecutor``: the clients step together, ``torch.func.vmap`` of the three client
  functions over stacked clients; padded steps (zero-weight batches) are masked, exact no-ops.
  What fills a GPU.
They agree to float rounding (tests compare them in float64).
``processes`` (``fedsl.engine.pool``) runs the sequential executor on W worker processes, a
contiguous share of the clients each: bit-identical to it at one thread, W cores busy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch.func import grad, vmap

from fedsl.algorithms.base import LOCAL_SGD, LocalSGD, client_update
from fedsl.core.types import Params, State
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import BatchPlan

Lr = float | Sequence[float] | torch.Tensor  # one η for all clients, or one per client


class Executor(Protocol):
    name: str

    def train(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
              lr: Lr, states: State | None = None, sent: list[State] | None = None) -> tuple[Params, State]:
        """``client_update`` of each planned client j: from ``starts[j]`` with its state ``states[j]`` (stacked
        on a leading [S] dim; None: stateless), what the server sent it ``sent[j]`` (None: nothing) and
        step ``lr`` (one, or one per client), over its batches of ``plan`` into the pool (x, y).

        Returns the final models x_i and the clients' new states, stacked [S, ...].
        """
        ...

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float) -> Params:
        """Plain LocalSGD from ``params`` for every planned client (server learning, pretraining), stacked."""
        ...


def _rows(state: State | None, j: int) -> State:
    return {k: {n: v[j] for n, v in g.items()} for k, g in (state or {}).items()}


def _stacked(items: list):
    """A list of per-client Params or States, stacked on a leading dim ({} for none)."""
    if not items or not items[0]:
        return {}
    first = items[0]
    if isinstance(next(iter(first.values())), dict):
        return {k: {n: torch.stack([it[k][n] for it in items]) for n in g} for k, g in first.items()}
    return {n: torch.stack([it[n] for it in items]) for n in first}


class SequentialExecutor:
    name = "sequential"

    def __init__(self, fm: FunctionalModel) -> None:
        self.fm = fm
        self._grad = grad(fm.loss)

    def _gradient(self, params: Params, batch: tuple) -> Params:
        return self._grad(params, *batch)

    def train(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
              lr: Lr, states: State | None = None, sent: list[State] | None = None) -> tuple[Params, State]:
        finals, rows = self.train_each(client, starts, plan, x, y, lr, states, sent)
        return _stacked(finals), _stacked(rows)

    def train_each(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor,
                   y: torch.Tensor, lr: Lr, states: State | None = None, sent: list[State] | None = None
                   ) -> tuple[list[Params], list[State]]:
        """``train``'s per-client results, unstacked: the process pool (``fedsl.engine.pool``) runs this
        on each worker's share of the clients and stacks all of them as ``train`` does, so that the
        stacked tensors are made by the same op from the same per-client tensors (bit-identical)."""
        self.fm.train(True)
        lrs = lr.tolist() if isinstance(lr, torch.Tensor) else lr
        finals, rows = [], []
        for j in range(plan.num_clients):
            lr_j = lrs[j] if isinstance(lrs, Sequence) else lrs
            # the caller's tensors as they are: their memory layout picks the convolution algorithm
            x_i, row, _ = client_update(client, starts[j], _rows(states, j), sent[j] if sent else {},
                                        self._batches(plan, j, x, y), self._gradient, lr_j)
            finals.append(x_i)
            rows.append(row)
        return finals, rows

    @staticmethod
    def _batches(plan: BatchPlan, j: int, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple]:
        """Client j's real batches (no padding): (inputs, labels, weights 1/b, dropout key)."""
        for k in range(plan.steps[j]):
            w = plan.weight[j, k]
            b = int((w > 0).sum())  # real samples come first; the rest is padding
            idx = plan.idx[j, k, :b]
            yield x[idx], y[idx], w[:b], plan.keys[j, k]

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float) -> Params:
        return self.train(LOCAL_SGD, [params] * plan.num_clients, plan, x, y, lr)[0]


COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "aot_eager")


class VectorisedExecutor:
    """The clients step together under ``vmap``.

    Args:
        fm: the model.
        compile: ``torch.compile`` the vmapped step (the round's hot loop: K steps of S clients, or of
            R·S clients of stacked runs): "off"; "default" (inductor); "reduce-overhead" (inductor with
            CUDA graphs: one replay per step instead of hundreds of kernel launches, what a GPU needs
            for Scenario 2's 10-image steps); "max-autotune"; or "aot_eager" (the capture alone, no
            code generation: how the tests check the captured step equals the eager one on a CPU).
    """

    name = "vectorised"

    def __init__(self, fm: FunctionalModel, compile: str = "off") -> None:
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile = {compile!r}: expected one of {list(COMPILE_MODES)}")
        self.fm, self.compile = fm, compile
        self._steps: dict = {}  # (client, lr batched?) -> the vmapped (and compiled) step, built once

    def _vmapped_step(self, client: LocalSGD, lr_dim: int | None, masked: bool):
        key = (client, lr_dim, masked)
        if key not in self._steps:
            # randomness='different' keeps any user module with its own random ops legal under vmap;
            # fedsl's dropout takes its randomness from the (batched) key instead.
            step = vmap(self._step(client, masked), in_dims=(0, 0, 0, 0, 0, 0, lr_dim), randomness="different")
            if self.compile == "aot_eager":
                step = torch.compile(step, backend="aot_eager", dynamic=False)
            elif self.compile != "off":
                step = torch.compile(step, mode=None if self.compile == "default" else self.compile, dynamic=False)
            self._steps[key] = step
        return self._steps[key]

    def _step(self, client: LocalSGD, masked: bool):
        """One step of every client; ``masked``: a zero-weight (padded) batch leaves its carry as it is."""
        loss_grad = grad(self.fm.loss)

        def step(carry, aux, xb, yb, wb, kb, lr):
            new = client.client_step(carry, aux, loss_grad(carry["y"], xb, yb, wb, kb), lr)
            if not masked:
                return new
            live = wb.sum() > 0
            return {k: {n: torch.where(live, v, carry[k][n]) for n, v in g.items()} for k, g in new.items()}

        return step

    def train(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
              lr: Lr, states: State | None = None, sent: list[State] | None = None) -> tuple[Params, State]:
        self.fm.train(True)
        # the stacked models in the standard layout: stacking channels-last weights keeps their strides,
        # which measured 15-25% slower vmapped convolutions on CPU
        starts = {n: v.contiguous() for n, v in _stacked(starts).items()}
        states, sent = states or {}, _stacked(sent or [])
        first = next(iter(starts.values()))
        if not isinstance(lr, (int, float)):
            lr = torch.as_tensor(lr, dtype=first.dtype, device=first.device)
        lr_dim = 0 if isinstance(lr, torch.Tensor) else None
        carry, aux = vmap(client.client_init)(starts, states, sent)
        # the steps every client really takes need no mask (the plan says which, on the host): only the
        # last steps of a round, where clients with fewer batches are padded, pay for it
        all_live = min(plan.steps)
        for k in range(plan.max_steps):
            step = self._vmapped_step(client, lr_dim, masked=k >= all_live)
            idx = plan.idx[:, k]  # [S, B]
            carry = step(carry, aux, x[idx], y[idx], plan.weight[:, k], plan.keys[:, k], lr)
        steps = torch.tensor(plan.steps, dtype=first.dtype, device=first.device)  # K_i
        return vmap(client.client_final, in_dims=(0, 0, 0, 0, 0, lr_dim))(starts, states, sent, carry, steps, lr)

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float) -> Params:
        return self.train(LOCAL_SGD, [params] * plan.num_clients, plan, x, y, lr)[0]


def _process_pool(fm: FunctionalModel) -> Executor:
    """``fedsl.engine.pool.ProcessPoolExecutor`` (imported on use: it imports this module)."""
    from fedsl.engine.pool import ProcessPoolExecutor
    return ProcessPoolExecutor(fm)


EXECUTORS = {"sequential": SequentialExecutor, "vectorised": VectorisedExecutor, "processes": _process_pool}


def make_executor(name: str, fm: FunctionalModel, device: torch.device, compile: str = "off") -> Executor:
    """``auto`` picks by device, from measurement: sequential on CPU, vectorised on CUDA.
    ``processes`` (CPU only) spreads a round's clients over worker processes (``fedsl.engine.pool``).
    ``compile`` (``VectorisedExecutor``) captures the vectorised step with ``torch.compile``."""
    if name == "auto":
        name = "vectorised" if device.type == "cuda" else "sequential"
    if name not in EXECUTORS:
        raise ValueError(f"executor = {name!r}: expected one of {['auto', *EXECUTORS]}")
    if name == "processes" and device.type != "cpu":
        raise ValueError(f"executor = 'processes' runs on CPU, not {device.type}: use 'vectorised' or 'auto' there")
    if compile != "off":
        if name != "vectorised":
            raise ValueError(f"compile = {compile!r} captures the vectorised step: expected executor = 'vectorised' "
                             f"(or 'auto' on a GPU), not {name!r}")
        return VectorisedExecutor(fm, compile)
    return EXECUTORS[name](fm)
