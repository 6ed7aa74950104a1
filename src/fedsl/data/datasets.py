"""Datasets by name, as arrays, and the federation built from a data config.

Issue 2 ships the offline one, ``synthetic_chars`` (font-rendered characters, generated
deterministically and cached on disk); the loaders of the publishers' formats (CIFAR-10,
EMNIST, STL-10, image folders) plug in here.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsl.data import partition, server_data
from fedsl.data.arrays import ArrayDataset, ImageSet, cached_arrays
from fedsl.data.federation import Federation


def synthetic_chars(chars: str, train_per_class: int, test_per_class: int, seed: int = 0) -> ArrayDataset:
    """Font-rendered characters (offline EMNIST stand-in); test images drawn with another seed."""
    from fedsl.data.synthetic import make_font_chars

    recipe = {"chars": chars, "train": train_per_class, "test": test_per_class, "seed": seed, "v": 2}

    def build() -> dict[str, np.ndarray]:
        xtr, ytr = make_font_chars(chars, per_class=train_per_class, seed=seed)
        xte, yte = make_font_chars(chars, per_class=test_per_class, seed=seed + 10_007)
        return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}

    a = cached_arrays("synthetic_chars", recipe, build)
    return ArrayDataset(ImageSet(a["x_train"], a["y_train"], list(chars)), ImageSet(a["x_test"], a["y_test"], list(chars)))


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [n, H, W(, C)] -> float32 [n, C, H, W] in [0, 1]."""
    t = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    return t.unsqueeze(1) if t.dim() == 3 else t.permute(0, 3, 1, 2).contiguous()


def load_arrays(data_cfg) -> ArrayDataset:
    if data_cfg.dataset == "synthetic_chars":
        return synthetic_chars(data_cfg.chars, data_cfg.train_per_class, data_cfg.test_per_class)
    raise ValueError(f"data.dataset = {data_cfg.dataset!r}: unknown dataset")


def build_federation(data_cfg, seed: int) -> Federation:
    """Load the dataset, partition it over N clients and pick D0, all from ``seed``."""
    ds = load_arrays(data_cfg)
    labels = ds.train.y
    n_pool = len(labels)
    n0 = data_cfg.server_size
    if n0 > n_pool:
        raise partition.PartitionError(f"data.server_size = {n0}: expected at most the {n_pool} training samples")
    server = server_data.iid_per_class(labels, n0, seed) if n0 else np.zeros(0, dtype=np.int64)
    pool = np.arange(n_pool) if data_cfg.server_overlap else np.setdiff1d(np.arange(n_pool), server)
    n_i = data_cfg.samples_per_client or len(pool) // data_cfg.num_clients
    if n_i < 1:
        raise partition.PartitionError(
            f"data.num_clients = {data_cfg.num_clients}: more clients than the {len(pool)} samples available")
    if data_cfg.partition == "classes":
        clients = partition.by_classes(labels, data_cfg.num_clients, data_cfg.classes_per_client, n_i, seed, pool)
    else:
        clients = partition.iid(n_pool, data_cfg.num_clients, n_i, seed, pool)
    return Federation(to_tensor(ds.train.x), torch.from_numpy(labels).long(), clients, server,
                      to_tensor(ds.test.x), torch.from_numpy(ds.test.y).long(),
                      num_classes=len(ds.class_names), class_names=ds.class_names)
