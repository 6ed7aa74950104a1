"""A torch.nn.Module seen as a pure function of its parameters (torch.func).

Parameters travel as ``dict[name, Tensor]``; a stacked (vmapped) set has a leading
client dimension on every tensor. The executors take ``torch.func.grad`` of the client's loss
(``client_gradient``: ``loss`` below, plus the rule's ``local_loss`` term when it has one) and
hand it to the algorithm's client step (``algorithms.base``); the sequential executor, which takes the
gradient of one model at a time, takes it by plain autograd instead (``eager_grad``: the same numbers).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedsl.algorithms.base import LocalBatch, LocalSGD
from fedsl.core.types import Params, State
from fedsl.models import has_representation
from fedsl.models.dropout import replace_dropout


def check_model(model: nn.Module) -> None:
    """Refuse modules the engine cannot treat as a pure function of their parameters."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            raise ValueError(
                f"model layer {name!r} is {type(m).__name__}: batch-norm running statistics are state that "
                "federated averaging does not define (fedsl neither averages them nor keeps them per client, FedBN); "
                "use GroupNorm/LayerNorm or no normalisation"
            )
        if isinstance(m, nn.modules.batchnorm._NormBase):
            # no running statistics, but a batch's own: the engine pads a client's short batches with zero-weight
            # copies of a real sample, which a loss ignores and batch statistics would not
            raise ValueError(
                f"model layer {name!r} is {type(m).__name__} without running statistics: its statistics over a "
                "batch would count the zero-weight rows the engine pads a client's short batches with; use "
                "GroupNorm/LayerNorm or no normalisation"
            )
    extra = [n for n, _ in model.named_buffers() if not n.endswith(".key")]
    if extra:
        raise ValueError(f"model has buffers {extra}: expected a model whose only state is its parameters")


class _Parts(nn.Module):
    """``model`` called through its representation (``functional_call`` calls a module's forward only)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, part: str):
        z = self.model.features(x)
        return z if part == "features" else (self.model.head(z), z)


def reinitialise_(model: nn.Module, seed: int) -> nn.Module:
    """Draw ``model``'s parameters afresh from ``seed`` (in place): every submodule's own ``reset_parameters()``
    (PyTorch's layer defaults), in ``model.modules()`` order, from a generator seeded with ``seed``; the caller's
    random state is left as it was. ValueError, one line, for a parameter no ``reset_parameters`` draws."""
    owners = [m for m in model.modules() if callable(getattr(m, "reset_parameters", None))]
    drawn = {id(p) for m in owners for p in m.parameters()}
    loose = [n for n, p in model.named_parameters() if id(p) not in drawn]
    if loose:
        raise ValueError(f"model parameter {loose[0]!r} belongs to a module without reset_parameters(), so a seed "
                         "cannot draw it: expected layers that have one, or a model built under "
                         "torch.manual_seed(seed) and wrapped without seed=")
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        for m in owners:
            m.reset_parameters()
    return model


class FunctionalModel:
    """Wraps ``model`` (dropout made key-driven) as a pure function of its parameters, with a pure loss.

    ``seed``: None keeps the module's parameters as they are (its own initialisation, or pretrained weights); an
    int draws them afresh from it (``reinitialise_``: PyTorch's layer defaults), so that x_0, and with the
    simulator's seed the whole run, is a function of the seeds alone.

    ``has_representation``: the model exposes its representation z (``features``/``head`` methods,
    ``fedsl.models.has_representation``), which ``forward_parts`` and ``represent`` return.
    """

    def __init__(self, model: nn.Module, seed: int | None = None) -> None:
        check_model(model)
        if seed is not None:
            reinitialise_(model, seed)
        self.key_names = replace_dropout(model)
        self.module = model
        self.names = [n for n, _ in model.named_parameters()]
        self.has_representation = has_representation(model)
        self._parts = _Parts(model) if self.has_representation else None
        self._frozen: _Parts | None = None  # an evaluation-mode copy for ``represent``, made by ``freeze``

    def params(self) -> Params:
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}

    def forward(self, params: Params, x: torch.Tensor, key: torch.Tensor | None = None) -> torch.Tensor:
        buffers = {n: key for n in self.key_names} if key is not None else {}
        return functional_call(self.module, {**params, **buffers}, (x,))

    def loss(self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             key: torch.Tensor) -> torch.Tensor:
        """Weighted cross-entropy: sum_j w_j * ce_j (w = 1/b on real samples, 0 on padding)."""
        logits = self.forward(params, x, key)
        return (F.cross_entropy(logits, y, reduction="none") * w).sum()

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    def forward_parts(self, params: Params, x: torch.Tensor, key: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, z): ``forward`` computed as head(features(x)), the same layers in the same order."""
        buffers = {f"model.{n}": key for n in self.key_names} if key is not None else {}
        return functional_call(self._parts, {**{f"model.{n}": p for n, p in params.items()}, **buffers}, (x, "both"))

    def freeze(self) -> None:
        """Make the evaluation-mode copy ``represent`` runs (once, outside any vmap or capture: its own
        ``training`` flag stays False whatever ``train`` sets, so no dropout reaches it)."""
        if self._frozen is None and self._parts is not None:
            self._frozen = copy.deepcopy(self._parts).train(False)

    def represent(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        """z of ``x`` under ``params``, dropout off (``freeze`` first)."""
        assert self._frozen is not None, "FunctionalModel.freeze() makes the copy represent runs"
        return functional_call(self._frozen, {f"model.{n}": p for n, p in params.items()}, (x, "features"))


ClientLoss = Callable[..., Params]  # grad(y, aux, inputs, labels, weights, key) -> the gradient at y
Transform = Callable[[Callable[..., torch.Tensor]], Callable[..., Params]]


def eager_grad(f: Callable[..., torch.Tensor]) -> Callable[..., Params]:
    """``torch.func.grad(f)`` for one model, by plain autograd: the gradient of the scalar ``f(params, *args)``
    with respect to the dict ``params``, by the same backward kernels, so the same numbers.

    For the sequential executor, which never vmaps or compiles the gradient: functorch's transform sends every
    operation through a wrapper, and its first call imports torch._dynamo, which a short-lived process (a Flower
    ClientApp, one per message) would pay for on each message.
    """
    def gradient(params: Params, *args) -> Params:
        with torch.enable_grad():
            leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
            grads = torch.autograd.grad(f(leaves, *args), list(leaves.values()), allow_unused=True)
        return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(leaves.items(), grads)}
    return gradient


def client_gradient(fm: FunctionalModel, client: LocalSGD, transform: Transform = grad) -> ClientLoss:
    """The gradient the client steps on, ``g(y, aux, inputs, labels, weights, key)``: of ``fm.loss`` for rules
    without a ``local_loss``; for one with it, of the weighted cross-entropy plus the rule's term, where the
    logits come from ``forward_parts`` (the same operations as ``forward``) when the model has a representation.
    A pure function of its arguments: the executors vmap it over clients and capture it in CUDA graphs.
    ``transform``: ``torch.func.grad`` (vmappable), or ``eager_grad`` for one model at a time."""
    term = client.local_loss
    if term is None:
        plain = transform(fm.loss)
        return lambda y, aux, *batch: plain(y, *batch)
    fm.freeze()

    def loss(params: Params, aux: State, x: torch.Tensor, labels: torch.Tensor, w: torch.Tensor,
             key: torch.Tensor | None) -> torch.Tensor:
        if fm.has_representation:
            logits, z = fm.forward_parts(params, x, key)
            represent = lambda p: fm.represent(p, x)  # the batch's inputs, bound here
        else:
            logits, z, represent = fm.forward(params, x, key), None, None
        ce = (F.cross_entropy(logits, labels, reduction="none") * w).sum()
        return ce + term(params, aux, LocalBatch(x, labels, w, logits, z, represent))

    return transform(loss)


EVAL_PRECISIONS = ("float32", "bfloat16")


def _precision(x: torch.Tensor, precision: str):
    """The context of an evaluation's forward passes: as trained, or under bfloat16 autocast
    (convolutions and matrix products in bf16 on tensor cores, losses and sums in float32)."""
    assert precision in EVAL_PRECISIONS, precision  # config validation checks eval_precision
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(x.device.type, dtype=torch.bfloat16)


def _widen(logits: torch.Tensor) -> torch.Tensor:
    """bf16 logits (autocast) to float32 for the loss; float32 and float64 ones as they are."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


def evaluate(fm: FunctionalModel, params: Params, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 500, precision: str = "float32") -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y), without dropout; ``precision``
    "bfloat16" runs the forward passes under bf16 autocast (an opt-in; accuracy difference measured
    in benchmarks/RESULTS-gpu.md)."""
    return evaluate_each(fm, [params], x, y, batch_size, precision)[0]


@torch.inference_mode()
def evaluate_each(fm: FunctionalModel, models: list[Params], x: torch.Tensor, y: torch.Tensor,
                  batch_size: int = 500, precision: str = "float32") -> list[tuple[float, float]]:
    """``evaluate`` of several models, one after another, with one wait for the device at the end.

    On a GPU, large channels-last batches of one model ran faster than the same models vmapped
    (benchmarks/RESULTS-gpu.md).
    """
    fm.train(False)
    # sums stay on the device until the end: an .item() per batch would wait for the GPU each time
    correct = torch.zeros(len(models), dtype=torch.int64, device=x.device)
    loss = torch.zeros(len(models), dtype=torch.float64, device=x.device)
    for j, params in enumerate(models):
        for i in range(0, len(x), batch_size):
            with _precision(x, precision):
                logits = _widen(fm.forward(params, x[i:i + batch_size]))
            yb = y[i:i + batch_size]
            loss[j] += F.cross_entropy(logits, yb, reduction="sum").double()
            correct[j] += (logits.argmax(1) == yb).sum()
    return [(c / len(x), s / len(x)) for c, s in zip(correct.tolist(), loss.tolist())]


@torch.inference_mode()
def evaluate_many(fm: FunctionalModel, stacked: Params, x: torch.Tensor, y: torch.Tensor,
                  batch_size: int = 500, precision: str = "float32") -> list[tuple[float, float]]:
    """``evaluate`` for R models stacked on a leading dim, in one vmapped pass per batch.

    The R models see each test batch together; memory is R × batch activations, so the
    caller picks ``batch_size`` (R × batch_size samples per forward).
    """
    fm.train(False)
    r = next(iter(stacked.values())).shape[0]
    fwd = vmap(fm.forward, in_dims=(0, None))
    correct = torch.zeros(r, dtype=torch.int64, device=x.device)
    loss = torch.zeros(r, dtype=torch.float64, device=x.device)
    for i in range(0, len(x), batch_size):
        with _precision(x, precision):
            logits = _widen(fwd(stacked, x[i:i + batch_size]))  # [R, b, classes]
        yb = y[i:i + batch_size]
        ce = F.cross_entropy(logits.flatten(0, 1), yb.repeat(r), reduction="none").view(r, -1)
        loss += ce.sum(1).double()
        correct += (logits.argmax(2) == yb).sum(1)
    return [(c / len(x), s / len(x)) for c, s in zip(correct.tolist(), loss.tolist())]


def full_gradient(fm: FunctionalModel, params: Params, x: torch.Tensor, y: torch.Tensor,
                  batch_size: int = 1000) -> Params:
    """∇f(params) of the mean loss over all of (x, y), dropout off (for diagnostics and tests)."""
    fm.train(False)
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    ones = torch.ones(len(x), dtype=next(iter(params.values())).dtype, device=x.device) / len(x)
    for i in range(0, len(x), batch_size):
        g = grad(fm.loss)(params, x[i:i + batch_size], y[i:i + batch_size], ones[i:i + batch_size], None)
        for n in total:
            total[n] += g[n]
    return total

