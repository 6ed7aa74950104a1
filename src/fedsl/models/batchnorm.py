"""Batch normalisation as a pure function: statistics from the samples that count, never hidden state.

Why not ``nn.BatchNorm*`` as it is: in training it normalises by the statistics of the whole batch, and the engine
pads a client's short batches with zero-weight copies of a real sample (so that S clients' batches stack), which a
loss ignores and a batch mean would not; and its running statistics are state that changes on every forward pass,
which a function of the parameters (``torch.func``) cannot carry and federated averaging does not define.

``WeightedBatchNorm`` keeps the layer's affine parameters (γ, β: ``weight``, ``bias``, averaged like any other) and
takes the rest through buffers that the engine sets with ``functional_call``, as it sets dropout's keys:

- ``sample_weight`` [b]: the batch's sample weights w_j (1/b on real samples, 0 on padding). In training the layer
  normalises by the weighted mean and (biased) variance over the samples and positions, so padding changes
  nothing; empty (the default): every sample counts alike, as in ``nn.BatchNorm``.
- ``stat_mean``, ``stat_var`` [C]: the statistics an evaluation normalises by (``model.batchnorm``: estimated on a
  reference set of inputs under the evaluated parameters, ``FunctionalModel.statistics``); empty (the default):
  the batch's own, as ``nn.BatchNorm`` without running statistics evaluates.

Where the statistics for evaluation come from is the run's choice (``model.batchnorm``, see
``fedsl.engine.functional``): not running averages accumulated while training (a client's running statistics
follow its own model, which is not the one evaluated), but the statistics of the evaluated model's own layers on a
reference set, recomputed at each evaluation, as ``torch.optim.swa_utils.update_bn`` recomputes them (each batch's
mean and unbiased variance, averaged over the batches).
"""

from __future__ import annotations

import torch
from torch import nn

BATCHNORM_MODES = ("batch", "clients", "server", "local")  # model.batchnorm (local: FedBN, algorithms.local_norm)
BATCHNORM_SAMPLES = 1000  # model.batchnorm_samples: the clients' samples 'clients' estimates them on
BATCHNORM_CLIENTS = 20  # model.batchnorm_clients: the clients whose own models 'local' evaluates
BATCH_NORMS = (nn.modules.batchnorm._BatchNorm,)  # BatchNorm1d/2d/3d, SyncBatchNorm, the lazy ones


class WeightedBatchNorm(nn.Module):
    """BatchNorm over ``num_features`` channels whose training statistics weigh each sample by ``sample_weight``
    and whose evaluation statistics are given (``stat_mean``, ``stat_var``), or the batch's own.

    Args:
        num_features: C, the channels (dimension 1 of the input).
        eps: added to the variance (``nn.BatchNorm``'s ε).
        affine: learnable γ (``weight``) and β (``bias``), as ``nn.BatchNorm``'s.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.num_features, self.eps = int(num_features), float(eps)
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        for name in ("sample_weight", "stat_mean", "stat_var"):
            self.register_buffer(name, torch.zeros(0), persistent=False)
        self.recording: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # see FunctionalModel.statistics

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)  # a channel's value broadcast over samples and positions
        dims = [0, *range(2, x.dim())]
        if self.training or self.stat_mean.numel() == 0:
            if self.sample_weight.numel():
                w = self.sample_weight.to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
            else:
                w = torch.full((x.shape[0],) + (1,) * (x.dim() - 1), 1.0 / x.shape[0], dtype=x.dtype,
                               device=x.device)
            positions = x[0, 0].numel()  # H·W for images, 1 for features
            total = w.sum() * positions
            mean = (x * w).sum(dims) / total
            centred = x - mean.reshape(shape)
            var = (centred * centred * w).sum(dims) / total
            if self.recording is not None:  # estimating evaluation statistics: this batch's mean, unbiased var
                n = x.shape[0] * positions
                self.recording.append((mean.detach(), var.detach() * (n / max(1, n - 1))))
        else:
            mean, var = self.stat_mean.to(x.dtype), self.stat_var.to(x.dtype)
            centred = x - mean.reshape(shape)
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, affine={self.weight is not None}"


def replace_batchnorm(model: nn.Module) -> list[str]:
    """Swap every ``nn.BatchNorm1d/2d/3d`` (and ``SyncBatchNorm``) in ``model`` for a ``WeightedBatchNorm`` holding
    the same γ, β and ε (in place; the running statistics and momentum are dropped: see the module docstring).
    Returns the names of the replaced modules, in module order."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, BATCH_NORMS):
                new = WeightedBatchNorm(child.num_features, child.eps, child.affine)
                if child.affine:
                    with torch.no_grad():
                        new.weight.copy_(child.weight)
                        new.bias.copy_(child.bias)
                new.to(device=child.weight.device if child.affine else None)
                setattr(parent, child_name, new)
    return [n for n, m in model.named_modules() if isinstance(m, WeightedBatchNorm)]


def tracks_running_stats(model: nn.Module) -> bool:
    """Whether some BatchNorm layer of ``model`` (before ``replace_batchnorm``) keeps running statistics."""
    return any(isinstance(m, BATCH_NORMS) and m.track_running_stats for m in model.modules())
