"""A toy dataset: 4 classes of 12x12 grey stripe patterns, generated (no files, no download), tiny.

For tests and quick examples, and the example of adding a dataset: this module (a loader
``load(d, root) -> ArrayDataset``) and its one entry in ``fedsl.data.registry.DATASETS`` are
all it takes. The images are fixed: drawn from stream ``TOY`` of seed 0 (``fedsl.core.rng``),
so every run, seed and machine sees the same ones; the run's seed only partitions them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsl.core.rng import TOY, rng
from fedsl.sources.arrays import ArrayDataset, ImageSet

CLASSES: list[str] = ["horizontal", "vertical", "checker", "diagonal"]
SIDE = 12
TRAIN_PER_CLASS = 40
TEST_PER_CLASS = 10


def _patterns() -> np.ndarray:
    """One 0/1 pattern per class, [4, SIDE, SIDE]: stripes two pixels wide."""
    i, j = np.indices((SIDE, SIDE))
    return np.stack([(i // 2) % 2, (j // 2) % 2, ((i // 2) + (j // 2)) % 2, ((i + j) // 2) % 2]).astype(np.int64)


def _split(per_class: int, part: int) -> ImageSet:
    """``per_class`` images of each class: its pattern shifted by 0-3 pixels, plus uniform noise."""
    gen = rng(0, TOY, part)
    y = np.repeat(np.arange(len(CLASSES), dtype=np.int64), per_class)
    shift = gen.integers(0, 4, (len(y), 2))
    noise = gen.integers(0, 96, (len(y), SIDE, SIDE))
    pats = _patterns()
    x = np.stack([np.roll(pats[c], tuple(s), axis=(0, 1)) for c, s in zip(y, shift)]) * 160 + noise
    return ImageSet(x.astype(np.uint8), y, list(CLASSES))


def load(d, root: Path) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'toy'``: 160 training and 40 test images (``d`` and
    ``root`` are not needed: nothing is configurable or read from files)."""
    return ArrayDataset(_split(TRAIN_PER_CLASS, 0), _split(TEST_PER_CLASS, 1))
