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
from fedsl.models.batchnorm import BATCH_NORMS, WeightedBatchNorm, replace_batchnorm, tracks_running_stats
from fedsl.models.dropout import replace_dropout


def check_model(model: nn.Module) -> None:
    """Refuse modules the engine cannot treat as a pure function of their parameters (BatchNorm is made one:
    ``fedsl.models.batchnorm``)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
            raise ValueError(f"model layer {name!r} is {type(m).__name__} with parameters not yet made (lazy): "
                             "expected a model whose layers know their sizes (e.g. nn.BatchNorm2d(C))")
        if isinstance(m, nn.modules.batchnorm._NormBase) and not isinstance(m, BATCH_NORMS) \
                and m.track_running_stats:
            raise ValueError(
                f"model layer {name!r} is {type(m).__name__} with running statistics: state that federated averaging "
                "does not define; expected track_running_stats=False, BatchNorm (which fedsl handles: "
                "model.batchnorm), GroupNorm/LayerNorm or no normalisation"
            )
    extra = [n for n, _ in model.named_buffers()
             if not n.endswith(".key") and not _batchnorm_buffer(model, n)]
    if extra:
        raise ValueError(f"model has buffers {extra}: expected a model whose only state is its parameters")


def _batchnorm_buffer(model: nn.Module, name: str) -> bool:
    """Whether buffer ``name`` is a BatchNorm layer's (its running statistics: replaced, see ``WeightedBatchNorm``)."""
    owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    return isinstance(owner, (*BATCH_NORMS, WeightedBatchNorm))


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


def _parameter_slots(model: nn.Module) -> dict[str, list[tuple[nn.Module, str]]]:
    """Each parameter's name -> every (module, attribute) that holds it (a tied weight has several)."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        path, _, attr = name.rpartition(".")
        owners.setdefault(id(p), []).append((model.get_submodule(path), attr))
    return {name: owners[id(p)] for name, p in model.named_parameters()}


def _swapped_call(module: nn.Module, slots: dict[str, list[tuple[nn.Module, str]]], params: Params,
                  x: torch.Tensor) -> torch.Tensor:
    """``functional_call(module, params, (x,))`` for a full set of parameters and no buffers, by putting the
    tensors in the modules' parameter slots and back: the same forward, the same operations and numbers, without
    ``functional_call``'s per-call bookkeeping, which outweighs a small model's own forward."""
    saved = [(m, a, m._parameters[a]) for slot in slots.values() for m, a in slot]
    try:
        for name, slot in slots.items():
            for m, a in slot:
                m._parameters[a] = params[name]
        return module(x)
    finally:
        for m, a, p in saved:
            m._parameters[a] = p


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
        self.tracked_stats = tracks_running_stats(model)  # before they are dropped: model.batchnorm's default
        self.norm_names = replace_batchnorm(model)
        self.key_names = replace_dropout(model)
        self.module = model
        self.names = [n for n, _ in model.named_parameters()]
        self._slots = _parameter_slots(model)
        self.has_representation = has_representation(model)
        self._parts = _Parts(model) if self.has_representation else None
        self._frozen: _Parts | None = None  # an evaluation-mode copy for ``represent``, made by ``freeze``

    def params(self) -> Params:
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}

    def _buffers(self, key: torch.Tensor | None, w: torch.Tensor | None, stats: Params | None,
                 prefix: str = "") -> dict[str, torch.Tensor]:
        """What ``functional_call`` sets besides the parameters: dropout's key, BatchNorm's sample weights and
        evaluation statistics (``fedsl.models.batchnorm``), each only where given (a model without BatchNorm has no
        layer to take ``w``; ``statistics`` gives it none)."""
        buffers = {f"{prefix}{n}": key for n in self.key_names} if key is not None else {}
        if w is not None:
            buffers.update({f"{prefix}{n}.sample_weight": w for n in self.norm_names})
        if stats:
            buffers.update({f"{prefix}{n}": v for n, v in stats.items()})
        return buffers

    def forward(self, params: Params, x: torch.Tensor, key: torch.Tensor | None = None,
                w: torch.Tensor | None = None, stats: Params | None = None) -> torch.Tensor:
        """The model's outputs on ``x``; ``key``: dropout's; ``w``: the samples' weights (BatchNorm's training
        statistics count the samples by them: padding, weight 0, not at all); ``stats``: BatchNorm's evaluation
        statistics (``statistics``; None: each batch's own)."""
        buffers = self._buffers(key, w, stats)
        # a captured step (torch.compile) traces functional_call, whose graph does not hold the modules themselves
        if torch.compiler.is_compiling() or buffers or params.keys() != self._slots.keys():
            return functional_call(self.module, {**params, **buffers}, (x,))
        return _swapped_call(self.module, self._slots, params, x)

    def loss(self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             key: torch.Tensor) -> torch.Tensor:
        """Weighted cross-entropy: sum_j w_j * ce_j (w = 1/b on real samples, 0 on padding)."""
        logits = self.forward(params, x, key, w)
        return (F.cross_entropy(logits, y, reduction="none") * w).sum()

    @torch.no_grad()
    def statistics(self, params: Params, source: torch.Tensor | None, batch_size: int = 500) -> Params | None:
        """BatchNorm's evaluation statistics for ``params``: each layer's mean and variance on the inputs
        ``source`` (batches of ``batch_size``, dropout off, every layer normalising by its batch's own), the
        batches' means and unbiased variances averaged, as ``torch.optim.swa_utils.update_bn`` recomputes running
        statistics; buffer name -> tensor, for ``forward(..., stats=)``. None: no BatchNorm, or no ``source``
        (``model.batchnorm = 'batch'``: each evaluated batch normalises by its own)."""
        if not self.norm_names or source is None or not len(source):
            return None
        layers = [self.module.get_submodule(n) for n in self.norm_names]
        training = self.module.training
        self.module.train(False)
        for m in layers:
            m.recording = []
        try:
            for i in range(0, len(source), batch_size):
                self.forward(params, source[i:i + batch_size])
            recorded = [m.recording for m in layers]
        finally:
            for m in layers:
                m.recording = None
            self.module.train(training)
        stats = {}
        for n, rec in zip(self.norm_names, recorded):
            stats[f"{n}.stat_mean"] = torch.stack([r[0] for r in rec]).mean(0)
            stats[f"{n}.stat_var"] = torch.stack([r[1] for r in rec]).mean(0)
        return stats

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    def forward_parts(self, params: Params, x: torch.Tensor, key: torch.Tensor | None = None,
                      w: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, z): ``forward`` computed as head(features(x)), the same layers in the same order."""
        buffers = self._buffers(key, w, None, prefix="model.")
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
            logits, z = fm.forward_parts(params, x, key, w)
            represent = lambda p: fm.represent(p, x)  # the batch's inputs, bound here
        else:
            logits, z, represent = fm.forward(params, x, key, w), None, None
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
             batch_size: int = 500, precision: str = "float32", source: torch.Tensor | None = None
             ) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``params`` on (x, y), without dropout; ``precision``
    "bfloat16" runs the forward passes under bf16 autocast (an opt-in; accuracy difference measured
    in benchmarks/RESULTS-gpu.md). ``source``: the inputs BatchNorm's evaluation statistics are estimated on
    (``FunctionalModel.statistics``; None: each batch's own)."""
    return evaluate_each(fm, [params], x, y, batch_size, precision, source)[0]


@torch.inference_mode()
def evaluate_each(fm: FunctionalModel, models: list[Params], x: torch.Tensor, y: torch.Tensor,
                  batch_size: int = 500, precision: str = "float32", source: torch.Tensor | None = None
                  ) -> list[tuple[float, float]]:
    """``evaluate`` of several models, one after another, with one wait for the device at the end.

    On a GPU, large channels-last batches of one model ran faster than the same models vmapped
    (benchmarks/RESULTS-gpu.md).
    """
    fm.train(False)
    # sums stay on the device until the end: an .item() per batch would wait for the GPU each time
    correct = torch.zeros(len(models), dtype=torch.int64, device=x.device)
    loss = torch.zeros(len(models), dtype=torch.float64, device=x.device)
    for j, params in enumerate(models):
        stats = fm.statistics(params, source, batch_size)
        for i in range(0, len(x), batch_size):
            with _precision(x, precision):
                logits = _widen(fm.forward(params, x[i:i + batch_size], stats=stats))
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

