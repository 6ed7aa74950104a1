"""Parameters <-> Flower records, bit for bit (dtype and values kept; layout made contiguous)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from fedsl.algorithms.base import State
from fedsl.core.types import Params

SEP = "/"  # state entry / parameter name, e.g. "c/conv1.weight"

# Flower's own config key for a hyper-parameter, where it has one (FedProx's μ); others go by their name.
FLOWER_KEYS = {"mu": "proximal-mu"}


def local_keys(spec) -> dict[str, str]:
    """The hyper-parameters of an algorithm's local step that a train message carries:
    rule attribute -> config key (the spec's ``local_keys``: FedProx's μ, FedDyn's α, FedNova's ρ)."""
    return {k: FLOWER_KEYS.get(k, k) for k in (spec.local_keys if spec is not None else ())}


def to_record(params: Params) -> ArrayRecord:
    """A model (or any named tensors) as an ArrayRecord."""
    return ArrayRecord({n: Array(np.ascontiguousarray(p.detach().cpu().numpy())) for n, p in params.items()})


def from_record(record: ArrayRecord, device: torch.device | None = None, dtype: torch.dtype | None = None,
                names: list[str] | None = None) -> Params:
    """An ArrayRecord as named tensors; with ``names``, exactly those names are expected, in that order."""
    if names is not None and sorted(record.keys()) != sorted(names):
        raise ValueError(f"received arrays {sorted(record.keys())}: expected the model's parameters {sorted(names)}")
    keys = names if names is not None else list(record.keys())
    out = {}
    for n in keys:
        t = torch.from_numpy(np.array(record[n].numpy(), copy=True))
        out[n] = t.to(device=device or t.device, dtype=dtype or t.dtype)
    return out


def state_to_record(state: State) -> ArrayRecord:
    """Named groups of tensors ({"c": {...}}) as one flat ArrayRecord ("c/<param>")."""
    return to_record({f"{group}{SEP}{n}": v for group, params in state.items() for n, v in params.items()})


def state_from_record(record: ArrayRecord, device: torch.device | None = None,
                      dtype: torch.dtype | None = None) -> State:
    out: State = {}
    for key, value in from_record(record, device, dtype).items():
        group, _, name = key.partition(SEP)
        out.setdefault(group, {})[name] = value
    return out
