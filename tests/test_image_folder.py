"""Image folders (one sub-folder per class) and STL-10 as CIFAR-10-labelled server data."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fedsl.sources.image_folder as image_folder
from fedsl.core.errors import DataError
from fedsl.sources.image_folder import load_image_folder, load_image_folder_dataset
from fedsl.sources.stl10 import (
    CIFAR10_CLASSES,
    STL10_CLASSES,
    STL10_TO_CIFAR10,
    extract_stl10,
    load_stl10_as_cifar10,
    read_stl10_binary,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FEDSL_SHARED_DATA", REPO.parent / "shared" / "data"))

AIRPLANE, AUTOMOBILE, BIRD, CAT, DEER, DOG, FROG, HORSE, SHIP, TRUCK = range(10)


def save(path: Path, array: np.ndarray, fmt: str | None = None, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path, format=fmt, **kw)
    return path


def solid(h: int, w: int, value, grey: bool = False) -> np.ndarray:
    return np.full((h, w) if grey else (h, w, 3), value, dtype=np.uint8)


def make_folder(root: Path, counts: dict[str, int], h: int = 8, w: int = 8, ext: str = "png") -> Path:
    """``counts[class]`` solid images per class; image i of class k has colour (k*20, i, 7)."""
    for k, (name, n) in enumerate(sorted(counts.items())):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            save(root / name / f"{i:04d}.{ext}", solid(h, w, (k * 20, i, 7)))
    return root


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDSL_CACHE", str(cache))
    return cache


# ---------------------------------------------------------------------------- image folders

def test_sorted_folder_names_without_class_names(tmp_path):
    root = make_folder(tmp_path / "d", {"b": 2, "a": 3, "c": 1})
    (root / "README.txt").write_text("top-level files are not classes")
    ds = load_image_folder(root)
    assert ds.class_names == ["a", "b", "c"]
    assert ds.x.shape == (6, 8, 8, 3) and ds.x.dtype == np.uint8
    assert ds.y.dtype == np.int64 and ds.y.tolist() == [0, 0, 0, 1, 1, 2]
    # order within a class follows the file names
    assert ds.x[:3, 0, 0, 1].tolist() == [0, 1, 2]


def test_alignment_to_cifar10_order_alias_ignore_and_absent_class(tmp_path):
    root = make_folder(tmp_path / "d", {"airplane": 2, "car": 3, "truck": 1, "monkey": 4, "bird": 2})
    ds = load_image_folder(root, class_names=CIFAR10_CLASSES, aliases={"car": "automobile"}, ignore=["monkey"])
    assert ds.class_names == CIFAR10_CLASSES
    assert np.bincount(ds.y, minlength=10).tolist() == [2, 3, 2, 0, 0, 0, 0, 0, 0, 1]
    assert FROG not in ds.y
    # the car folder's images (colour k*20 with k = rank of "car" among the folder names) are automobiles
    assert set(ds.x[ds.y == AUTOMOBILE][:, 0, 0, 0].tolist()) == {sorted(["airplane", "car", "truck", "monkey",
                                                                          "bird"]).index("car") * 20}


def test_unknown_folder_is_an_error_naming_it_and_the_classes(tmp_path):
    root = make_folder(tmp_path / "d", {"airplane": 1, "monkey": 1})
    with pytest.raises(DataError, match=r"monkey.*airplane, automobile, bird.*truck.*ignore") as e:
        load_image_folder(root, class_names=CIFAR10_CLASSES)
    assert "\n" not in str(e.value)


def test_two_folders_for_one_class_is_an_error(tmp_path):
    root = make_folder(tmp_path / "d", {"car": 1, "automobile": 1})
    with pytest.raises(DataError, match="both class 'automobile'"):
        load_image_folder(root, class_names=CIFAR10_CLASSES, aliases={"car": "automobile"})


def test_resizing_to_height_width(tmp_path):
    root = tmp_path / "d"
    save(root / "a" / "big.png", solid(40, 20, (200, 100, 50)))  # 40 high, 20 wide
    save(root / "a" / "small.jpg", solid(6, 6, (10, 220, 30)), quality=95)
    save(root / "b" / "exact.png", solid(8, 12, (1, 2, 3)))
    ds = load_image_folder(root, size=(8, 12))
    assert ds.x.shape == (3, 8, 12, 3)
    np.testing.assert_array_equal(ds.x[0], solid(8, 12, (200, 100, 50)))  # a solid colour stays solid
    assert np.abs(ds.x[1].astype(int) - (10, 220, 30)).max() <= 3  # JPEG rounding
    np.testing.assert_array_equal(ds.x[2], solid(8, 12, (1, 2, 3)))


@pytest.mark.parametrize("ext", ["png", "jpg"])  # big JPEGs are also shrunk by libjpeg while decoding
def test_resize_keeps_the_picture_upright(tmp_path, ext):
    img = np.zeros((256, 128, 3), np.uint8)
    img[:128, :64] = 255  # white top-left quarter
    save(tmp_path / "d" / "a" / f"x.{ext}", img, quality=95)
    ds = load_image_folder(tmp_path / "d", size=(16, 8))
    assert ds.x.shape == (1, 16, 8, 3)
    # away from the edge (Lanczos rings a little there): white top-left, black elsewhere
    assert ds.x[0, :6, :3].min() > 235 and ds.x[0, 10:, :].max() < 20 and ds.x[0, :, 5:].max() < 20


def test_exif_orientation_is_applied(tmp_path):
    root = tmp_path / "d"
    save(root / "a" / "0.png", solid(4, 8, 0))  # 4 high, 8 wide
    stored = np.zeros((8, 4, 3), np.uint8)  # stored 8 high, 4 wide, white top row ...
    stored[0] = 255
    im = Image.fromarray(stored)
    exif = im.getexif()
    exif[0x0112] = 6  # ... shown rotated 90 degrees clockwise
    im.save(root / "a" / "1.jpg", exif=exif, quality=95)
    ds = load_image_folder(root)
    assert ds.x.shape == (2, 4, 8, 3)
    assert ds.x[1, :, -1].min() > 200 and ds.x[1, :, :-2].max() < 60  # the top row is now the right column


def test_mixed_sizes_without_size_name_a_file(tmp_path):
    root = make_folder(tmp_path / "d", {"a": 2, "b": 1})
    save(root / "b" / "odd.png", solid(10, 12, 5))
    with pytest.raises(DataError, match=r"odd\.png is 12x10 pixels.*0000\.png is 8x8.*size=\(height, width\)"):
        load_image_folder(root)


def test_non_image_file_names_the_file_and_hidden_files_are_skipped(tmp_path):
    root = make_folder(tmp_path / "d", {"a": 2, "b": 2})
    (root / "a" / ".DS_Store").write_bytes(b"\0\1junk")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.txt").write_text("not a class")
    assert len(load_image_folder(root)) == 4
    (root / "b" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=r"notes\.txt: not an image Pillow can read"):
        load_image_folder(root)


def test_truncated_image_is_an_error(tmp_path):
    root = make_folder(tmp_path / "d", {"a": 1})
    good = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(good, "JPEG")
    (root / "a" / "cut.jpg").write_bytes(good.getvalue()[:200])
    with pytest.raises(DataError, match=r"cut\.jpg"):
        load_image_folder(root, size=(8, 8))


def test_per_class_subset_is_seeded_and_deterministic(tmp_path):
    root = make_folder(tmp_path / "d", {"a": 12, "b": 12, "c": 3})
    s1 = load_image_folder(root, per_class=5, seed=1)
    s2 = load_image_folder(root, per_class=5, seed=1)
    s3 = load_image_folder(root, per_class=5, seed=2)
    assert np.bincount(s1.y).tolist() == [5, 5, 3]  # at most per_class; "c" has only 3
    np.testing.assert_array_equal(s1.x, s2.x)
    assert not np.array_equal(s1.x, s3.x)
    picked = s1.x[s1.y == 0][:, 0, 0, 1].tolist()  # the file indices picked in class "a"
    assert picked == sorted(picked) and len(set(picked)) == 5
    # a class's pick does not depend on the other classes
    solo = make_folder(tmp_path / "solo", {"a": 12})
    np.testing.assert_array_equal(load_image_folder(solo, per_class=5, seed=1).x, s1.x[s1.y == 0])


def test_grey_and_rgb_modes(tmp_path):
    grey = tmp_path / "grey"
    save(grey / "a" / "0.png", solid(6, 6, 100, grey=True))
    save(grey / "b" / "0.jpg", solid(6, 6, 30, grey=True), quality=95)
    g = load_image_folder(grey)
    assert g.x.shape == (2, 6, 6) and g.x[0, 0, 0] == 100
    rgb = load_image_folder(grey, mode="RGB")
    assert rgb.x.shape == (2, 6, 6, 3) and (rgb.x[0] == 100).all()

    colour = tmp_path / "colour"
    save(colour / "a" / "0.png", solid(6, 6, (255, 0, 0)))
    save(colour / "a" / "1.png", solid(6, 6, 200, grey=True))  # grey and colour mixed: colour
    c = load_image_folder(colour)
    assert c.x.shape == (2, 6, 6, 3) and (c.x[1] == 200).all()
    lum = load_image_folder(colour, mode="L")
    assert lum.x.shape == (2, 6, 6) and lum.x[0, 0, 0] == 76  # ITU-R 601-2 luma of pure red
    with pytest.raises(DataError, match="mode = 'CMYK'"):
        load_image_folder(colour, mode="CMYK")


def test_cache_hit_and_invalidation(tmp_path, own_cache, monkeypatch):
    root = make_folder(tmp_path / "d", {"a": 3, "b": 2})
    calls = []
    real = image_folder.decode_images
    monkeypatch.setattr(image_folder, "decode_images", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = load_image_folder(root)
    second = load_image_folder(root)
    assert len(calls) == 1 and list(own_cache.glob("image_folder-*.npz"))
    np.testing.assert_array_equal(first.x, second.x)
    np.testing.assert_array_equal(first.y, second.y)
    load_image_folder(root, size=(4, 4))  # other options: another entry
    assert len(calls) == 2
    save(root / "b" / "new.png", solid(8, 8, 9))
    third = load_image_folder(root)
    assert len(calls) == 3 and len(third) == 6


def test_parallel_decoding_matches_serial_and_reports_bad_files(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "d"
    for k in range(2):
        for i in range(300):
            save(root / f"c{k}" / f"{i:04d}.png", rng.integers(0, 256, (6, 6, 3)))
    par = load_image_folder(root, workers=2, cache=False)
    ser = load_image_folder(root, workers=1, cache=False)
    assert len(par) == 600
    np.testing.assert_array_equal(par.x, ser.x)
    (root / "c1" / "0150.png").write_bytes(b"broken")
    with pytest.raises(DataError, match=r"c1.0150\.png: not an image"):
        load_image_folder(root, workers=2, cache=False)


def test_missing_or_empty_root(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        load_image_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        load_image_folder(tmp_path / "empty")


def test_train_test_dataset_shares_the_label_order(tmp_path):
    make_folder(tmp_path / "d" / "train", {"cat": 2, "dog": 3, "emu": 1})
    make_folder(tmp_path / "d" / "test", {"dog": 1, "emu": 2})  # no cats in test
    ds = load_image_folder_dataset(tmp_path / "d")
    assert ds.class_names == ["cat", "dog", "emu"]
    assert ds.train.y.tolist() == [0, 0, 1, 1, 1, 2] and ds.test.y.tolist() == [1, 2, 2]
    make_folder(tmp_path / "d" / "test", {"yak": 1})
    with pytest.raises(DataError, match="'yak' is not one of the classes"):
        load_image_folder_dataset(tmp_path / "d")
    with pytest.raises(DataError, match="no such folder"):
        load_image_folder_dataset(tmp_path / "d" / "train")


# ---------------------------------------------------------------------------- STL-10

def stl_binary_bytes(images: np.ndarray) -> bytes:
    """Upright [n, 96, 96, 3] images in the publisher's layout, written out by hand:
    per image, per channel, the 96x96 pixels in column-major order (down column 0 first)."""
    return b"".join(img[:, :, c].flatten(order="F").tobytes() for img in images for c in range(3))


def stl_images(n: int) -> np.ndarray:
    """Distinct, asymmetric upright images: a bright bar along the top rows and a mark top-left."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 100, (n, 96, 96, 3), dtype=np.uint8)
    x[:, :10, :, 0] = 250  # red bar at the top
    x[:, :5, :5, 2] = 240  # blue mark in the top-left corner
    x[:, 50, 60, 1] = np.arange(n, dtype=np.uint8)  # row 50, column 60: the image's number
    return x


def write_stl_binary(root: Path, split: str, images: np.ndarray, labels_1_to_10, class_names=True) -> Path:
    d = root / "stl10_binary"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{split}_X.bin").write_bytes(stl_binary_bytes(images))
    (d / f"{split}_y.bin").write_bytes(np.asarray(labels_1_to_10, dtype=np.uint8).tobytes())
    if class_names:
        (d / "class_names.txt").write_text("\n".join(STL10_CLASSES) + "\n")
    return d


def test_stl10_to_cifar10_mapping():
    assert STL10_CLASSES == ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
    assert CIFAR10_CLASSES == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                               "truck"]
    assert STL10_TO_CIFAR10["car"] == "automobile" and "monkey" not in STL10_TO_CIFAR10
    assert sorted(STL10_TO_CIFAR10.values()) == sorted(set(CIFAR10_CLASSES) - {"frog"})


def test_stl10_binary_round_trip_is_upright(tmp_path):
    x = stl_images(10)
    labels = np.arange(1, 11)  # one image of each STL-10 class, labels 1..10
    write_stl_binary(tmp_path, "train", x, labels)
    raw = read_stl10_binary(tmp_path, splits=("train",))
    assert raw["class_names"] == STL10_CLASSES
    np.testing.assert_array_equal(raw["train_x"], x)
    assert raw["train_y"].tolist() == list(range(10))
    # the official loader's reading (github.com/mttk/STL10) gives the same images
    official = np.fromfile(tmp_path / "stl10_binary" / "train_X.bin", dtype=np.uint8)
    np.testing.assert_array_equal(np.reshape(official, (-1, 3, 96, 96)).transpose(0, 3, 2, 1), x)


def test_stl10_binary_as_cifar10_labels(tmp_path, own_cache):
    x = stl_images(10)
    write_stl_binary(tmp_path, "train", x, np.arange(1, 11))
    full = load_stl10_as_cifar10(tmp_path, size=None)
    assert full.class_names == CIFAR10_CLASSES
    # airplane bird car cat deer dog horse (monkey dropped) ship truck
    assert full.y.tolist() == [AIRPLANE, BIRD, AUTOMOBILE, CAT, DEER, DOG, HORSE, SHIP, TRUCK]
    np.testing.assert_array_equal(full.x, x[[0, 1, 2, 3, 4, 5, 6, 8, 9]])
    assert full.x[full.y == AUTOMOBILE][0, 50, 60, 1] == 2  # STL-10 image 2 is the car
    small = load_stl10_as_cifar10(tmp_path)
    assert small.x.shape == (9, 32, 32, 3) and small.y.tolist() == full.y.tolist()
    assert small.x[:, :3, :, 0].min() > 200 and small.x[:, 5:, :, 0].max() < 150  # still upright: bar on top
    with pytest.raises(DataError, match="test_X.bin: missing"):
        load_stl10_as_cifar10(tmp_path, split="test")


def test_stl10_binary_per_class(tmp_path, own_cache):
    labels = np.repeat(np.arange(1, 11), 4)
    write_stl_binary(tmp_path, "test", stl_images(40), labels)
    a = load_stl10_as_cifar10(tmp_path, split="test", per_class=3, seed=5)
    b = load_stl10_as_cifar10(tmp_path, split="test", per_class=3, seed=5)
    assert np.bincount(a.y, minlength=10).tolist() == [3, 3, 3, 3, 3, 3, 0, 3, 3, 3]
    np.testing.assert_array_equal(a.x, b.x)


def test_stl10_binary_lengths_are_checked(tmp_path):
    d = write_stl_binary(tmp_path, "train", stl_images(3), [1, 2, 3])
    (d / "train_y.bin").write_bytes(bytes([1, 2]))
    with pytest.raises(DataError, match="2 labels but .* 3 images"):
        read_stl10_binary(tmp_path)
    (d / "train_X.bin").write_bytes(stl_binary_bytes(stl_images(2))[:-7])
    with pytest.raises(DataError, match="not a multiple of one 3x96x96 image"):
        read_stl10_binary(tmp_path, splits=("train",))
    d2 = write_stl_binary(tmp_path / "other", "train", stl_images(2), [1, 11])
    with pytest.raises(DataError, match=r"labels 1\.\.11, expected 1\.\.10"):
        read_stl10_binary(d2)


def test_stl10_archive_extraction_and_checksum(tmp_path):
    src = write_stl_binary(tmp_path / "src", "train", stl_images(2), [3, 8])
    write_stl_binary(tmp_path / "src", "test", stl_images(1), [10])
    (src / "unlabeled_X.bin").write_bytes(stl_binary_bytes(stl_images(1)))
    archive = tmp_path / "stl10_binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name in ("test_X.bin", "test_y.bin", "unlabeled_X.bin", "class_names.txt", "train_X.bin",
                     "train_y.bin"):
            tf.add(src / name, arcname=f"stl10_binary/{name}")
    out = extract_stl10(archive, tmp_path / "dest")
    assert sorted(p.name for p in out.iterdir()) == ["class_names.txt", "test_X.bin", "test_y.bin", "train_X.bin",
                                                     "train_y.bin"]  # unlabeled_X.bin is not needed
    raw = read_stl10_binary(tmp_path / "dest")
    assert raw["train_y"].tolist() == [2, 7] and raw["test_y"].tolist() == [9]
    with tarfile.open(tmp_path / "partial.tar.gz", "w:gz") as tf:
        tf.add(src / "train_X.bin", arcname="stl10_binary/train_X.bin")
    with pytest.raises(DataError, match="has no class_names.txt, test_X.bin, test_y.bin, train_y.bin"):
        extract_stl10(tmp_path / "partial.tar.gz", tmp_path / "dest2")
    # an archive that is not the publisher's file is refused (md5), before any network access
    (tmp_path / "root").mkdir()
    os.replace(archive, tmp_path / "root" / "stl10_binary.tar.gz")
    with pytest.raises(DataError, match="wrong checksum"):
        load_stl10_as_cifar10(tmp_path / "root")


def test_stl10_image_folder_layout(tmp_path, own_cache):
    make_folder(tmp_path / "stl", {"airplane": 2, "car": 2, "monkey": 2, "ship": 1}, h=96, w=96)
    ds = load_stl10_as_cifar10(tmp_path / "stl")
    assert ds.class_names == CIFAR10_CLASSES and ds.x.shape == (5, 32, 32, 3)
    assert ds.y.tolist() == [AIRPLANE, AIRPLANE, AUTOMOBILE, AUTOMOBILE, SHIP]
    with pytest.raises(DataError, match="no STL-10 data for split 'test'"):
        load_stl10_as_cifar10(tmp_path / "stl", split="test")


# ---------------------------------------------------------------------------- the shared real data

def shared(name: str) -> Path:
    path = SHARED / name
    if not path.is_dir():
        pytest.skip(f"real data not found at {path} (set FEDSL_SHARED_DATA to the folder holding {name}/)")
    return path


def test_real_stl10_subset_as_cifar10():
    ds = load_stl10_as_cifar10(shared("stl10-subset"))
    assert ds.x.shape == (9 * 150, 32, 32, 3) and ds.x.dtype == np.uint8
    assert ds.class_names == CIFAR10_CLASSES
    assert np.bincount(ds.y, minlength=10).tolist() == [150] * 6 + [0] + [150] * 3
    assert 60 < ds.x.mean() < 200 and ds.x.std() > 30  # real pictures, not blank
    sub = load_stl10_as_cifar10(shared("stl10-subset"), per_class=56, seed=0)
    assert np.bincount(sub.y, minlength=10).tolist() == [56] * 6 + [0] + [56] * 3


def test_real_cifar10_jpeg_test_split():
    root = shared("cifar10-jpeg")
    t0 = time.perf_counter()
    ds = load_image_folder(root / "test", class_names=CIFAR10_CLASSES)
    first = time.perf_counter() - t0
    assert ds.x.shape == (10_000, 32, 32, 3) and ds.x.dtype == np.uint8
    assert np.bincount(ds.y).tolist() == [1000] * 10
    assert ds.class_names == CIFAR10_CLASSES
    t0 = time.perf_counter()
    again = load_image_folder(root / "test", class_names=CIFAR10_CLASSES)  # from the session's cache
    cached = time.perf_counter() - t0
    np.testing.assert_array_equal(again.x, ds.x)
    assert cached < max(1.0, first / 2), (first, cached)
