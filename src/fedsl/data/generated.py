"""Federations of generated devices, made on demand for any N: what the synthetic cross-device benchmarks share.

A benchmark (``synthetic_fedprox``: Synthetic(α, β) of FedProx; ``synthetic_leaf``: LEAF's synthetic data) gives
its clients' sizes and a ``device_of(k)``: client k's distribution (a ``Device``: ``draw(gen, n)`` makes n samples
from a generator) and its generator rng(seed, SYNTHETIC_CLIENT, k) positioned after the device's own draws, so
that its training samples come next. From these alone, here:

- client k's training samples: the first ⌊0.9·n_k⌋ of its stream (their train / test split), rebuilt from
  (seed, k) each time it is sampled (``OnDemandClients``); its held-out samples, n_k − ⌊0.9·n_k⌋ of them, from a
  stream of their own, rng(seed, SYNTHETIC_TEST, k), so that a test set of many clients does not draw their
  training samples too (the samples are i.i.d. given the client, so either way is the split in law);
- the test set: the held-out samples of ``data.synthetic_test_clients`` clients drawn once from (seed,
  SYNTHETIC_TEST), all N when N is not larger;
- the validation set (``data.validation`` = f > 0): every client trains on ⌊0.9·n_k⌋ − v_k samples, v_k =
  ⌊f·⌊0.9·n_k⌋⌋ (at least one left), and the v_k set aside of ``data.synthetic_test_clients`` clients drawn once
  from (seed, VALIDATION) make the validation set, from a stream of their own, rng(seed, VALIDATION, k) (as the
  test set's: i.i.d. given the client, so the split in law), appended to the pool after D0;
- the server's D0 (``data.server_source``), drawn as the FSL paper's sources are: ``iid``, n0 fresh samples of the
  clients' mixture (a position of the n training samples drawn uniformly, one sample of its client's distribution
  from rng(seed, SYNTHETIC_SERVER, k): client k with probability n_k / n, never one of its own samples); or
  ``clients``, c clients drawn once and s of each one's training samples (the paper's Scenario 2: they keep them),
  then ``data.server_size`` as a class-balanced size budget.

The federation keeps each client's training size (its offset: 8 bytes a client), D0 and the test set; a round
makes the S sampled clients' samples, O(S·n_k) work, whatever N.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from fedsl.core.rng import SERVER_DATA, SYNTHETIC_SERVER, SYNTHETIC_TEST, VALIDATION, rng
from fedsl.data.clients import ClientIndex
from fedsl.data.datasets import test_subset
from fedsl.data.federation import Federation
from fedsl.data.partition import PartitionError
from fedsl.data.server_data import balanced_subset

TRAIN_FRACTION = 0.9  # the first ⌊0.9·n_k⌋ samples train, the rest test (FedProx's split, LEAF's default)


class Device(Protocol):
    """One client's distribution."""

    def draw(self, gen: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n samples (x [n, features] float64, y [n] int64) from ``gen``."""
        ...


DeviceOf = Callable[[int], tuple[Device, np.random.Generator]]  # k → client k's device, its generator after it


def train_sizes(sizes: np.ndarray) -> np.ndarray:
    """⌊0.9·n_k⌋: each client's training samples (the float product, as FedProx's ``int(0.9 * num_samples)``)."""
    return (TRAIN_FRACTION * np.asarray(sizes, dtype=np.float64)).astype(np.int64)


def samples(device_of: DeviceOf, seed: int, k: int, n: int, held_out: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    """n of client k's samples: its training data (its stream after its device), or with ``held_out`` its test
    data (rng(seed, SYNTHETIC_TEST, k))."""
    dev, gen = device_of(k)
    return dev.draw(rng(seed, SYNTHETIC_TEST, k) if held_out else gen, n)


class OnDemandClients:
    """The clients' training samples, made on demand (``Federation.on_demand``): client k's are the first
    ⌊0.9·n_k⌋ of its stream, rebuilt from (seed, k) each time it is sampled; nothing per client is held but its
    offset."""

    def __init__(self, seed: int, device_of: DeviceOf, clients: ClientIndex, features: int) -> None:
        self.seed, self.device_of, self.clients, self.features = seed, device_of, clients, features

    def samples(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        sizes = self.clients.sizes_of(ids)
        parts = [samples(self.device_of, self.seed, int(k), int(n)) for k, n in zip(ids, sizes)]
        if not parts:
            return np.zeros((0, self.features)), np.zeros(0, dtype=np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def held_out_set(seed: int, sizes: np.ndarray, device_of: DeviceOf, max_clients: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The held-out samples (n_k − ⌊0.9·n_k⌋ each) of min(N, ``max_clients``) clients: all N, or a uniform draw
    from (seed, ``SYNTHETIC_TEST``); returns (x, y, the clients' ids)."""
    n = len(sizes)
    ids = np.arange(n) if n <= max_clients else np.sort(rng(seed, SYNTHETIC_TEST).choice(n, max_clients,
                                                                                        replace=False))
    held = sizes[ids] - train_sizes(sizes[ids])
    parts = [samples(device_of, seed, int(k), int(m), held_out=True) for k, m in zip(ids, held)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), ids


def validation_sizes(train: np.ndarray, fraction: float) -> np.ndarray:
    """v_k = ⌊f·t_k⌋ of each client's t_k training samples set aside (at most t_k − 1); zeros when f = 0."""
    if not fraction:
        return np.zeros_like(train)
    return np.minimum((fraction * train.astype(np.float64)).astype(np.int64), np.maximum(train - 1, 0))


def validation_set(seed: int, held: np.ndarray, device_of: DeviceOf, max_clients: int, features: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The v_k = ``held`` samples set aside of min(N, ``max_clients``) clients drawn once from (seed, VALIDATION)
    (all N when N is not larger), each from rng(seed, VALIDATION, k); empty when nothing is held."""
    n = len(held)
    if not held.any():
        return np.zeros((0, features)), np.zeros(0, dtype=np.int64)
    ids = np.arange(n) if n <= max_clients else np.sort(rng(seed, VALIDATION).choice(n, max_clients, replace=False))
    parts = [device_of(int(k))[0].draw(rng(seed, VALIDATION, int(k)), int(held[k])) for k in ids if held[k]]
    if not parts:
        raise PartitionError("data.validation: the clients drawn for the validation set set aside no sample "
                             "(⌊f·t_k⌋ = 0 for each): expected a larger fraction")
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def server_iid(seed: int, clients: ClientIndex, size: int, device_of: DeviceOf, features: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """n0 = ``size`` fresh samples of the clients' mixture (of the devices ``device_of`` gives: the clients' own,
    or shifted ones): a position of the n training samples drawn uniformly (rng(seed, SERVER_DATA)), one sample of
    its client's distribution (rng(seed, SYNTHETIC_SERVER, k)); ordered by client."""
    if size == 0:
        return np.zeros((0, features)), np.zeros(0, dtype=np.int64)
    pos = rng(seed, SERVER_DATA).integers(0, clients.total, size)
    owners = np.searchsorted(clients.offsets, pos, side="right") - 1
    xs, ys = [], []
    for k, count in zip(*np.unique(owners, return_counts=True)):
        dev, _ = device_of(int(k))
        x, y = dev.draw(rng(seed, SYNTHETIC_SERVER, int(k)), int(count))
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def server_from_clients(seed: int, clients: ClientIndex, num_clients: int, per_client: int, device_of: DeviceOf
                        ) -> tuple[np.ndarray, np.ndarray]:
    """D0 from c clients × s of their training samples (Scenario 2), drawn as ``server_data.from_clients`` draws
    from a pool: c clients without replacement from rng(seed, SERVER_DATA, 1), s of each one's samples."""
    n = len(clients)
    if not 1 <= num_clients <= n:
        raise PartitionError(f"data.server_clients = {num_clients}: expected 1..{n} (data.num_clients)")
    gen = rng(seed, SERVER_DATA, 1)
    chosen = gen.choice(n, size=num_clients, replace=False)
    chosen = np.sort(chosen)
    sizes = dict(zip(chosen.tolist(), clients.sizes_of(chosen).tolist()))
    xs, ys = [], []
    for k in chosen.tolist():
        if per_client > sizes[k]:
            raise PartitionError(f"data.server_samples_per_client = {per_client}: client {k} holds only "
                                 f"{sizes[k]} training samples")
        x, y = samples(device_of, seed, k, int(sizes[k]))
        pick = np.sort(gen.permutation(int(sizes[k]))[:per_client])
        xs.append(x[pick])
        ys.append(y[pick])
    return np.concatenate(xs), np.concatenate(ys)


def federation(d, seed: int, sizes: np.ndarray, device_of: DeviceOf, server_device_of: DeviceOf, features: int,
               classes: int) -> Federation:
    """The federation of clients with n_k = ``sizes`` samples each, client k's distribution ``device_of(k)``, D0
    drawn from ``data.server_source`` (``iid``: from the devices ``server_device_of`` gives), the test set from
    ``data.synthetic_test_clients`` clients; their samples made on demand (see the module docstring)."""
    train = train_sizes(sizes)
    held = validation_sizes(train, d.validation)
    clients = ClientIndex.from_sizes(train - held)
    x_test, y_test, _ = held_out_set(seed, sizes, device_of, d.synthetic_test_clients)
    del sizes  # the test set was its last reader: the federation keeps only the offsets
    x_val, y_val = validation_set(seed, held, device_of, d.synthetic_test_clients, features)
    if d.server_source == "clients":
        x0, y0 = server_from_clients(seed, clients, d.server_clients, d.server_samples_per_client, device_of)
        if d.server_size:
            keep = balanced_subset(y0, d.server_size, seed)
            x0, y0 = x0[keep], y0[keep]
    else:
        x0, y0 = server_iid(seed, clients, d.server_size, server_device_of, features)
    server = np.arange(len(y0), dtype=np.int64)
    validation = len(y0) + np.arange(len(y_val), dtype=np.int64)  # after D0 in the pool
    x0, y0 = np.concatenate([x0.reshape(len(y0), -1), x_val]), np.concatenate([y0, y_val])
    if d.test_size is not None:  # as for every dataset: a class-balanced subset drawn from a fixed stream
        keep = test_subset(y_test, d.test_size)
        x_test, y_test = x_test[keep], y_test[keep]
    return Federation(torch.from_numpy(x0.astype(np.float32)).reshape(-1, features), torch.from_numpy(y0).long(),
                      clients, server, torch.from_numpy(x_test.astype(np.float32)), torch.from_numpy(y_test).long(),
                      num_classes=classes, class_names=[str(c) for c in range(classes)], input_stats=None,
                      unlabelled=server, on_demand=OnDemandClients(seed, device_of, clients, features),
                      validation=validation)


def check_config(d, name: str) -> str | None:
    """What data config ``d`` asks that a generated benchmark (``data.dataset = name``) cannot give (one line), or
    None."""
    if d.server_source == "dataset":
        return ("data.server_source = 'dataset' reads images: expected 'iid' (the clients' mixture) or 'clients' "
                f"with data.dataset = {name!r}")
    if d.unlabelled != "server":
        return (f"data.unlabelled = {d.unlabelled!r} appends images: expected 'server' (D0's samples) with "
                f"data.dataset = {name!r}")
    if d.samples_per_client is not None:
        return (f"data.samples_per_client = {d.samples_per_client}: the clients' sizes of {name!r} follow "
                "its power law (data.synthetic_max_samples caps them): expected it unset")
    if d.classes is not None:
        return f"data.classes: {name!r} has its own classes only: expected it unset"
    return None
