"""Per-client accuracy of the global model: the spread that fairness methods (q-FedAvg) aim to narrow.

A client's accuracy is the global model's test accuracy on that client's label mix,

    acc_i = Σ_c p_i(c) · acc_c,      p_i(c) = n_i(c) / n_i (its training labels),  acc_c = accuracy on test class c,

which is the accuracy it would see on test samples drawn with its own label proportions. That is the usual
measure for label-skewed partitions, where a client's test set is the global one reweighted (classes absent from
the test set drop out, the others renormalised). For a natural partition (writers, roles) it measures the label
part of a client's difference only: its own samples' look is not in it. Over the N clients: the mean, the
standard deviation (population: all N clients, not a sample) and the mean of the worst 10% (⌈N/10⌉ clients).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fedsl.data.federation import Federation
from fedsl.engine.functional import FunctionalModel, _precision, _widen

COLUMNS = ("client_acc_mean", "client_acc_std", "client_acc_worst10")


def label_mix(fed: Federation) -> np.ndarray:
    """[N, C] p_i(c): each client's share of each label in its own training samples (its D_i, not D0)."""
    y = fed.y.cpu().numpy()
    counts = np.zeros((len(fed.clients), fed.num_classes), dtype=np.float64)
    np.add.at(counts, (fed.clients.owners(), y[fed.clients.indices]), 1.0)
    return counts / np.maximum(1.0, counts.sum(1, keepdims=True))


@torch.inference_mode()
def class_scores(fm: FunctionalModel, params, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 batch_size: int = 500, precision: str = "float32", stats=None) -> tuple[np.ndarray, np.ndarray]:
    """([C] acc_c, [C] mean cross-entropy of class c) on (x, y) (NaN for a class with no test sample), dropout off;
    ``stats``: BatchNorm's evaluation statistics (``FunctionalModel.statistics``)."""
    fm.train(False)
    correct = torch.zeros(num_classes, dtype=torch.int64, device=x.device)
    total = torch.zeros(num_classes, dtype=torch.int64, device=x.device)
    loss = torch.zeros(num_classes, dtype=torch.float64, device=x.device)
    for i in range(0, len(x), batch_size):
        with _precision(x, precision):
            logits = _widen(fm.forward(params, x[i:i + batch_size], stats=stats))
        yb = y[i:i + batch_size]
        total += torch.bincount(yb, minlength=num_classes)
        correct += torch.bincount(yb[logits.argmax(1) == yb], minlength=num_classes)
        loss.index_add_(0, yb, F.cross_entropy(logits, yb, reduction="none").double())
    c, t = correct.cpu().numpy().astype(np.float64), total.cpu().numpy().astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(t > 0, c / t, np.nan), np.where(t > 0, loss.cpu().numpy() / t, np.nan)


def class_accuracy(fm: FunctionalModel, params, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                   batch_size: int = 500, precision: str = "float32", source: torch.Tensor | None = None
                   ) -> np.ndarray:
    """[C] acc_c on (x, y) (NaN for a class with no test sample), dropout off; ``source``: the inputs of BatchNorm's
    evaluation statistics, as ``functional.evaluate`` takes them."""
    stats = fm.statistics(params, source, batch_size)
    return class_scores(fm, params, x, y, num_classes, batch_size, precision, stats)[0]


def client_accuracies(mix: np.ndarray, acc_c: np.ndarray) -> np.ndarray:
    """[N] acc_i = Σ_c p_i(c)·acc_c over the classes the test set has, p_i renormalised over them (NaN for a client
    holding none of them)."""
    present = np.isfinite(acc_c)
    w = mix[:, present]
    mass = w.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mass > 0, (w @ acc_c[present]) / mass, np.nan)


def summarise(acc: np.ndarray) -> dict[str, float]:
    """The columns of metrics.csv: mean, population std and worst-10% mean over the clients that have a value."""
    acc = np.sort(acc[np.isfinite(acc)])
    if not len(acc):
        return dict.fromkeys(COLUMNS, math.nan)
    worst = acc[:max(1, math.ceil(len(acc) / 10))]
    return {"client_acc_mean": float(acc.mean()), "client_acc_std": float(acc.std()),
            "client_acc_worst10": float(worst.mean())}
