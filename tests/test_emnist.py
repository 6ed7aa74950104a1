"""idx files and the EMNIST / MNIST / Fashion-MNIST loaders.

Small idx files are written in the official names (EMNIST images stored transposed, as
the publisher does); the integration tests read the offline ByMerge test split from
$FEDSL_SHARED_DATA (default: <repo>/../shared/data) and skip when it is absent.
"""

from __future__ import annotations

import gzip
import os
import string
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_idx

from fedsl.core.errors import DataError
from fedsl.sources import emnist as em
from fedsl.sources import idx as idx_files
from fedsl.sources import mnist as mn
from fedsl.sources.emnist import (
    EMNIST_BALANCED_CHARS,
    PAPER_45_CLASSES,
    PAPER_45_DROPPED,
    carve_emnist,
    emnist_filenames,
    emnist_mapping_filename,
    load_emnist,
    paper_45_classes,
)
from fedsl.sources.idx import read_idx
from fedsl.sources.mnist import FASHION_MNIST_CLASSES, load_fashion_mnist, load_mnist

# ----------------------------------------------------------------------------- helpers


def upright_images(raw_labels: np.ndarray, first_id: int = 0) -> np.ndarray:
    """Upright 28x28 images shaped like an 'L' (bar down the left, bar along the bottom),
    carrying their raw label at (14, 14) and a sample id at (12, 14), (13, 14)."""
    n = len(raw_labels)
    x = np.zeros((n, 28, 28), dtype=np.uint8)
    x[:, 2:26, 2:5] = 200  # vertical bar, left
    x[:, 23:26, 2:20] = 200  # horizontal bar, bottom
    ids = np.arange(first_id, first_id + n)
    x[:, 12, 14] = ids // 256
    x[:, 13, 14] = ids % 256
    x[:, 14, 14] = raw_labels
    return x


def sample_ids(x: np.ndarray) -> np.ndarray:
    return x[:, 12, 14].astype(np.int64) * 256 + x[:, 13, 14]


def write_emnist(folder: Path, split: str, part: str, raw_labels, *, first_id: int = 0,
                 mapping: list[tuple[int, ...]] | None = None) -> np.ndarray:
    """Official EMNIST files for one part (images transposed in the file); the upright images."""
    raw_labels = np.asarray(raw_labels, dtype=np.uint8)
    x = upright_images(raw_labels, first_id)
    images, labels = emnist_filenames(split, part)
    write_idx(folder / images, x.transpose(0, 2, 1))
    write_idx(folder / labels, raw_labels)
    if mapping is not None:
        (folder / emnist_mapping_filename(split)).write_text("".join(" ".join(map(str, r)) + "\n" for r in mapping))
    return x


BALANCED_MAPPING = [(i, ord(c)) for i, c in enumerate(EMNIST_BALANCED_CHARS)]
LETTERS_MAPPING = [(i + 1, ord(up), ord(low)) for i, (up, low) in enumerate(zip(string.ascii_uppercase,
                                                                                string.ascii_lowercase))]


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDSL_CACHE", str(cache))
    return cache


@pytest.fixture()
def balanced_root(tmp_path) -> Path:
    """A tiny EMNIST Balanced: 47 classes, train 3 per class, test 2 per class."""
    root = tmp_path / "emnist"
    root.mkdir()
    write_emnist(root, "balanced", "train", np.tile(np.arange(47), 3), mapping=BALANCED_MAPPING)
    write_emnist(root, "balanced", "test", np.tile(np.arange(47), 2), first_id=1000)
    return root


# ----------------------------------------------------------------------------- idx


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("name", ["a-idx3-ubyte.gz", "a-idx3-ubyte"])
def test_idx_round_trip(tmp_path, dtype, name):
    a = (np.arange(2 * 3 * 5) - 7).astype(dtype).reshape(2, 3, 5)
    path = write_idx(tmp_path / name, a)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    b = read_idx(path)
    assert b.dtype == np.dtype(dtype) and b.dtype.isnative and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


def test_idx_header_and_gzip_by_content(tmp_path):
    raw = write_idx(tmp_path / "l-idx1-ubyte", np.array([3, 1, 2], dtype=np.uint8))
    assert raw.read_bytes() == bytes([0, 0, 8, 1, 0, 0, 0, 3, 3, 1, 2])
    # a gzip file without the .gz suffix is still read (recognised by its magic bytes)
    (tmp_path / "gz-without-suffix").write_bytes(gzip.compress(raw.read_bytes()))
    np.testing.assert_array_equal(read_idx(tmp_path / "gz-without-suffix"), [3, 1, 2])
    # same array, same bytes (no time stamp in the gzip header)
    a = write_idx(tmp_path / "a.gz", np.ones((4, 4), np.uint8)).read_bytes()
    assert write_idx(tmp_path / "b.gz", np.ones((4, 4), np.uint8)).read_bytes() == a


def test_idx_truncated_and_trailing_bytes(tmp_path):
    data = write_idx(tmp_path / "x-idx3-ubyte", np.zeros((4, 28, 28), np.uint8)).read_bytes()
    assert len(data) == 16 + 4 * 784
    (tmp_path / "cut-idx3-ubyte").write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"cut-idx3-ubyte is truncated.*needs 3152 bytes.*has 3142"):
        read_idx(tmp_path / "cut-idx3-ubyte")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(data[:100]))
    with pytest.raises(DataError, match=r"cut.gz is truncated.*3152 bytes \(uncompressed\).*has 100"):
        read_idx(tmp_path / "cut.gz")
    (tmp_path / "long").write_bytes(data + b"xyz")
    with pytest.raises(DataError, match=r"long has trailing bytes.*3152 bytes.*has 3155"):
        read_idx(tmp_path / "long")
    (tmp_path / "header").write_bytes(data[:9])
    with pytest.raises(DataError, match="header is truncated inside its header"):
        read_idx(tmp_path / "header")


def test_idx_bad_magic_damaged_gzip_and_unsupported_dtype(tmp_path):
    (tmp_path / "text.gz").write_bytes(gzip.compress(b"hello world"))
    with pytest.raises(DataError, match="text.gz is not an idx file"):
        read_idx(tmp_path / "text.gz")
    good = gzip.compress(write_idx(tmp_path / "r", np.zeros((100, 28, 28), np.uint8)).read_bytes())
    (tmp_path / "damaged.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="damaged.gz"):
        read_idx(tmp_path / "damaged.gz")
    with pytest.raises(DataError, match="missing does not exist"):
        read_idx(tmp_path / "missing")
    with pytest.raises(ValueError, match="no idx type code"):
        write_idx(tmp_path / "u16", np.zeros(3, np.uint16))


# ----------------------------------------------------------------------------- EMNIST


def test_load_emnist_upright_labels_and_names(balanced_root, fresh_cache):
    ds = load_emnist(balanced_root, "balanced")
    assert ds.class_names == list(EMNIST_BALANCED_CHARS) == ds.test.class_names
    assert ds.train.x.shape == (141, 28, 28) and ds.train.x.dtype == np.uint8
    assert ds.test.x.shape == (94, 28, 28)
    assert ds.train.y.dtype == np.int64
    np.testing.assert_array_equal(ds.train.y, np.tile(np.arange(47), 3))
    # upright: the 'L' has its bar down the left and its foot along the bottom
    np.testing.assert_array_equal(ds.train.x, upright_images(np.tile(np.arange(47), 3)))
    img = ds.test.x[0]
    assert (img[2:26, 2:5] == 200).all() and (img[23:26, 2:20] == 200).all()
    assert img[2:20, 23:26].sum() == 0  # nothing where the transposed 'L' would have its bar
    np.testing.assert_array_equal(sample_ids(ds.test.x), 1000 + np.arange(94))


def test_emnist_root_may_be_the_parent_folder(balanced_root, fresh_cache):
    ds = load_emnist(balanced_root.parent, "balanced")  # finds <root>/emnist
    assert len(ds.train) == 141


def test_emnist_letters_relabelled_0_to_25(tmp_path, fresh_cache):
    write_emnist(tmp_path, "letters", "train", np.arange(1, 27), mapping=LETTERS_MAPPING)
    write_emnist(tmp_path, "letters", "test", [26, 1, 2])
    ds = load_emnist(tmp_path, "letters")
    assert ds.class_names == list(string.ascii_uppercase)
    np.testing.assert_array_equal(ds.train.y, np.arange(26))
    np.testing.assert_array_equal(ds.test.y, [25, 0, 1])
    np.testing.assert_array_equal(ds.train.x[:, 14, 14], np.arange(1, 27))  # raw label 1..26 went with it
    # lower-case letters are aliases of the merged classes
    sub = load_emnist(tmp_path, "letters", classes=["z", "A"])
    assert sub.class_names == ["Z", "A"]
    np.testing.assert_array_equal(sub.test.y, [0, 1])


def test_emnist_without_mapping_file_uses_builtin_names(tmp_path, fresh_cache):
    write_emnist(tmp_path, "letters", "train", [1, 2])
    write_emnist(tmp_path, "letters", "test", [26])
    ds = load_emnist(tmp_path, "letters")
    assert ds.class_names == list(string.ascii_uppercase)
    np.testing.assert_array_equal(ds.train.y, [0, 1])


def test_emnist_classes_subset_relabelled_in_given_order(balanced_root, fresh_cache):
    ds = load_emnist(balanced_root, "balanced", classes=["t", "0", "Z"])
    assert ds.class_names == ["t", "0", "Z"]
    np.testing.assert_array_equal(ds.train.y, np.tile([1, 2, 0], 3))  # files' order kept: 0, Z, t
    raw = ds.train.x[:, 14, 14]
    assert set(zip(ds.train.y.tolist(), raw.tolist())) == {(0, 46), (1, 0), (2, 35)}
    by_index = load_emnist(balanced_root, "balanced", classes=[46, np.int64(0), 35])
    np.testing.assert_array_equal(by_index.train.x, ds.train.x)
    digits = load_emnist(balanced_root, "balanced", classes="0123456789")
    assert digits.class_names == list("0123456789") and len(digits.test) == 20


def test_emnist_unknown_classes(balanced_root, fresh_cache):
    with pytest.raises(DataError, match=r"unknown class '\?'; valid classes are 0123456789ABC.*abdefghnqrt"):
        load_emnist(balanced_root, "balanced", classes=["A", "?"])
    with pytest.raises(DataError, match=r"unknown class 'c' \('c' is merged into 'C' here\)"):
        load_emnist(balanced_root, "balanced", classes=["c"])
    with pytest.raises(DataError, match="label 47 is out of range"):
        load_emnist(balanced_root, "balanced", classes=[47])
    with pytest.raises(DataError, match="selected more than once"):
        load_emnist(balanced_root, "balanced", classes=["A", 10])
    with pytest.raises(DataError, match="empty selection"):
        load_emnist(balanced_root, "balanced", classes=[])


def test_emnist_missing_files_and_bad_split(tmp_path):
    with pytest.raises(DataError, match=r"EMNIST balanced: cannot find emnist-balanced-train-images-idx3-ubyte.gz, "
                                        r".*emnist-balanced-test-labels-idx1-ubyte.gz in .*--set data.download=true"):
        load_emnist(tmp_path, "balanced")
    with pytest.raises(DataError, match="expected one of balanced, bymerge"):
        load_emnist(tmp_path, "bytheway")


def test_emnist_wrong_image_size_and_foreign_labels(tmp_path, fresh_cache):
    images, labels = emnist_filenames("digits", "train")
    write_idx(tmp_path / images, np.zeros((3, 32, 32), np.uint8))
    write_idx(tmp_path / labels, np.zeros(3, np.uint8))
    write_emnist(tmp_path, "digits", "test", [1])
    with pytest.raises(DataError, match=r"emnist-digits-train-images-idx3-ubyte.gz: holds uint8 images of shape "
                                        r"\(32, 32\), expected uint8 28x28"):
        load_emnist(tmp_path, "digits")
    write_emnist(tmp_path, "digits", "train", [1, 2, 12])
    with pytest.raises(DataError, match=r"labels \[12\] are not among the 10 classes"):
        load_emnist(tmp_path, "digits")
    write_idx(tmp_path / labels, np.zeros(2, np.uint8))
    with pytest.raises(DataError, match="expected 3 labels"):
        load_emnist(tmp_path, "digits")


def test_emnist_uncompressed_files_are_found(tmp_path, fresh_cache):
    for part, labels in (("train", [0, 1]), ("test", [2])):
        img, lab = emnist_filenames("mnist", part)
        write_idx(tmp_path / img.removesuffix(".gz"), upright_images(np.array(labels, np.uint8)).transpose(0, 2, 1))
        write_idx(tmp_path / lab.removesuffix(".gz"), np.array(labels, np.uint8))
    ds = load_emnist(tmp_path, "mnist")
    assert ds.class_names == list(string.digits)
    np.testing.assert_array_equal(ds.test.y, [2])


def test_emnist_decoded_arrays_are_cached(balanced_root, fresh_cache, monkeypatch):
    first = load_emnist(balanced_root, "balanced")
    assert len(list(fresh_cache.glob("emnist-balanced-*.npz"))) == 2

    def no_decoding(path):
        raise AssertionError(f"decoded {path} again instead of using the cache")

    monkeypatch.setattr(idx_files, "read_idx", no_decoding)
    second = load_emnist(balanced_root, "balanced")
    np.testing.assert_array_equal(first.train.x, second.train.x)
    np.testing.assert_array_equal(first.test.y, second.test.y)
    # a changed file changes the key: decoded anew
    write_emnist(balanced_root, "balanced", "test", np.arange(47))
    with pytest.raises(AssertionError, match="decoded"):
        load_emnist(balanced_root, "balanced")


def test_emnist_download_extracts_needed_members(tmp_path, fresh_cache, monkeypatch):
    src = tmp_path / "publisher"
    src.mkdir()
    write_emnist(src, "digits", "train", [0, 1, 2], mapping=[(i, 48 + i) for i in range(10)])
    write_emnist(src, "digits", "test", [3])
    write_emnist(src, "mnist", "test", [4])
    calls = []

    def fake_fetch(url, dest, checksum=None, **kw):
        calls.append((url, Path(dest), checksum))
        with zipfile.ZipFile(dest, "w") as z:
            for p in src.iterdir():
                z.write(p, f"gzip/{p.name}")
        return Path(dest)

    monkeypatch.setattr(em, "fetch", fake_fetch)
    ds = load_emnist(tmp_path / "data", "digits", download=True)
    assert calls == [(em.EMNIST_URLS[0], tmp_path / "data" / "emnist" / "gzip.zip",
                      "md5:58c8d27c78d21e728a6bc7b3cc06412e")]
    np.testing.assert_array_equal(ds.train.y, [0, 1, 2])
    extracted = sorted(p.name for p in (tmp_path / "data" / "emnist").iterdir())
    assert extracted == sorted(["gzip.zip", emnist_mapping_filename("digits"),
                                *emnist_filenames("digits", "train"), *emnist_filenames("digits", "test")])


# ----------------------------------------------------------------------------- carving


@pytest.fixture()
def carve_root(tmp_path) -> Path:
    """Only a ByMerge test split: class k (k < 47) has 10 + k samples, in shuffled order."""
    labels = np.repeat(np.arange(47), 10 + np.arange(47))
    np.random.default_rng(1).shuffle(labels)
    write_emnist(tmp_path, "bymerge", "test", labels, mapping=BALANCED_MAPPING)
    return tmp_path


def test_carve_balanced_disjoint_deterministic(carve_root, fresh_cache):
    classes = ["Q", "0", "t", "a"]
    ds = carve_emnist(carve_root, classes=classes, train_per_class=6, test_per_class=4, seed=3)
    assert ds.class_names == classes == ds.test.class_names
    np.testing.assert_array_equal(np.bincount(ds.train.y), [6] * 4)
    np.testing.assert_array_equal(np.bincount(ds.test.y), [4] * 4)
    raw = {"Q": 26, "0": 0, "t": 46, "a": 36}
    for s in (ds.train, ds.test):  # labels follow the images, in the order asked for
        np.testing.assert_array_equal(s.x[:, 14, 14], [raw[classes[k]] for k in s.y])
        assert (np.diff(sample_ids(s.x)) > 0).all()  # files' order, no repeats
        assert (s.x[:, 23:26, 2:20] == 200).all()  # upright
    assert not set(sample_ids(ds.train.x)) & set(sample_ids(ds.test.x))
    again = carve_emnist(carve_root, classes=classes, train_per_class=6, test_per_class=4, seed=3)
    np.testing.assert_array_equal(again.train.x, ds.train.x)
    np.testing.assert_array_equal(again.test.y, ds.test.y)
    other = carve_emnist(carve_root, classes=classes, train_per_class=6, test_per_class=4, seed=4)
    assert set(sample_ids(other.train.x)) != set(sample_ids(ds.train.x))
    # a class's draw depends on the seed only, not on the other classes selected
    alone = carve_emnist(carve_root, classes=["t"], train_per_class=6, test_per_class=4, seed=3)
    np.testing.assert_array_equal(sample_ids(alone.train.x), sample_ids(ds.train.x[ds.train.y == 2]))


def test_carve_all_classes_and_whole_class(carve_root, fresh_cache):
    ds = carve_emnist(carve_root, train_per_class=7, test_per_class=3, seed=0)  # class '0' has exactly 10
    assert ds.class_names == list(EMNIST_BALANCED_CHARS)
    assert len(ds.train) == 47 * 7 and len(ds.test) == 47 * 3


def test_carve_too_few_samples(carve_root, fresh_cache):
    with pytest.raises(DataError, match=r"class '1' has 11 samples, fewer than train_per_class \+ test_per_class = "
                                        r"12 \(too few: '1' \(11\), '0' \(10\)\): lower the per-class counts to at "
                                        r"most 10 in all, or choose other classes"):
        carve_emnist(carve_root, classes="Z10", train_per_class=8, test_per_class=4, seed=0)
    with pytest.raises(DataError, match="train_per_class = -1"):
        carve_emnist(carve_root, classes="Z", train_per_class=-1, test_per_class=4, seed=0)
    with pytest.raises(DataError, match="unknown class 'c'"):
        carve_emnist(carve_root, classes="c", train_per_class=1, test_per_class=1, seed=0)


def test_carve_test_up_to_takes_what_is_left(carve_root, fresh_cache):
    # classes '0' (10 samples), '1' (11), 'Z' (45): train 8 exact, test up to 4 -> 2, 3, 4
    ds = carve_emnist(carve_root, classes="01Z", train_per_class=8, test_per_class=4, seed=0, test_up_to=True)
    np.testing.assert_array_equal(np.bincount(ds.train.y), [8, 8, 8])
    np.testing.assert_array_equal(np.bincount(ds.test.y), [2, 3, 4])
    assert not set(sample_ids(ds.train.x)) & set(sample_ids(ds.test.x))
    # the training share is what an exact carve of the same seed gives
    exact = carve_emnist(carve_root, classes="Z", train_per_class=8, test_per_class=4, seed=0)
    np.testing.assert_array_equal(sample_ids(exact.train.x), sample_ids(ds.train.x[ds.train.y == 2]))
    with pytest.raises(DataError, match=r"class '0' has 10 samples, fewer than train_per_class = 11"):
        carve_emnist(carve_root, classes="01", train_per_class=11, test_per_class=4, seed=0, test_up_to=True)


def test_carve_prefers_train_files(carve_root, fresh_cache):
    write_emnist(carve_root, "bymerge", "train", np.repeat([0, 1], 5), first_id=5000)
    ds = carve_emnist(carve_root, classes=[0, 1], train_per_class=3, test_per_class=2, seed=0)
    assert (sample_ids(ds.train.x) >= 5000).all() and (sample_ids(ds.test.x) >= 5000).all()


def test_carve_missing_files(tmp_path):
    with pytest.raises(DataError, match=r"cannot find emnist-bymerge-train-images.*either the train or the test"):
        carve_emnist(tmp_path, classes="A", train_per_class=1, test_per_class=1, seed=0)


def test_paper_45_classes():
    assert len(PAPER_45_CLASSES) == 45 == len(set(PAPER_45_CLASSES))
    assert len(PAPER_45_DROPPED) == 2 and not set(PAPER_45_DROPPED) & set(PAPER_45_CLASSES)
    assert set(PAPER_45_CLASSES) | set(PAPER_45_DROPPED) == set(EMNIST_BALANCED_CHARS)
    assert set(string.digits + string.ascii_uppercase) <= set(PAPER_45_CLASSES)
    assert paper_45_classes(("r", "t")) == EMNIST_BALANCED_CHARS[:45]
    with pytest.raises(DataError, match="expected 2 distinct EMNIST Balanced classes"):
        paper_45_classes(("c", "t"))
    from fedsl.sources.synthetic import EMNIST_BALANCED_CHARS as synthetic_chars
    assert synthetic_chars == EMNIST_BALANCED_CHARS


# ----------------------------------------------------------------------------- MNIST, Fashion-MNIST


def write_mnist(folder: Path, *, gz: bool = True) -> None:
    for part, labels in (("train", [0, 9, 5]), ("test", [7, 3])):
        for name, arr in zip(mn.MNIST_FILES[part], (upright_images(np.array(labels, np.uint8)),
                                                     np.array(labels, np.uint8))):
            write_idx(folder / (name if gz else name.removesuffix(".gz")), arr)


def test_mnist_and_fashion_names_not_transposed(tmp_path, fresh_cache):
    write_mnist(tmp_path / "mnist")
    write_mnist(tmp_path / "FashionMNIST" / "raw", gz=False)  # torchvision's layout
    m = load_mnist(tmp_path)
    f = load_fashion_mnist(tmp_path)
    assert m.class_names == list("0123456789")
    assert f.class_names == FASHION_MNIST_CLASSES and f.class_names[0] == "T-shirt/top"
    for ds in (m, f):
        np.testing.assert_array_equal(ds.train.y, [0, 9, 5])
        np.testing.assert_array_equal(ds.test.y, [7, 3])
        np.testing.assert_array_equal(ds.train.x, upright_images(np.array([0, 9, 5], np.uint8)))


def test_mnist_missing_and_bad_labels(tmp_path, fresh_cache):
    with pytest.raises(DataError, match=r"MNIST: cannot find train-images-idx3-ubyte.gz, .*t10k-labels-idx1-ubyte.gz"
                                        r" in .*keep each in its own folder"):
        load_mnist(tmp_path)
    write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([7, 10], np.uint8))
    with pytest.raises(DataError, match=r"labels \[10\] are not among the 10 classes"):
        load_mnist(tmp_path)


def test_mnist_download_uses_checksums_and_mirrors(tmp_path, fresh_cache, monkeypatch):
    src = tmp_path / "publisher"
    write_mnist(src)
    calls = []

    def fake_fetch(url, dest, checksum=None, **kw):
        calls.append((url, checksum))
        if "ossci" in url and "t10k-labels" in url:
            raise DataError("mirror down")
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_bytes((src / Path(url).name).read_bytes())
        return Path(dest)

    monkeypatch.setattr(mn, "fetch", fake_fetch)
    ds = load_mnist(tmp_path / "data", download=True)
    assert (tmp_path / "data" / "mnist" / "t10k-labels-idx1-ubyte.gz").is_file()
    np.testing.assert_array_equal(ds.test.y, [7, 3])
    assert ("http://yann.lecun.com/exdb/mnist/t10k-labels-idx1-ubyte.gz",
            "md5:ec29112dd5afa0611ce80d1b7f02629c") in calls
    assert ("https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz",
            "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873") in calls
    calls.clear()
    load_fashion_mnist(tmp_path / "data" / "fashion-mnist", download=True)  # root named after the dataset
    assert len(calls) == 4 and all(c[0].startswith(mn.FASHION_MNIST_MIRRORS[0]) for c in calls)
    assert ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/train-labels-idx1-ubyte.gz",
            "md5:25c81989df183df01b3e8a0aad5dffbe") in calls
    assert sorted(p.name for p in (tmp_path / "data" / "fashion-mnist").iterdir()) == sorted(mn.MNIST_MD5)


# ----------------------------------------------------------------------------- the offline ByMerge copy


def shared_emnist() -> Path:
    base = Path(os.environ.get("FEDSL_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    folder = base / "emnist"
    if not (folder / emnist_filenames("bymerge", "test")[0]).is_file():
        pytest.skip(f"offline EMNIST copy not found at {folder} (set FEDSL_SHARED_DATA to the folder holding "
                    "emnist/emnist-bymerge-test-*)")
    return folder


@pytest.fixture(scope="module")
def bymerge_test():
    folder = shared_emnist()
    paths = em._emnist_part_paths(folder, "bymerge", "test")
    values, names, _ = em._emnist_classes(folder, "bymerge")
    return folder, em._emnist_part(paths, "bymerge", "test", values, names)


def test_shared_bymerge_test_split(bymerge_test):
    _, s = bymerge_test
    assert s.x.shape == (116_323, 28, 28) and s.x.dtype == np.uint8
    assert s.class_names == list(EMNIST_BALANCED_CHARS)  # ByMerge has Balanced's 47 characters
    counts = np.bincount(s.y, minlength=47)
    assert counts.min() == 415 and s.class_names[counts.argmin()] == "Q"
    assert counts.max() == 6400 and s.class_names[counts.argmax()] == "1"
    paper_min = min(counts[s.class_names.index(c)] for c in PAPER_45_CLASSES)
    assert paper_min == 415


def test_shared_bymerge_is_upright(bymerge_test):
    _, s = bymerge_test

    def mean_image(c: str) -> np.ndarray:
        return s.x[s.y == s.class_names.index(c)].astype(np.float64).mean(0)

    def spread(img: np.ndarray) -> tuple[float, float]:
        r, c = np.indices(img.shape)
        w = img / img.sum()
        return float((w * (r - (w * r).sum()) ** 2).sum()), float((w * (c - (w * c).sum()) ** 2).sum())

    rows, cols = spread(mean_image("1"))
    assert rows > 3 * cols  # a '1' is tall and thin
    el = mean_image("L")
    # an 'L' has more ink bottom-left than top-right (transposed, the two quadrants swap);
    # ByMerge's 'L' also holds the lower-case 'l', a plain stroke, hence the modest margin
    assert el[14:, :14].sum() > 1.2 * el[:14, 14:].sum()
    seven = mean_image("7")
    assert seven[:7].sum() > seven[21:].sum()  # a '7' has its bar at the top


def test_shared_carve_paper_45(bymerge_test):  # reuses the session cache of the decoded split
    folder, _ = bymerge_test
    ds = carve_emnist(folder, classes=PAPER_45_CLASSES, train_per_class=315, test_per_class=100, seed=0)
    assert ds.class_names == list(PAPER_45_CLASSES)
    assert len(ds.train) == 45 * 315 and len(ds.test) == 45 * 100
    np.testing.assert_array_equal(np.bincount(ds.train.y), [315] * 45)
    with pytest.raises(DataError, match=r"class 'Q' has 415 samples.*at most 415"):
        carve_emnist(folder, classes=PAPER_45_CLASSES, train_per_class=316, test_per_class=100, seed=0)
