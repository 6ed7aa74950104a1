"""Executors: run the client half of an algorithm for the planned clients of a round.

Both run ``algorithms.base.client_update`` (``client_init``, a ``client_step`` per batch,
``client_final``) with the gradient of the client's loss (the model's cross-entropy, plus the rule's
``local_loss`` term if it has one: ``functional.client_gradient``); they differ only in how clients
are scheduled:
- ``SequentialExecutor`` (``fedsl.engine.sequential``): ``client_update`` itself, one client after
  another over its real steps (no padding). On a small CPU this was as fast or faster than vmap (measured,
  benchmarks/RESULTS.md).
- ``VectorisedExecutor`` (here): the clients step together, ``torch.func.vmap`` of the three client
  functions over stacked clients; padded steps (zero-weight batches) are masked, exact no-ops.
  What fills a GPU.
They agree to float rounding (tests compare them in float64).
``processes`` (``fedsl.engine.pool``) runs the sequential executor on W worker processes, a
contiguous share of the clients each: bit-identical to it at one thread, W cores busy.

This module is the engine's choice of executor (``make_executor``), so it sits above the other two:
``sequential`` < ``pool`` < ``executors``, the stacking of a plan's clients below them all (``plan``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.func import vmap

from fedsl.algorithms.base import LOCAL_SGD, LocalSGD
from fedsl.core.transfer import tensor_on, to_device
from fedsl.core.types import Params, State
from fedsl.engine.functional import ClientLoss, FunctionalModel, client_gradient
from fedsl.engine.plan import BatchPlan, Lr, stack_clients
from fedsl.engine.pool import ProcessPoolExecutor
from fedsl.engine.sequential import SequentialExecutor


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


COMPILE_MODES = ("off", "cuda-graphs", "default", "reduce-overhead", "max-autotune", "aot_eager")
GRAPHS_KEPT = 4  # captured loops kept per executor (one per shape: a Scenario-2 sweep uses two)
# Longer loops run eagerly: a graph holds every kernel of every step, and pretraining (500 epochs of
# D0: 25,000 steps) would be millions of nodes captured once for one replay. A round's loops are
# K = 5 (Scenario 2), K0 = 50 or K = 100 (Scenario 1) steps.
GRAPH_MAX_STEPS = 1000


@dataclass
class _Captured:
    """A CUDA graph of a round's K vmapped steps, with the static tensors it reads and writes."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple  # (carry, aux, idx, weight, keys, lr): copied into before each replay
    out: dict  # the final carry, overwritten by each replay


class VectorisedExecutor:
    """The clients step together under ``vmap``.

    Args:
        fm: the model.
        compile: how the round's hot loop (K steps of S clients, or of R·S clients of stacked runs) runs:
            "off" (eager); "cuda-graphs" (the whole K-step loop captured once per shape as one CUDA
            graph and replayed: one launch instead of K × hundreds, what a GPU needs for Scenario 2's
            10-image steps; the same kernels as eager, so the same numbers); or ``torch.compile`` of
            the vmapped step: "default" (inductor), "reduce-overhead" (inductor with CUDA graphs),
            "max-autotune", "aot_eager" (the capture alone, no code generation: how the tests check
            the compiled step equals the eager one on a CPU).
    """

    name = "vectorised"

    def __init__(self, fm: FunctionalModel, compile: str = "off") -> None:
        assert compile in COMPILE_MODES, compile  # config validation checks compile
        self.fm, self.compile = fm, compile
        self._steps: dict = {}  # (client, lr batched?) -> the vmapped (and compiled) step, built once
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()  # compile = "cuda-graphs", by shape

    def _vmapped_step(self, client: LocalSGD, lr_dim: int | None, masked: bool):
        key = (client, lr_dim, masked)
        if key not in self._steps:
            # randomness='different' keeps any user module with its own random ops legal under vmap;
            # fedsl's dropout takes its randomness from the (batched) key instead.
            step = vmap(self._step(client, masked), in_dims=(0, 0, 0, 0, 0, 0, lr_dim), randomness="different")
            if self.compile == "aot_eager":
                step = torch.compile(step, backend="aot_eager", dynamic=False)
            elif self.compile not in ("off", "cuda-graphs"):
                step = torch.compile(step, mode=None if self.compile == "default" else self.compile, dynamic=False)
            self._steps[key] = step
        return self._steps[key]

    def _step(self, client: LocalSGD, masked: bool):
        """One step of every client; ``masked``: a zero-weight (padded) batch leaves its carry as it is."""
        loss_grad: ClientLoss = client_gradient(self.fm, client)

        def step(carry, aux, xb, yb, wb, kb, lr):
            new = client.client_step(carry, aux, loss_grad(carry["y"], aux, xb, yb, wb, kb), lr)
            if not masked:
                return new
            live = wb.sum() > 0
            return {k: {n: torch.where(live, v, carry[k][n]) for n, v in g.items()} for k, g in new.items()}

        return step

    def train(self, client: LocalSGD, starts: list[Params], plan: BatchPlan, x: torch.Tensor, y: torch.Tensor,
              lr: Lr, states: State | None = None, sent: list[State] | None = None) -> tuple[Params, State]:
        self.fm.train(True)
        # the stacked models in the standard layout: stacking channels-last weights keeps their strides,
        # which made vmapped convolutions slower on CPU
        starts = {n: v.contiguous() for n, v in stack_clients(starts).items()}
        states, sent = states or {}, stack_clients(sent or [])
        first = next(iter(starts.values()))
        if not isinstance(lr, (int, float)):
            lr = to_device(torch.as_tensor(lr, dtype=first.dtype), first.device)
        lr_dim = 0 if isinstance(lr, torch.Tensor) else None
        carry, aux = vmap(client.client_init)(starts, states, sent)
        # the steps every client really takes need no mask (the plan says which, on the host): only the
        # last steps of a round, where clients with fewer batches are padded, pay for it
        all_live = min(plan.steps)
        if self.compile == "cuda-graphs" and first.is_cuda and plan.max_steps <= GRAPH_MAX_STEPS:
            if lr_dim is None:  # a captured step size would be a constant of the graph: make it an input
                lr, lr_dim = torch.full((plan.num_clients,), float(lr), dtype=first.dtype, device=first.device), 0
            carry = self._replay(client, lr_dim, all_live, (carry, aux, plan.idx, plan.weight, plan.keys, lr), x, y)
        else:
            carry = self._steps_loop(client, lr_dim, all_live, carry, aux, plan.idx, plan.weight, plan.keys, lr, x, y)
        steps = tensor_on(plan.steps, first.device, first.dtype)  # K_i
        return vmap(client.client_final, in_dims=(0, 0, 0, 0, 0, lr_dim))(starts, states, sent, carry, steps, lr)

    def _steps_loop(self, client: LocalSGD, lr_dim: int | None, all_live: int, carry, aux, idx: torch.Tensor,
                    weight: torch.Tensor, keys: torch.Tensor, lr, x: torch.Tensor, y: torch.Tensor):
        """The K vmapped steps of all clients (what ``cuda-graphs`` captures)."""
        for k in range(idx.shape[1]):
            step = self._vmapped_step(client, lr_dim, masked=k >= all_live)
            ik = idx[:, k]  # [S, B]
            carry = step(carry, aux, x[ik], y[ik], weight[:, k], keys[:, k], lr)
        return carry

    def _replay(self, client: LocalSGD, lr_dim: int, all_live: int, inputs: tuple, x: torch.Tensor,
                y: torch.Tensor):
        """``_steps_loop`` as a CUDA graph: captured the first time a shape is seen (after one eager
        warm-up on a side stream, which also lets cuDNN pick its algorithms), then replayed with the
        round's tensors copied into the graph's own. The same kernels run, so replay = eager."""
        flat, spec = torch.utils._pytree.tree_flatten(inputs)
        key = (client, lr_dim, all_live, str(spec), tuple((v.shape, v.dtype) for v in flat), x.data_ptr(),
               y.data_ptr())
        cap = self._graphs.get(key)
        if cap is None:
            static = torch.utils._pytree.tree_map(torch.clone, inputs)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._steps_loop(client, lr_dim, all_live, *static, x, y)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._steps_loop(client, lr_dim, all_live, *static, x, y)
            cap = self._graphs[key] = _Captured(graph, static, out)
            while len(self._graphs) > GRAPHS_KEPT:  # each graph holds its memory pool
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        for dst, src in zip(torch.utils._pytree.tree_leaves(cap.inputs), flat):
            dst.copy_(src)
        cap.graph.replay()
        return torch.utils._pytree.tree_map(torch.clone, cap.out)  # the next replay overwrites cap.out

    def local_sgd(self, params: Params, plan: BatchPlan, x: torch.Tensor, y: torch.Tensor, lr: float) -> Params:
        return self.train(LOCAL_SGD, [params] * plan.num_clients, plan, x, y, lr)[0]


EXECUTORS = {"sequential": SequentialExecutor, "vectorised": VectorisedExecutor, "processes": ProcessPoolExecutor}


def make_executor(name: str, fm: FunctionalModel, device: torch.device, compile: str = "off",
                  workers: int | None = None) -> Executor:
    """``auto`` picks by device, from measurement: sequential on CPU, vectorised on CUDA (a run's config
    resolves 'auto' on a CPU first, by the size of the run: ``experiments.placement.resolve_executor``).
    ``processes`` (CPU only) spreads a round's clients over ``workers`` processes (default: one per usable core;
    ``fedsl.engine.pool``).
    ``compile`` (``VectorisedExecutor``) captures the vectorised step with ``torch.compile``; it needs the
    vectorised executor, and "cuda-graphs" a CUDA device: config validation checks both (``RunConfig``, and
    ``placement.resolve_device`` for device = 'auto'), this function assumes them."""
    if name == "auto":
        name = "vectorised" if device.type == "cuda" else "sequential"
    if name not in EXECUTORS:
        raise ValueError(f"executor = {name!r}: expected one of {['auto', *EXECUTORS]}")
    if name == "processes" and device.type != "cpu":
        raise ValueError(f"executor = 'processes' runs on CPU, not {device.type}: use 'vectorised' or 'auto' there")
    assert compile != "cuda-graphs" or device.type == "cuda", device
    if compile != "off":
        assert name == "vectorised", (compile, name)
        return VectorisedExecutor(fm, compile)
    return ProcessPoolExecutor(fm, workers) if name == "processes" else EXECUTORS[name](fm)
