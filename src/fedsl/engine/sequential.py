"""The sequential executor: a round's planned clients trained one after another, each over its real steps.

It runs ``algorithms.base.client_update`` (``client_init``, a ``client_step`` per batch, ``client_final``) for
each client in turn, with the gradient of the client's loss (the model's cross-entropy, plus the rule's
``local_loss`` term if it has one: ``functional.client_gradient``), and no padding. On a small CPU this was as
fast or faster than vmap (measured, benchmarks/RESULTS.md). It is the reference the other executors agree
with: the vectorised one (``executors``) to float rounding, the process pool (``pool``), which runs it on W
workers, bit for bit. ``executors.make_executor`` picks one of the three by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from fedsl.algorithms.base import LOCAL_SGD, LocalSGD, client_update
from fedsl.core.types import Params, State
from fedsl.engine.functional import FunctionalModel, client_gradient, eager_grad
from fedsl.engine.plan import BatchPlan, Lr, client_row, stack_clients


class SequentialExecutor:
    name = "sequential"

    def __init__(self, fm: FunctionalModel) -> None:
        self.fm = fm
        self._grads: dict = {}  # the client's gradient (``client_gradient``), by rule, built once

    def _gradient(self, client: LocalSGD):
        """``client_update``'s ``grad(y, batch, aux)`` for ``client``'s loss."""
        # one entry for every rule without a term: a process-pool worker unpickles a new rule object each call
        key = client if client.local_loss is not None else None
        if key not in self._grads:
            g = client_gradient(self.fm, client, eager_grad)
            self._grads[key] = lambda params, batch, aux: g(params, aux, *batch)
        return self._grads[key]

    def train(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
              lr: Lr, states: State | None = None, sent: list[State] | None = None) -> tuple[Params, State]:
        finals, rows = self.train_each(client, starts, plan, x, y, lr, states, sent)
        return stack_clients(finals), stack_clients(rows)

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
            x_i, row, _ = client_update(client, starts[j], client_row(states, j), sent[j] if sent else {},
                                        self._batches(plan, j, x, y), self._gradient(client), lr_j)
            finals.append(x_i)
            rows.append(row)
        return finals, rows

    @staticmethod
    def _batches(plan: BatchPlan, j: int, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple]:
        """Client j's real batches (no padding): (inputs, labels, weights 1/b, dropout key)."""
        steps = plan.steps[j]
        real = (plan.weight[j, :steps] > 0).sum(-1).tolist()  # real samples come first; the rest is padding
        for k, b in enumerate(real):
            idx = plan.idx[j, k, :b]
            yield x[idx], y[idx], plan.weight[j, k, :b], plan.keys[j, k]

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float) -> Params:
        return self.train(LOCAL_SGD, [params] * plan.num_clients, plan, x, y, lr)[0]
