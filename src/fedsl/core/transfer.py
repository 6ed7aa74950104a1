"""Host-to-device copies that do not make the host wait for the GPU.

A plain ``tensor.to("cuda")`` from ordinary (pageable) host memory is a blocking copy: PyTorch
synchronises the stream after it, so the host waits until every kernel queued before it has run.
A round that copies a few small tensors per run (batch plans, client ids, weights, K_i) then
alternates host work and GPU work instead of overlapping them: with 60 stacked runs that was
hundreds of stream synchronisations per round. A copy from pinned memory with
``non_blocking=True`` is queued like a kernel; PyTorch's pinned-memory cache keeps the host buffer
until the copy has run, so the caller may drop it at once.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t.to(device, dtype)``, queued without a synchronisation when ``t`` is on the host and
    ``device`` is a GPU (see the module docstring); values are the same either way."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def tensor_on(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` (a list of numbers) without a synchronisation."""
    return to_device(torch.as_tensor(values, dtype=dtype), device)
