"""The paper's CNNs (appendix, Tables 'Model used in EMNIST/CIFAR-10 experiments').

Layer for layer as in the tables (Keras 'same'/'valid' padding, ReLU, softmax folded
into the cross-entropy loss). Parameter counts: emnist_cnn 1,409,197 for 45 classes,
cifar_cnn 545,098. One liberty, for speed: a ReLU followed by max-pooling is applied as
max-pooling then ReLU. The two commute exactly (ReLU is monotone, so the max of the
ReLUs is the ReLU of the max, and the gradient reaches the same element), and the ReLU
then runs on a quarter of the values, which speeds up evaluation on a CPU. Parameter names
are unchanged (the pool and ReLU hold none).

Each model is a ``Classifier``: an ``nn.Sequential`` (same layers, same parameter names) that
also exposes its representation z, the input of its last linear layer (before any dropout on
it), with ``features(x) -> z`` and ``head(z) -> logits`` (what MOON's contrastive term reads).
"""

from __future__ import annotations

import torch
from torch import nn


class Classifier(nn.Sequential):
    """An ``nn.Sequential`` whose last ``head_layers`` layers are the classifier head.

    ``features(x)`` is the representation z (the layers before the head), ``head(z)`` the logits;
    ``forward(x)`` is ``head(features(x))``, the same layers in the same order as ``nn.Sequential``.
    """

    def __init__(self, *layers: nn.Module, head_layers: int = 1) -> None:
        super().__init__(*layers)  # (a slice of a Classifier passes one OrderedDict: nn.Sequential's __getitem__)
        if head_layers < 1:
            raise ValueError(f"head_layers = {head_layers}: expected at least 1 (the last linear layer)")
        self.head_layers = head_layers

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """z: the output of every layer before the head."""
        for layer in list(self)[:-self.head_layers]:
            x = layer(x)
        return x

    def head(self, z: torch.Tensor) -> torch.Tensor:
        """The logits from z."""
        for layer in list(self)[-self.head_layers:]:
            z = layer(z)
        return z

    def extra_repr(self) -> str:
        return f"head_layers={self.head_layers}"


def emnist_cnn(num_classes: int = 45, in_channels: int = 1) -> Classifier:
    """28x28x1 -> Conv32(same) -> Conv64(valid) -> MaxPool2 -> Dropout .25 -> Dense128 -> Dropout .5 -> Dense."""
    return Classifier(
        nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=0),
        nn.MaxPool2d(2), nn.ReLU(),  # = ReLU then pool (see the module docstring)
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(13 * 13 * 64, 128), nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, num_classes),
        head_layers=2,  # z: the 128 ReLU units before the last dropout
    )


def cifar_cnn(num_classes: int = 10, in_channels: int = 3) -> Classifier:
    """32x32x3 -> Conv32(same) -> MaxPool -> Conv64(same) -> MaxPool -> Dropout .25 -> Dense128 -> Dropout .5
    -> Dense."""
    return Classifier(
        nn.Conv2d(in_channels, 32, 3, padding=1),
        nn.MaxPool2d(2), nn.ReLU(),  # = ReLU then pool (see the module docstring)
        nn.Conv2d(32, 64, 3, padding=1),
        nn.MaxPool2d(2), nn.ReLU(),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(8 * 8 * 64, 128), nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, num_classes),
        head_layers=2,  # z: the 128 ReLU units before the last dropout
    )


def small_cnn(num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> Classifier:
    """A small CNN in the paper's shape (2 conv + 2 dense, dropout) for quick runs on a CPU."""
    side = image_size // 4
    return Classifier(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(32 * side * side, 64), nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(64, num_classes),
        head_layers=2,  # z: the 64 ReLU units before the last dropout
    )


def mlp(num_classes: int, in_features: int, hidden: int = 64) -> nn.Sequential:
    """A one-hidden-layer perceptron (a ``Classifier``: z is its hidden layer); ``hidden=0`` gives a
    linear (softmax regression) model, a plain ``nn.Sequential`` with no representation."""
    if hidden == 0:
        return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))
    return Classifier(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def logreg(num_classes: int, in_features: int) -> nn.Sequential:
    """Multinomial logistic regression, logits W x + b (the softmax is in the loss): the model of Synthetic(α, β)
    in FedProx (Li et al., MLSys 2020; their 'mclr', without its L2 term). The same layers as ``mlp(hidden=0)``
    (``model.name = 'linear'``), named for the benchmark."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))
