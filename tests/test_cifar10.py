"""CIFAR-10 readers on tiny, format-exact copies of the publisher's files (20 records a batch)."""

from __future__ import annotations

import builtins
import hashlib
import http.server
import io
import os
import pickle
import struct
import tarfile
import threading

import numpy as np
import pytest

from fedsl.core.errors import DataError
from fedsl.sources import cifar10
from fedsl.sources.cifar10 import CIFAR10_CLASSES, load_cifar10

N = 20  # records per batch in these fixtures (10,000 in the real files)


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch, tmp_path):
    monkeypatch.setattr(cifar10, "RECORDS_PER_BATCH", N)
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))  # each test its own cache


# --- writing the publisher's formats ---------------------------------------------------------

class _Py2Pickler(pickle._Pickler):
    """Pickles like python 2's cPickle did for the real files: str/bytes as BINSTRING."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        if isinstance(obj, str):
            obj = obj.encode("latin1")
        n = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)
        self.write(head + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str
    dispatch[str] = _save_py2_str


def py2_dumps(obj) -> bytes:
    f = io.BytesIO()
    _Py2Pickler(f, protocol=2).dump(obj)
    # numpy 1.x (and the real files) name the reconstructor numpy.core.multiarray
    return f.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")


def make_batches(seed=0, n=N):
    """Six batches (5 train + test) of random CHW rows [n, 3072] uint8 and labels 0..9."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()) for _ in range(6)]


def _py_names():
    return [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def python_files(batches, dumps=py2_dumps) -> dict[str, bytes]:
    files = {}
    for i, (name, (rows, labels)) in enumerate(zip(_py_names(), batches)):
        label = f"training batch {i + 1} of 5" if i < 5 else "testing batch 1 of 1"
        files[name] = dumps({b"batch_label": label.encode(), b"labels": labels, b"data": rows,
                             b"filenames": [f"img_{i}_{j}.png".encode() for j in range(len(labels))]})
    files["batches.meta"] = dumps({b"num_cases_per_batch": len(batches[0][1]), b"num_vis": 3072,
                                   b"label_names": [c.encode() for c in CIFAR10_CLASSES]})
    return files


def binary_files(batches) -> dict[str, bytes]:
    files = {}
    for name, (rows, labels) in zip(_py_names(), batches):
        files[name + ".bin"] = np.concatenate([np.asarray(labels, np.uint8)[:, None], rows], axis=1).tobytes()
    files["batches.meta.txt"] = ("\n".join(CIFAR10_CLASSES) + "\n\n").encode()
    return files


def write_folder(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def write_tar(path, folder_name, files):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{folder_name}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def expected(batches):
    rows = np.concatenate([b[0] for b in batches[:5]])
    return rows, np.concatenate([b[1] for b in batches[:5]]), batches[5][0], np.asarray(batches[5][1])


def assert_matches(ds, batches):
    rows, y, rows_t, y_t = expected(batches)
    for s, r, lab, n in ((ds.train, rows, y, 5 * N), (ds.test, rows_t, y_t, N)):
        assert s.x.dtype == np.uint8 and s.x.shape == (n, 32, 32, 3)
        assert s.y.dtype == np.int64 and np.array_equal(s.y, lab)
        assert s.class_names == CIFAR10_CLASSES
        # CHW row -> HWC image, element by element: x[i, h, w, c] == row[c*1024 + h*32 + w]
        i, h, w, c = np.meshgrid(np.arange(n), np.arange(32), np.arange(32), np.arange(3), indexing="ij")
        assert np.array_equal(s.x[i, h, w, c], r[i, c * 1024 + h * 32 + w])
    assert ds.class_names == CIFAR10_CLASSES


# --- round trips ---------------------------------------------------------------------------

def test_python_folder_round_trip(tmp_path):
    batches = make_batches()
    write_folder(tmp_path / "cifar-10-batches-py", python_files(batches))
    assert_matches(load_cifar10(tmp_path), batches)


def test_python_tarball_round_trip(tmp_path):
    batches = make_batches(1)
    write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", python_files(batches))
    assert_matches(load_cifar10(tmp_path), batches)
    assert not (tmp_path / "cifar-10-batches-py").exists()  # read from the tar, not extracted


def test_python3_protocol2_pickles_round_trip(tmp_path):
    # copies re-pickled by python 3 spell bytes as _codecs.encode(str, 'latin1') and numpy._core
    batches = make_batches(2)
    write_folder(tmp_path / "cifar-10-batches-py", python_files(batches, lambda o: pickle.dumps(o, protocol=2)))
    assert_matches(load_cifar10(tmp_path), batches)


@pytest.mark.parametrize("as_tar", [False, True])
def test_binary_round_trip(tmp_path, as_tar):
    batches = make_batches(3)
    if as_tar:
        write_tar(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin", binary_files(batches))
    else:
        write_folder(tmp_path / "cifar-10-batches-bin", binary_files(batches))
    assert_matches(load_cifar10(tmp_path), batches)
    binary = tmp_path / ("cifar-10-binary.tar.gz" if as_tar else "cifar-10-batches-bin")
    assert_matches(cifar10._dataset(cifar10._decode("binary", binary)), batches)  # the decoder itself, no cache


def test_root_may_be_the_extracted_folder(tmp_path):
    batches = make_batches(4)
    folder = write_folder(tmp_path / "somewhere", python_files(batches))
    assert_matches(load_cifar10(folder), batches)


def test_sources_are_looked_for_in_order(tmp_path):
    b = make_batches(5)
    write_tar(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin", binary_files(b))
    assert cifar10.find_cifar10(tmp_path) == ("binary", tmp_path / "cifar-10-binary.tar.gz")
    write_folder(tmp_path / "cifar-10-batches-bin", binary_files(b))
    assert cifar10.find_cifar10(tmp_path) == ("binary", tmp_path / "cifar-10-batches-bin")
    write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", python_files(b))
    assert cifar10.find_cifar10(tmp_path) == ("python", tmp_path / "cifar-10-python.tar.gz")
    (tmp_path / "cifar-10-batches-py").mkdir()  # an empty folder (failed extraction) does not count
    assert cifar10.find_cifar10(tmp_path) == ("python", tmp_path / "cifar-10-python.tar.gz")
    write_folder(tmp_path / "cifar-10-batches-py", python_files(b))
    assert cifar10.find_cifar10(tmp_path) == ("python", tmp_path / "cifar-10-batches-py")


# --- nothing there, damaged files ------------------------------------------------------------

def test_nothing_found_lists_names_and_how_to_download(tmp_path):
    with pytest.raises(DataError) as e:
        load_cifar10(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg
    for name in ("cifar-10-batches-py", "cifar-10-python.tar.gz", "cifar-10-batches-bin", "cifar-10-binary.tar.gz"):
        assert name in msg
    assert "fedsl data prepare cifar10" in msg and "download = true" in msg
    (tmp_path / "cifar-10-python.tar.gz.part").write_bytes(b"partial")
    with pytest.raises(DataError, match="partial download"):
        load_cifar10(tmp_path)


@pytest.mark.parametrize("fmt", ["python-folder", "python-tar", "binary-folder", "binary-tar"])
def test_missing_batch(tmp_path, fmt):
    kind, layout = fmt.split("-")
    files = (python_files if kind == "python" else binary_files)(make_batches())
    victim = "data_batch_3" + ("" if kind == "python" else ".bin")
    del files[victim]
    folder = "cifar-10-batches-py" if kind == "python" else "cifar-10-batches-bin"
    if layout == "folder":
        write_folder(tmp_path / folder, files)
    else:
        write_tar(tmp_path / ("cifar-10-python.tar.gz" if kind == "python" else "cifar-10-binary.tar.gz"),
                  folder, files)
    with pytest.raises(DataError, match=f"{victim}.*missing.*re-download") as e:
        load_cifar10(tmp_path)
    assert "\n" not in str(e.value)


def test_record_count_is_checked(tmp_path):
    batches = make_batches()
    rows, labels = batches[2]
    batches[2] = (rows[:-1], labels[:-1])
    write_folder(tmp_path / "cifar-10-batches-bin", binary_files(batches))
    with pytest.raises(DataError, match=r"data_batch_3.bin has 19 records, expected 20"):
        load_cifar10(tmp_path)
    write_folder(tmp_path / "cifar-10-batches-py", python_files(batches))
    with pytest.raises(DataError, match=r"data_batch_3 has 19 records, expected 20"):
        load_cifar10(tmp_path)


def test_real_files_are_held_to_10000_records(monkeypatch):
    monkeypatch.setattr(cifar10, "RECORDS_PER_BATCH", 10_000)
    with pytest.raises(DataError, match=r"data_batch_3 has 9,999 records, expected 10,000; re-download"):
        cifar10._binary_batch(bytes(9_999 * 3073), "data_batch_3", "cifar-10-batches-bin")
    x, y = cifar10._binary_batch(bytes(10_000 * 3073), "data_batch_3", "cifar-10-batches-bin")
    assert x.shape == (10_000, 32, 32, 3) and y.shape == (10_000,)


def test_truncated_binary_file(tmp_path):
    files = binary_files(make_batches())
    files["test_batch.bin"] = files["test_batch.bin"][:-100]
    write_folder(tmp_path / "cifar-10-batches-bin", files)
    with pytest.raises(DataError, match=r"test_batch.bin is 61,360 bytes, not a whole number of 3,073-byte"):
        load_cifar10(tmp_path)


def test_truncated_tarball(tmp_path):
    tar = write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", python_files(make_batches()))
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    with pytest.raises(DataError, match=r"cifar-10-python.tar.gz is not a readable .tar.gz.*re-download"):
        load_cifar10(tmp_path)


def test_truncated_pickle(tmp_path):
    files = python_files(make_batches())
    files["data_batch_2"] = files["data_batch_2"][:5000]
    write_folder(tmp_path / "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"data_batch_2 is not a readable CIFAR-10 pickle"):
        load_cifar10(tmp_path)


def test_bad_labels_and_class_names(tmp_path):
    batches = make_batches()
    batches[1][1][7] = 10
    write_folder(tmp_path / "a" / "cifar-10-batches-bin", binary_files(batches))
    with pytest.raises(DataError, match=r"data_batch_2.bin has labels outside 0..9 \(e.g. 10\)"):
        load_cifar10(tmp_path / "a")
    files = python_files(make_batches())
    files["batches.meta"] = py2_dumps({b"label_names": [b"apple", b"aquarium_fish"]})
    write_folder(tmp_path / "b" / "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"batches.meta names the classes"):
        load_cifar10(tmp_path / "b")


def test_wrong_pixel_dtype(tmp_path):
    files = python_files(make_batches())
    files["test_batch"] = py2_dumps({b"data": np.zeros((N, 3072), np.int64), b"labels": [0] * N})
    write_folder(tmp_path / "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"test_batch: data is int64 \[20, 3072\], expected uint8 \[20, 3072\]"):
        load_cifar10(tmp_path)


# --- the restricted unpickler ------------------------------------------------------------------

class _Evil:
    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return self.func, (self.arg,)


@pytest.mark.parametrize("func,arg", [
    (os.system, "echo pwned > marker"),
    (builtins.eval, "open('marker', 'w').write('pwned')"),
    (builtins.exec, "open('marker', 'w').write('pwned')"),
])
@pytest.mark.parametrize("where", ["top", "nested"])
def test_malicious_pickle_is_refused(tmp_path, monkeypatch, func, arg, where):
    monkeypatch.chdir(tmp_path)
    files = python_files(make_batches())
    evil = _Evil(func, arg)
    if where == "top":
        files["data_batch_1"] = pickle.dumps(evil, protocol=2)
    else:
        files["data_batch_1"] = pickle.dumps({b"data": np.zeros((N, 3072), np.uint8), b"labels": [evil]}, protocol=2)
    write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"data_batch_1.*is not a CIFAR-10 batch.*refused") as e:
        load_cifar10(tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "marker").exists()


def test_unpickler_refuses_other_numpy_and_codecs_tricks():
    with pytest.raises(DataError, match="numpy.load"):
        cifar10.unpickle(pickle.dumps(_Evil(np.load, "x"), protocol=2), "batch")
    # _codecs.encode only as bytes are pickled: latin-1
    bad = b"\x80\x02c_codecs\nencode\nq\x00X\x01\x00\x00\x00xq\x01X\x04\x00\x00\x00zlibq\x02\x86q\x03Rq\x04."
    with pytest.raises(DataError, match="not a readable CIFAR-10 pickle"):
        cifar10.unpickle(bad, "batch")


# --- the cache -------------------------------------------------------------------------------

def test_second_load_is_served_from_cache_and_a_changed_file_is_decoded_again(tmp_path, monkeypatch):
    tar = write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", python_files(make_batches(7)))
    calls = []
    real = cifar10._decode

    def counting(kind, path):
        calls.append(path)
        return real(kind, path)

    monkeypatch.setattr(cifar10, "_decode", counting)
    first = load_cifar10(tmp_path)
    assert len(calls) == 1 and list((tmp_path / "cache").glob("cifar10-*.npz"))

    def fail(kind, path):
        raise AssertionError("decoded again instead of read from the cache")

    monkeypatch.setattr(cifar10, "_decode", fail)
    second = load_cifar10(tmp_path)
    assert np.array_equal(first.train.x, second.train.x) and np.array_equal(first.test.y, second.test.y)
    assert second.class_names == CIFAR10_CLASSES

    batches = make_batches(8)
    write_tar(tar, "cifar-10-batches-py", python_files(batches))  # a changed file: a new key
    monkeypatch.setattr(cifar10, "_decode", counting)
    third = load_cifar10(tmp_path)
    assert len(calls) == 2
    assert_matches(third, batches)
    assert len(list((tmp_path / "cache").glob("cifar10-*.npz"))) == 2


def test_folder_cache_key_follows_each_batch(tmp_path, monkeypatch):
    batches = make_batches(9)
    folder = write_folder(tmp_path / "cifar-10-batches-py", python_files(batches))
    load_cifar10(tmp_path)
    batches[5][0][0, 0] ^= 0xFF
    write_folder(folder, {"test_batch": python_files(batches)["test_batch"]})
    assert_matches(load_cifar10(tmp_path), batches)


# --- download against a local server -----------------------------------------------------------

class _Server:
    """Serves ``payload`` at /cifar-10-python.tar.gz; mode 'full', 'truncate' or 'range'."""

    def __init__(self, payload: bytes):
        self.payload, self.mode, self.ranges = payload, "full", []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                rng = self.headers.get("Range")
                server.ranges.append(rng)
                data = server.payload
                if server.mode == "range" and rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                    body = data[start:]
                else:
                    self.send_response(200)
                    body = data
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.mode == "truncate":
                    body = body[: len(body) // 2]  # promise everything, send half, hang up
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/cifar-10-python.tar.gz"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    batches = make_batches(11)
    tar = write_tar(tmp_path / "srv" / "cifar-10-python.tar.gz", "cifar-10-batches-py", python_files(batches))
    payload = tar.read_bytes()
    s = _Server(payload)
    s.batches = batches
    monkeypatch.setattr(cifar10, "PYTHON_URL", s.url)
    monkeypatch.setattr(cifar10, "PYTHON_MD5", hashlib.md5(payload).hexdigest())
    yield s
    s.close()


def test_download(tmp_path, server):
    root = tmp_path / "data"
    with pytest.raises(DataError):
        load_cifar10(root)  # not without download=True
    assert server.ranges == []
    assert_matches(load_cifar10(root, download=True), server.batches)
    assert (root / "cifar-10-python.tar.gz").read_bytes() == server.payload
    assert not (root / "cifar-10-python.tar.gz.part").exists()
    assert_matches(load_cifar10(root, download=True), server.batches)  # found: no second request
    assert server.ranges == [None]


def test_download_with_wrong_checksum_leaves_nothing(tmp_path, server, monkeypatch):
    monkeypatch.setattr(cifar10, "PYTHON_MD5", "0" * 32)
    root = tmp_path / "data"
    with pytest.raises(DataError, match="checksum") as e:
        load_cifar10(root, download=True)
    assert "\n" not in str(e.value)
    assert not (root / "cifar-10-python.tar.gz").exists()
    assert not (root / "cifar-10-python.tar.gz.part").exists()


def test_truncated_download_is_kept_and_resumed(tmp_path, server):
    root = tmp_path / "data"
    part = root / "cifar-10-python.tar.gz.part"
    server.mode = "truncate"
    with pytest.raises(DataError):
        load_cifar10(root, download=True)
    half = len(server.payload) // 2
    assert part.read_bytes() == server.payload[:half]
    assert not (root / "cifar-10-python.tar.gz").exists()
    with pytest.raises(DataError, match="partial download"):
        load_cifar10(root)  # download=False: says a partial file is there
    server.mode = "range"
    assert_matches(load_cifar10(root, download=True), server.batches)
    assert server.ranges == [None, f"bytes={half}-"]
    assert (root / "cifar-10-python.tar.gz").read_bytes() == server.payload and not part.exists()
