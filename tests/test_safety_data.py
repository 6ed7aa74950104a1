"""Issue 13, "nothing lost, nothing escapes", for the data layer.

1. Readers check a header's (or tar header's, or file's) claimed size before they allocate:
   idx (raw and gzip), CIFAR-10 pickles and binary batches, STL-10 binary, image folders
   (Pillow's decompression-bomb limit) and the cache of decoded arrays.
2. Silent data problems: an empty class folder is an error; a split missing a class is a
   warning naming it; a partition error names the class by its name.
3. Downloads have an overall deadline; the offline message mentions a partial file only
   when there is one.

Every error is a one-line ``DataError``. Memory is checked with tracemalloc, which sees
numpy's and Python's allocations (a reader that trusted a header would show its claim).
"""

from __future__ import annotations

import gzip
import http.server
import io
import pickle
import socket
import struct
import tarfile
import threading
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_idx
from PIL import Image

from fedsl.core.errors import DataError, DataWarning
from fedsl.sources import cifar10
from fedsl.sources.arrays import cached_arrays
from fedsl.sources.download import fetch
from fedsl.sources.idx import read_idx
from fedsl.sources.image_folder import load_image_folder, load_image_folder_dataset
from fedsl.sources.stl10 import extract_stl10, read_stl10_binary

MiB = 1 << 20


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


class peak_memory:
    """Peak bytes allocated (numpy and Python) inside the block: ``with peak_memory() as m: ...; m.peak``."""

    def __enter__(self):
        tracemalloc.start()
        return self

    def __exit__(self, *exc):
        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return False


def idx_header(code: int, shape: tuple[int, ...]) -> bytes:
    return bytes([0, 0, code, len(shape)]) + np.asarray(shape, dtype=">u4").tobytes()


# ------------------------------------------------------------------------------------ 1. idx

@pytest.mark.parametrize("shape", [(2**32 - 1,), (2**32 - 1, 28, 28), (10**9, 28, 28), (2**32 - 1,) * 3])
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_idx_header_claiming_huge_array_is_refused_before_allocating(tmp_path, shape, gz):
    data = idx_header(0x08, shape) + bytes(100)
    path = tmp_path / ("x.gz" if gz else "x")
    path.write_bytes(gzip.compress(data) if gz else data)
    with peak_memory() as m, pytest.raises(DataError, match=r"x(\.gz)? is truncated") as e:
        read_idx(path)
    assert str(shape) in one_line(e)
    assert m.peak < 4 * MiB


def test_idx_gzip_claim_within_the_ratio_costs_only_the_data_there(tmp_path):
    # 100 MB claimed, the compressed stream holds 1 MB of (incompressible) data: the claim passes
    # the 1032:1 bound (a real file could hold it), so the data are read -- into a buffer that
    # grows with them
    path = tmp_path / "short.gz"
    noise = np.random.default_rng(0).integers(0, 256, MiB, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(idx_header(0x08, (100_000, 1000)) + noise, compresslevel=1))
    with peak_memory() as m, pytest.raises(DataError, match=r"short.gz is truncated.*has 1048588") as e:
        read_idx(path)
    one_line(e)
    assert m.peak < 16 * MiB  # not the 100 MB claimed


def test_idx_zero_dimension_beside_huge_ones_is_a_data_error(tmp_path):
    (tmp_path / "z").write_bytes(idx_header(0x08, (0, 2**32 - 1, 2**32 - 1)))
    with pytest.raises(DataError, match=r"not a valid array shape") as e:
        read_idx(tmp_path / "z")
    one_line(e)


def test_idx_valid_files_still_read(tmp_path):
    a = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    for name in ("a.gz", "a"):
        b = read_idx(write_idx(tmp_path / name, a))
        np.testing.assert_array_equal(a, b)
        assert b.flags.writeable


# ------------------------------------------------------------------------------------ 1. CIFAR-10

N = 20


@pytest.fixture
def small_cifar(monkeypatch, tmp_path):
    monkeypatch.setattr(cifar10, "RECORDS_PER_BATCH", N)
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_cifar_member_far_larger_than_a_batch_is_refused_before_reading(tmp_path, small_cifar, kind):
    # a 40 MB batch of zeros (a few kB compressed) where 20 records are 61 kB
    folder, name = ("cifar-10-batches-py", "data_batch_1") if kind == "python" else \
        ("cifar-10-batches-bin", "data_batch_1.bin")
    tarball = cifar10.PYTHON_TARBALL if kind == "python" else cifar10.BINARY_TARBALL
    _tar(tmp_path / tarball, {f"{folder}/{name}": bytes(40 * MiB)})
    with peak_memory() as m, pytest.raises(DataError, match=rf"{name}\) is 41,943,040 bytes, more than a batch "
                                                            r"of 20 records can be \(expected at most") as e:
        cifar10.load_cifar10(tmp_path)
    one_line(e)
    assert m.peak < 8 * MiB


def test_cifar_file_in_a_folder_is_size_checked_too(tmp_path, small_cifar):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for n in [*cifar10.BIN_TRAIN, cifar10.BIN_TEST]:
        (folder / n).write_bytes(bytes(N * cifar10.RECORD_BYTES))
    with open(folder / "data_batch_2.bin", "wb") as f:
        f.truncate(1 << 33)  # 8 GiB, sparse
    with pytest.raises(DataError, match=r"data_batch_2.bin is 8,589,934,592 bytes, more than") as e:
        cifar10._decode("binary", folder)
    one_line(e)


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def test_cifar_pickle_cannot_make_numpy_allocate_what_it_only_names():
    # 100 bytes of pickle asking numpy's reconstructor for 10**7 objects (80 MB, filled with None)
    data = pickle.dumps(_Reduce(cifar10._np_reconstruct, (np.ndarray, (10**7,), b"O")), protocol=2)
    assert len(data) < 200
    with peak_memory() as m, pytest.raises(DataError, match=r"batch is not a readable CIFAR-10 pickle.*"
                                                            r"_reconstruct.*refused") as e:
        cifar10.unpickle(data, "batch")
    one_line(e)
    assert m.peak < 4 * MiB


def test_cifar_pickle_claiming_a_terabyte_of_bytes_is_a_data_error():
    data = b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc"  # BINBYTES8 of 1 TiB, 3 bytes there
    with pytest.raises(DataError, match=r"batch is not a readable CIFAR-10 pickle") as e:
        cifar10.unpickle(data, "batch")
    one_line(e)


def test_cifar_ndarray_pickles_still_load():
    rows = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072) % 251
    out = cifar10.unpickle(pickle.dumps({b"data": rows, b"labels": [1, 2]}, protocol=2), "batch")
    np.testing.assert_array_equal(out[b"data"], rows)


# ------------------------------------------------------------------------------------ 1. STL-10

def _stl_dir(root: Path, n: int = 2) -> Path:
    d = root / "stl10_binary"
    d.mkdir(parents=True)
    (d / "train_X.bin").write_bytes(bytes(n * 3 * 96 * 96))
    (d / "train_y.bin").write_bytes(bytes([1] * n))
    return d


def test_stl10_label_file_size_is_checked_before_reading_it(tmp_path):
    d = _stl_dir(tmp_path)
    (d / "train_y.bin").write_bytes(bytes([1]) * (64 * MiB))
    with peak_memory() as m, pytest.raises(DataError, match=r"train_y.bin has 67108864 labels but .*train_X.bin "
                                                            r"has 2 images") as e:
        read_stl10_binary(tmp_path, splits=("train",))
    one_line(e)
    assert m.peak < 8 * MiB


def test_stl10_class_names_that_are_not_text_are_a_data_error(tmp_path):
    d = _stl_dir(tmp_path)
    (d / "class_names.txt").write_bytes(b"airplane\n\xff\xfe\x00bird\n")
    with pytest.raises(DataError, match=r"class_names.txt is not UTF-8 text") as e:
        read_stl10_binary(tmp_path, splits=("train",))
    one_line(e)


def test_stl10_archive_member_claiming_too_much_is_refused_before_extracting(tmp_path):
    # a tar header claiming a 20 GB train_X.bin, followed by a few bytes: nothing is written
    info = tarfile.TarInfo("stl10_binary/train_X.bin")
    info.size = 20 * 10**9
    raw = info.tobuf(format=tarfile.GNU_FORMAT) + bytes(4096)
    archive = tmp_path / "stl10_binary.tar.gz"
    archive.write_bytes(gzip.compress(raw))
    with pytest.raises(DataError, match=r"member stl10_binary/train_X.bin claims 20,000,000,000 bytes, expected "
                                        r"at most 2,764,800,000") as e:
        extract_stl10(archive, tmp_path / "out")
    one_line(e)
    assert not list((tmp_path / "out" / "stl10_binary").iterdir())


# ------------------------------------------------------------------------------------ 1. image folders

def _png(path: Path, h: int, w: int, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), value, np.uint8)).save(path)


@pytest.mark.parametrize("side,size", [(12, None), (12, (8, 8)), (16, None), (16, (8, 8))],
                         ids=["warning-header", "warning-decode", "error-header", "error-decode"])
def test_decompression_bomb_warning_and_error_are_one_line_data_errors(tmp_path, monkeypatch, side, size):
    # Pillow warns above MAX_IMAGE_PIXELS and refuses above twice that: 12x12 = 144 > 100 warns,
    # 16x16 = 256 > 200 is refused; both must stop the load, naming the file and the limit
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    root = tmp_path / "d"
    _png(root / "a" / "0.png", 8, 8) if size is not None else _png(root / "a" / "0.png", side, side)
    _png(root / "a" / "1.png", side, side)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a bomb warning printed and the image decoded anyway fails here too
        with pytest.raises(DataError, match=r"a.[01]\.png: too many pixels to decode safely.*at most 100 pixels "
                                            r"\(Pillow's Image.MAX_IMAGE_PIXELS\)") as e:
            load_image_folder(root, size=size, workers=1, cache=False)
    one_line(e)


def test_folder_too_big_to_decode_in_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    import fedsl.sources.image_folder as image_folder
    root = tmp_path / "d"
    for i in range(3):
        _png(root / "a" / f"{i}.png", 64, 64)
    monkeypatch.setattr(image_folder, "_memory_bytes", lambda: 30_000, raising=False)  # 3x64x64x3 = 36,864 bytes
    decoded = []
    monkeypatch.setattr(image_folder, "_decode_chunk", lambda *a: decoded.append(a))
    with pytest.raises(DataError, match=r"3 images of 64x64 pixels .* more than this machine's .*size=\(height, "
                                        r"width\)") as e:
        load_image_folder(root, workers=1, cache=False)
    one_line(e)
    assert not decoded


# ------------------------------------------------------------------------------------ 1. the cache

def _npz_claiming(path: Path, shape: tuple[int, ...]) -> None:
    """A .npz whose one array header claims ``shape`` (uint8) but holds 16 bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("x.npy", header.getvalue() + bytes(16))  # the header starts with the magic


@pytest.mark.parametrize("damage", ["huge-header", "not-a-zip", "truncated-zip"])
def test_damaged_cache_entry_is_rebuilt_not_a_traceback(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path))
    recipe = {"t": 1}
    good = cached_arrays("t", recipe, lambda: {"x": np.arange(5)})
    [path] = tmp_path.glob("t-*.npz")
    if damage == "huge-header":
        _npz_claiming(path, (1 << 40,))  # numpy would allocate 1 TiB before reading
    elif damage == "not-a-zip":
        path.write_bytes(b"PK\x03\x04" + bytes(50))
    else:
        path.write_bytes(path.read_bytes()[:-30])
    with peak_memory() as m:
        again = cached_arrays("t", recipe, lambda: {"x": np.arange(5)})
    np.testing.assert_array_equal(again["x"], good["x"])
    assert m.peak < 4 * MiB


# ------------------------------------------------------------------------------------ 2. silent data problems

def _folder(root: Path, counts: dict[str, int]) -> Path:
    for k, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            _png(root / name / f"{i}.png", 8, 8, k * 20 + i)
    return root


def test_empty_class_folder_is_an_error_naming_it(tmp_path):
    root = _folder(tmp_path / "d", {"ant": 3, "bee": 0, "cat": 3})
    (root / "bee" / ".DS_Store").write_bytes(b"hidden files are not images")
    with pytest.raises(DataError, match=r"d.bee: class folder 'bee' holds no images; expected at least one image "
                                        r"per class folder.*ignore=\['bee'\]") as e:
        load_image_folder(root)
    one_line(e)
    assert len(load_image_folder(root, ignore=["bee"])) == 6  # skipping it is the way out


def test_empty_class_folder_is_found_even_when_a_cached_entry_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))
    root = _folder(tmp_path / "d", {"ant": 2, "cat": 2})
    load_image_folder(root)
    (root / "bee").mkdir()
    with pytest.raises(DataError, match="'bee' holds no images"):
        load_image_folder(root)


def test_split_missing_a_class_warns_naming_it(tmp_path):
    _folder(tmp_path / "d" / "train", {"ant": 2, "bee": 2, "cat": 2})
    _folder(tmp_path / "d" / "test", {"ant": 1, "cat": 1})
    with pytest.warns(DataWarning, match=r"test split .*test has no sample of class 'bee' \(expected every one of "
                                         r"the 3 classes\)") as record:
        ds = load_image_folder_dataset(tmp_path / "d")
    assert len(record) == 1 and "\n" not in str(record[0].message)
    assert ds.class_names == ["ant", "bee", "cat"] and ds.test.y.tolist() == [0, 2]
    # with class_names, a class no split has: both splits warn, naming the classes
    with pytest.warns(DataWarning) as record:
        load_image_folder_dataset(tmp_path / "d", class_names=["ant", "bee", "cat", "dog", "emu"])
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert "training split" in messages[0] and "has no sample of classes 'dog', 'emu' " in messages[0]
    assert "test split" in messages[1] and "has no sample of classes 'bee', 'dog', 'emu' " in messages[1]


def test_complete_splits_do_not_warn(tmp_path):
    _folder(tmp_path / "d" / "train", {"ant": 2, "bee": 2})
    _folder(tmp_path / "d" / "test", {"ant": 1, "bee": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        load_image_folder_dataset(tmp_path / "d")


def _config(root: Path, **kw):
    from fedsl.config.schema import DataConfig
    return DataConfig(dataset="image_folder", data_dir=str(root), **kw)


def test_run_config_warns_about_a_test_split_missing_a_class(tmp_path, monkeypatch):
    from fedsl.data import datasets
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "_LOADED", {})
    _folder(tmp_path / "d" / "train", {"ant": 4, "bee": 4, "cat": 4})
    _folder(tmp_path / "d" / "test", {"ant": 1, "cat": 1})
    with pytest.warns(DataWarning, match="has no sample of class 'bee'"):
        datasets.load_arrays(_config(tmp_path / "d"))
    # a class subset is checked after subsetting: 'bee' dropped, nothing to say
    monkeypatch.setattr(datasets, "_LOADED", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        datasets.load_arrays(_config(tmp_path / "d", classes=["ant", "cat"]))


def test_partition_error_names_the_class_by_its_name(tmp_path, monkeypatch):
    from fedsl.data import datasets
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "_LOADED", {})
    _folder(tmp_path / "d" / "train", {"ant": 6, "cat": 6, "dog": 2})
    _folder(tmp_path / "d" / "test", {"ant": 1, "cat": 1, "dog": 1})
    d = _config(tmp_path / "d", num_clients=4, classes_per_client=2, samples_per_client=2)
    with pytest.raises(DataError, match=r"^class 2 \('dog'\) has 2 samples but the partition .* needs 3") as e:
        datasets.build_federation(d, 0)
    one_line(e)


def test_partition_error_names_the_classes_without_samples():
    from fedsl.data.partition import by_classes
    from fedsl.data.server_data import iid_per_class
    labels = np.array([0, 0, 0, 2, 2, 2])
    with pytest.raises(DataError, match=r"expected 1..2 \(the training pool has samples of 2 of the 3 classes; "
                                        r"none of \['bee'\]\)"):
        by_classes(labels, 2, 3, 3, seed=0, class_names=["ant", "bee", "cat"])
    with pytest.raises(DataError, match=r"needs 4 samples of class \d \('(ant|cat)'\), only 3 exist"):
        iid_per_class(labels, 8, seed=0, class_names=["ant", "bee", "cat"])


# ------------------------------------------------------------------------------------ 3. downloads

@pytest.fixture
def no_proxy(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("FEDSL_DOWNLOAD_DEADLINE", raising=False)


@pytest.fixture
def trickle_server(no_proxy):
    """A server announcing 1,000 bytes and sending one every 50 ms (50 s in all); stopped after the test."""
    stop = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):
                    if stop.wait(0.05):
                        return
                    self.wfile.write(b"x")
                    self.wfile.flush()
            except OSError:  # the client gave up
                pass

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/slow.bin"
    stop.set()
    srv.shutdown()
    srv.server_close()
    thread.join(5)


@pytest.mark.parametrize("how", ["argument", "env"])
def test_download_that_trickles_stops_at_its_deadline(tmp_path, trickle_server, monkeypatch, how):
    dest = tmp_path / "slow.bin"
    kw = {}
    if how == "env":
        monkeypatch.setenv("FEDSL_DOWNLOAD_DEADLINE", "0.5")
    else:
        kw["deadline"] = 0.5
    start = time.monotonic()
    with pytest.raises(DataError, match=r"download of .*slow.bin did not finish within its deadline of 0.5 s "
                                        r"\(at \d+ of 1,000 bytes.*FEDSL_DOWNLOAD_DEADLINE.*partial file .*"
                                        r"slow.bin.part .* is kept") as e:
        fetch(trickle_server, dest, timeout=5, **kw)
    one_line(e)
    assert time.monotonic() - start < 3
    assert (tmp_path / "slow.bin.part").stat().st_size > 0 and not dest.exists()


def test_bad_deadline_setting_is_a_data_error(tmp_path, no_proxy, monkeypatch):
    monkeypatch.setenv("FEDSL_DOWNLOAD_DEADLINE", "soon")
    with pytest.raises(DataError, match=r"FEDSL_DOWNLOAD_DEADLINE = 'soon': expected a number of seconds > 0"):
        fetch("http://127.0.0.1:9/x", tmp_path / "x")


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


def test_offline_message_mentions_a_partial_file_only_when_there_is_one(tmp_path, no_proxy):
    url = f"http://127.0.0.1:{_closed_port()}/file.bin"
    dest = tmp_path / "file.bin"
    with pytest.raises(DataError, match=r"cannot download .*file.bin .*offline, put the file at") as e:
        fetch(url, dest, timeout=5)
    assert ".part" not in one_line(e) and "partial" not in str(e.value)
    assert not (tmp_path / "file.bin.part").exists()
    (tmp_path / "file.bin.part").write_bytes(b"half")
    with pytest.raises(DataError, match=r"the partial file .*file.bin.part \(4 bytes\) is kept and the next try "
                                        r"resumes it") as e:
        fetch(url, dest, timeout=5)
    one_line(e)
