"""How much arithmetic a model's training costs per sample: what ``executor = "auto"`` weighs a run by."""

from __future__ import annotations

import math

import torch
from torch import nn


def forward_flops(module: nn.Module, input_shape: tuple[int, ...]) -> float:
    """FLOPs of one sample's forward pass (``_layer_flops``)."""
    return sum(_layer_flops(module, input_shape))


def train_flops(module: nn.Module, input_shape: tuple[int, ...]) -> float:
    """FLOPs of one sample's forward and backward pass: 3 × the forward (the backward computes a gradient for the
    weights and one for the inputs, each as costly as the forward), less the input gradient of the layer that reads
    the sample (nothing asks for it). torch's FLOP counter gives the same 35.0 MFLOP for the paper's CIFAR-10 CNN."""
    flops = _layer_flops(module, input_shape)
    return 3.0 * sum(flops) - (flops[0] if flops else 0.0)


def _layer_flops(module: nn.Module, input_shape: tuple[int, ...]) -> list[float]:
    """FLOPs of one sample's forward pass through ``module``'s convolutions, linear and LSTM layers (a multiply-add
    counts 2; element-wise layers, a few percent of a CNN's work, are left out).

    Counted from one forward pass of a zero sample with hooks on ``nn.Conv1d/2d/3d`` and ``nn.Linear``, in eval mode
    and without gradients (batch-norm statistics are left as they were), on the module's device and dtype.
    Counting by hand keeps torch's FLOP counter out: it imports the compiler stack into every process.
    """
    flops: list[float] = []  # per layer, in the order the forward pass calls them

    def conv(m: nn.modules.conv._ConvNd, _inputs, out: torch.Tensor) -> None:
        flops.append(2.0 * out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size))

    def linear(m: nn.Linear, _inputs, out: torch.Tensor) -> None:
        flops.append(2.0 * out.numel() * m.in_features)

    def lstm(m: nn.LSTM, _inputs, out: tuple) -> None:  # per step and layer: 4 gates of (input + hidden) products
        steps = out[0].numel() // m.hidden_size
        flops.append(sum(2.0 * steps * 4 * m.hidden_size * ((m.input_size if k == 0 else m.hidden_size)
                                                             + m.hidden_size) for k in range(m.num_layers)))

    layer = {nn.Linear: linear, nn.LSTM: lstm}
    hooks = [m.register_forward_hook(conv if isinstance(m, nn.modules.conv._ConvNd) else layer[type(m)])
             for m in module.modules() if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear, nn.LSTM))]
    p = next(module.parameters(), None)
    was_training = module.training
    try:
        module.eval()
        with torch.no_grad():
            embeds = any(isinstance(m, nn.Embedding) for m in module.modules())  # reads indices (text), not values
            dtype = torch.long if embeds else p.dtype if p is not None else torch.float32
            module(torch.zeros(1, *input_shape, dtype=dtype, device=p.device if p is not None else "cpu"))
    finally:
        module.train(was_training)
        for h in hooks:
            h.remove()
    return flops
