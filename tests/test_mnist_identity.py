"""MNIST and Fashion-MNIST share every file name, shape and label range: fedsl tells them apart
(published md5s, else the images' extent) so that `dataset = "mnist"` never trains on clothes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_idx

from fedsl.cli import main
from fedsl.core.errors import DataError
from fedsl.sources import mnist as mn
from fedsl.sources.download import file_digest
from fedsl.sources.mnist import identify_mnist_like, load_fashion_mnist, load_mnist


def digits_like(n: int, rng: np.random.Generator) -> np.ndarray:
    """MNIST's geometry: strokes inside a 20x20 box, the box shifted a little about the centre."""
    x = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        top, left = rng.integers(2, 7, size=2)
        h, w = rng.integers(12, 21), rng.integers(4, 21)
        x[i, top:top + h, left:left + 3] = rng.integers(100, 256)        # a vertical stroke
        x[i, top:top + 3, left:left + w] = rng.integers(100, 256)        # a horizontal one
        x[i, top + h - 3:top + h, left:left + w] = rng.integers(1, 256)  # and a base
    return x


def clothes_like(n: int, rng: np.random.Generator) -> np.ndarray:
    """Fashion-MNIST's geometry: a product whose longest edge was resized to the full 28 pixels."""
    x = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        short = rng.integers(8, 29)
        a = (28 - short) // 2
        if rng.random() < 0.5:
            x[i, :, a:a + short] = rng.integers(30, 256)   # tall: a dress, trousers
        else:
            x[i, a:a + short, :] = rng.integers(30, 256)   # wide: a bag, a shoe
    return x


def write_set(folder: Path, images, *, gz: bool = False) -> Path:
    """The four idx files (uncompressed unless ``gz``: recompressed copies match no published md5)."""
    rng = np.random.default_rng(1)
    for part, (img_name, lab_name) in mn.MNIST_FILES.items():
        n = 300 if part == "train" else 200
        name = (lambda s: s) if gz else (lambda s: s.removesuffix(".gz"))
        write_idx(folder / name(img_name), images(n, rng))
        write_idx(folder / name(lab_name), rng.integers(0, 10, n).astype(np.uint8))
    return folder


def test_content_tells_fashion_from_mnist(tmp_path, fresh_cache):
    fashion = write_set(tmp_path / "fashion", clothes_like)
    digits = write_set(tmp_path / "digits", digits_like, gz=True)
    assert identify_mnist_like(fashion).dataset == "fashion_mnist"
    assert identify_mnist_like(digits).dataset == "mnist"
    assert len(load_fashion_mnist(fashion).train) == 300 and len(load_mnist(digits).test) == 200
    with pytest.raises(DataError, match=rf"^{fashion} holds Fashion-MNIST's idx files, not MNIST's \(.*\): .*"
                                        r"data.dataset = 'fashion_mnist'$"):
        load_mnist(fashion)
    with pytest.raises(DataError, match=rf"^{digits} holds MNIST's idx files, not Fashion-MNIST's"):
        load_fashion_mnist(digits)


def test_published_checksums_decide_before_content(tmp_path, fresh_cache, monkeypatch):
    """The official gzip files are told by their md5 (here: MNIST-like images posing as Fashion-MNIST's
    published file), and a folder mixing the two is refused either way."""
    folder = write_set(tmp_path / "d", digits_like, gz=True)
    labels = mn.MNIST_FILES["test"][1]
    monkeypatch.setitem(mn.FASHION_MNIST_MD5, labels, "md5:" + file_digest(folder / labels, "md5"))
    found = identify_mnist_like(folder)
    assert found.dataset == "fashion_mnist" and "md5 of t10k-labels-idx1-ubyte.gz" in found.evidence
    with pytest.raises(DataError, match="holds Fashion-MNIST's idx files, not MNIST's"):
        load_mnist(folder)
    images = mn.MNIST_FILES["train"][0]
    monkeypatch.setitem(mn.MNIST_MD5, images, "md5:" + file_digest(folder / images, "md5"))
    assert identify_mnist_like(folder).dataset == "mixed"
    with pytest.raises(DataError, match="holds a mix of MNIST's and Fashion-MNIST's idx files"):
        load_fashion_mnist(folder)


def test_few_or_odd_images_decide_nothing(tmp_path):
    """Hand-made files of a few images (other tests' fixtures) are taken for what the config names."""
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", clothes_like(20, rng))
    assert identify_mnist_like(tmp_path).dataset is None
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"not idx")
    assert identify_mnist_like(tmp_path).dataset is None


def test_data_list_and_run_on_fashion_files(tmp_path, capsys, fresh_cache):
    """`fedsl data list` finds only Fashion-MNIST in a folder of its files, and `dataset = "mnist"`
    pointed there stops with one line naming the folder and what is in it."""
    folder = write_set(tmp_path / "data", clothes_like)
    assert main(["data", "list", "--data-dir", str(folder)]) == 0
    rows: dict[str, str] = {}  # name -> "found at", its folded lines joined (a long path is folded, not cut)
    for line in capsys.readouterr().out.splitlines():
        if line.count("│") > 2:
            name, where = (c.strip() for c in line.split("│")[1:3])
            key = name or list(rows)[-1]
            rows[key] = rows.get(key, "") + where
    assert rows["fashion_mnist"] == str(folder) and rows["mnist"] == "not found"
    assert main(["data", "prepare", "mnist", "--data-dir", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {folder} holds Fashion-MNIST's idx files, not MNIST's")


def test_real_mnist_and_fashion_told_apart(shared_data):
    """Against the publishers' files, where the offline data folder has them."""
    from fedsl.data.datasets import locate
    found = {name: locate(name, str(shared_data)) for name in ("mnist", "fashion_mnist")}
    if not any(found.values()):
        pytest.skip(f"no MNIST or Fashion-MNIST files in {shared_data}")
    for name, folder in found.items():
        if folder is not None:
            assert identify_mnist_like(folder).dataset == name


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))
