"""Shared type aliases: a model's parameters and a rule's state, as plain dicts of tensors."""

from __future__ import annotations

import torch

Params = dict[str, torch.Tensor]  # parameter name -> tensor; stacked sets have a leading [S, ...] dimension
State = dict[str, Params]  # named groups of tensors, e.g. {"c": ..., "c_i": stacked [N, ...]}
