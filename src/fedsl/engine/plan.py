"""Batch plans: which samples each client uses at each local step, fixed before training.

A plan for S clients is three arrays: ``idx`` [S, K, B] indices into the data pool,
``weight`` [S, K, B] with 1/b for the b real samples of a batch and 0 for padding, and
``keys`` [S, K] dropout keys. Clients with fewer samples or steps get zero-weight
(no-op) steps, as FedJAX pads blocks, so all clients of a round can train in lock-step.
The last batch of an epoch may be smaller than B (no sample is dropped).

The executors take the plan's clients along that leading dimension [S]: their starting models and
states stacked (``stack_clients``), one client's row read back (``client_row``), one step size η_l
for all or one each (``Lr``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedsl.core.rng import DROPOUT, rng
from fedsl.core.transfer import to_device
from fedsl.core.types import State

Lr = float | Sequence[float] | torch.Tensor  # one η for all clients, or one per client


@dataclass(frozen=True)
class BatchPlan:
    idx: torch.Tensor  # [S, K, B] int64
    weight: torch.Tensor  # [S, K, B] float (1/b on real samples, 0 on padding)
    keys: torch.Tensor  # [S, K] int64, dropout keys in [0, 2**32)
    steps: tuple[int, ...]  # real number of steps of each client

    @property
    def num_clients(self) -> int:
        return self.idx.shape[0]

    @property
    def max_steps(self) -> int:
        return self.idx.shape[1]

    def to(self, device: torch.device, dtype: torch.dtype) -> "BatchPlan":
        # queued copies: a plan is made on the host every round, and a blocking copy would make the
        # host wait for the GPU's queue (fedsl.core.transfer)
        return BatchPlan(to_device(self.idx, device), to_device(self.weight, device, dtype),
                         to_device(self.keys, device), self.steps)


def stack_clients(items: list):
    """A list of per-client Params or States, stacked on a leading dim ({} for none)."""
    if not items or not items[0]:
        return {}
    first = items[0]
    if isinstance(next(iter(first.values())), dict):
        return {k: {n: torch.stack([it[k][n] for it in items]) for n in g} for k, g in first.items()}
    return {n: torch.stack([it[n] for it in items]) for n in first}


def client_row(state: State | None, j: int) -> State:
    """Client j's row of a State stacked by ``stack_clients`` ({} for none)."""
    return {k: {n: v[j] for n, v in g.items()} for k, g in (state or {}).items()}


def client_batches(indices: np.ndarray, batch_size: int, epochs: int, steps: int | None,
                   gen: np.random.Generator) -> list[np.ndarray]:
    """The batches of one client: a fresh permutation per epoch, split into batches of B.

    ``steps`` (K), when given, overrides ``epochs``: as many epochs as needed are drawn and
    the first K batches kept.
    """
    n = len(indices)
    per_epoch = math.ceil(n / batch_size)
    k = steps if steps is not None else epochs * per_epoch
    batches: list[np.ndarray] = []
    while len(batches) < k:
        perm = indices[gen.permutation(n)]
        batches.extend(perm[j:j + batch_size] for j in range(0, n, batch_size))
    return batches[:k]


def planned_steps(n: int, batch_size: int, epochs: int, steps: int | None) -> int:
    """K_i of a client with n samples: ``steps`` when given, else ``epochs`` × ⌈n / B⌉ (``client_batches``)."""
    return steps if steps is not None else epochs * math.ceil(n / batch_size)


def truncate(plan: BatchPlan, steps: tuple[int, ...]) -> BatchPlan:
    """``plan`` with client j doing only its first ``steps[j]`` steps (stragglers): the later ones become
    zero-weight no-ops, exactly as if the client had been planned with ``steps[j]`` steps (its first batches
    and dropout keys are the same draws)."""
    if tuple(steps) == plan.steps:
        return plan
    idx, weight, keys = plan.idx.clone(), plan.weight.clone(), plan.keys.clone()
    for j, (k, k_old) in enumerate(zip(steps, plan.steps)):
        if not 1 <= k <= k_old:
            raise ValueError(f"client {j}: {k} steps, expected 1 to its planned {k_old}")
        idx[j, k:], weight[j, k:], keys[j, k:] = 0, 0, 0
    kmax = max(steps)
    return BatchPlan(idx[:, :kmax], weight[:, :kmax], keys[:, :kmax], tuple(steps))


def make_plan(datasets: list[np.ndarray], ids: list[int], batch_size: int, epochs: int, steps: int | None,
              seed: int, round_: int, stream: int) -> BatchPlan:
    """Plan for several clients: client ``ids[j]`` trains on ``datasets[j]``.

    Its batch order and dropout keys come from ``rng(seed, round_, stream, id)``, so a
    client can compute its own plan from its id alone (as a Flower client would) and the
    plan does not depend on which other clients were sampled.
    """
    per_client: list[list[np.ndarray]] = []
    keys: list[np.ndarray] = []
    for data, cid in zip(datasets, ids):
        batches = client_batches(np.asarray(data), batch_size, epochs, steps, rng(seed, round_, stream, cid))
        per_client.append(batches)
        keys.append(rng(seed, round_, stream + DROPOUT, cid).integers(0, 2**32, size=len(batches), dtype=np.int64))
    s, kmax = len(datasets), max((len(b) for b in per_client), default=0)  # a round may have no client
    idx = np.zeros((s, kmax, batch_size), dtype=np.int64)
    weight = np.zeros((s, kmax, batch_size), dtype=np.float64)
    key_arr = np.zeros((s, kmax), dtype=np.int64)
    for j, batches in enumerate(per_client):
        for k, b in enumerate(batches):
            idx[j, k, : len(b)] = b
            idx[j, k, len(b):] = b[0]  # padding points at a real sample; its weight is 0
            weight[j, k, : len(b)] = 1.0 / len(b)
        key_arr[j, : len(batches)] = keys[j]
    return BatchPlan(torch.from_numpy(idx), torch.from_numpy(weight), torch.from_numpy(key_arr),
                     tuple(len(b) for b in per_client))


def concat_plans(plans: list[BatchPlan], offsets: list[int] | None = None) -> BatchPlan:
    """One plan for the clients of several plans (stacked runs), padded to a common K and B.

    Padded steps and samples have zero weight, so they are exact no-ops; ``offsets[r]`` is
    added to plan r's indices when the runs' pools are concatenated.
    """
    kmax = max(p.max_steps for p in plans)
    bmax = max(p.idx.shape[2] for p in plans)
    idx, weight, keys = [], [], []
    for r, p in enumerate(plans):
        s, k, b = p.idx.shape
        i = torch.zeros((s, kmax, bmax), dtype=p.idx.dtype, device=p.idx.device)
        i[:, :k, :b] = p.idx + (offsets[r] if offsets else 0)
        i[:, :k, b:] = i[:, :k, :1]  # padding points at a real sample of the same batch; weight 0
        w = torch.zeros((s, kmax, bmax), dtype=p.weight.dtype, device=p.weight.device)
        w[:, :k, :b] = p.weight
        kk = torch.zeros((s, kmax), dtype=p.keys.dtype, device=p.keys.device)
        kk[:, :k] = p.keys
        idx.append(i)
        weight.append(w)
        keys.append(kk)
    return BatchPlan(torch.cat(idx), torch.cat(weight), torch.cat(keys), tuple(s for p in plans for s in p.steps))
