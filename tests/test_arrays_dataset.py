"""Your own features and labels (``data.dataset = 'arrays'``, an .npz), float features from Python, and a model
module beside its config: run from the command line and from Python, every bad file refused in one line."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsl.cli import main
from fedsl.config import loading
from fedsl.config.schema import ConfigError, DataConfig
from fedsl.core.errors import DataError
from fedsl.data.datasets import build_federation, feature_stats, load_arrays, to_tensor
from fedsl.sources.array_files import from_arrays

K, D = 3, 6  # classes, features


def blobs(n: int, seed: int = 0, centres_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of K Gaussian blobs in D dimensions, float32, on a scale far from standard (mean 50, std 10)."""
    centres = np.random.default_rng(centres_seed).normal(0, 3, (K, D))
    g = np.random.default_rng(seed)
    y = np.arange(n) % K
    return (50 + 10 * (centres[y] + g.normal(0, 1, (n, D)))).astype(np.float32), y.astype(np.int64)


def write_npz(path: Path, **arrays) -> Path:
    (x_train, y_train), (x_test, y_test) = blobs(240, 1), blobs(60, 2)
    np.savez(path, **{"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, **arrays})
    return path


RUN = """
name = "blobs"
rounds = 3
seed = 0
threads = 1

[data]
dataset = "arrays"
data_dir = "{data}"
num_clients = 6
classes_per_client = 2
samples_per_client = 30
server_size = 15

[model]
name = "{model}"

[algorithm]
name = "fsl"
clients_per_round = 3
local_lr = 0.05
batch_size = 10
"""


def write_run(folder: Path, data: Path, model: str = "mlp") -> Path:
    path = folder / "run.toml"
    path.write_text(RUN.format(data=data, model=model), encoding="utf-8")
    return path


def accuracies(folder: Path) -> list[str]:
    with open(folder / "metrics.csv", newline="") as f:
        return [row["accuracy"] for row in csv.DictReader(f)]


def test_an_npz_runs_from_the_command_line_and_from_python_alike(tmp_path, one_thread):
    """A TOML naming an .npz runs with `fedsl run`; the same config through Python (loading.load, run_group) gives
    the same accuracies, round for round, and the model learns the blobs."""
    from fedsl.sweeps.compare import run_group

    toml = write_run(tmp_path, write_npz(tmp_path / "blobs.npz"))
    assert main(["run", str(toml), "--out", str(tmp_path / "cli"), "-q"]) == 0
    cfg = loading.load(toml)
    [summary] = run_group(cfg, tmp_path / "py", progress=False)
    assert summary["status"] == "completed"
    cli, py = accuracies(tmp_path / "cli" / "blobs"), accuracies(tmp_path / "py" / "blobs")
    assert cli == py and len(cli) == 4
    assert float(cli[-1]) > 0.8  # chance is 1/3
    saved = json.loads((tmp_path / "cli" / "blobs" / "config.json").read_text())
    assert saved["data"]["dataset"] == "arrays" and saved["model"]["import_dir"] is None  # a built-in model


def test_features_are_standardised_per_feature_from_the_training_split(tmp_path):
    """normalize = 'standardize' (the default): each feature of the pool has mean 0 and std 1 over the training
    split, the test set takes the same statistics; 'unit': the features as given. The file's arrays stay as they
    were, and the input shape is the features' own, so mlp and linear fit it."""
    path = write_npz(tmp_path / "blobs.npz")
    raw = np.load(path)
    d = DataConfig(dataset="arrays", data_dir=str(path), num_clients=6, partition="iid")
    fed = build_federation(d, seed=0)
    assert fed.input_shape == (D,) and fed.x.dtype == torch.float32
    np.testing.assert_allclose(fed.x.mean(0).numpy(), 0, atol=1e-4)
    np.testing.assert_allclose(fed.x.std(0, unbiased=False).numpy(), 1, atol=1e-4)
    mean, std = np.asarray(fed.input_stats[0]), np.asarray(fed.input_stats[1])
    np.testing.assert_allclose(fed.x_test.numpy(), (raw["x_test"] - mean) / std, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(load_arrays(d).train.x, raw["x_train"])  # nothing standardised in place

    unit = build_federation(d.model_copy(update={"normalize": "unit"}), seed=0)
    assert unit.input_stats is None
    np.testing.assert_array_equal(unit.x.numpy(), raw["x_train"])


@pytest.mark.parametrize("data", [
    {"partition": "classes", "classes_per_client": 2, "samples_per_client": 30, "server_size": 15},
    {"partition": "dirichlet", "dirichlet_alpha": 1.0, "server_source": "clients", "server_clients": 2,
     "server_samples_per_client": 3},
    {"partition": "iid", "server_size": 12, "server_overlap": False},
    {"partition": "shards", "validation": 0.2},
])
def test_the_partitions_and_server_sources_of_every_dataset(tmp_path, data):
    path = write_npz(tmp_path / "blobs.npz")
    fed = build_federation(DataConfig(dataset="arrays", data_dir=str(path), num_clients=6, **data), seed=3)
    assert fed.num_clients == 6 and fed.n > 0 and fed.num_classes == K
    if data["partition"] == "classes":
        assert all(len(np.unique(fed.y[fed.clients[i]].numpy())) == 2 for i in range(6))
    assert fed.n0 == {"classes": 15, "dirichlet": 6, "iid": 12, "shards": 0}[data["partition"]]


def test_server_data_from_another_npz(tmp_path):
    """D0 from another file (data.server_dataset = 'arrays'): its x_train and y_train, appended to the pool and
    standardised with the clients' statistics; its class_names must be the clients'."""
    clients = write_npz(tmp_path / "clients.npz", class_names=np.array(["a", "b", "c"]))
    x0, y0 = blobs(9, seed=5)
    np.savez(tmp_path / "d0.npz", x_train=x0, y_train=y0)  # no test split: not read
    d = DataConfig(dataset="arrays", data_dir=str(clients), num_clients=6, partition="iid",
                   server_source="dataset", server_dataset="arrays", server_data_dir=str(tmp_path / "d0.npz"))
    fed = build_federation(d, seed=0)
    assert fed.n0 == 9 and fed.class_names == ["a", "b", "c"]
    mean, std = np.asarray(fed.input_stats[0]), np.asarray(fed.input_stats[1])
    np.testing.assert_allclose(fed.x[torch.from_numpy(fed.server)].numpy(), (x0 - mean) / std, rtol=1e-5, atol=1e-5)
    assert fed.y[torch.from_numpy(fed.server)].tolist() == y0.tolist()

    np.savez(tmp_path / "other.npz", x_train=x0, y_train=y0, class_names=np.array(["x", "y", "z"]))
    with pytest.raises(DataError, match=r"class_names = \['x', 'y', 'z'\]: expected the clients' \['a', 'b', 'c'\]"):
        build_federation(d.model_copy(update={"server_data_dir": str(tmp_path / "other.npz")}), seed=0)


@pytest.mark.parametrize("data, message", [
    ({"dataset": "arrays", "server_source": "dataset", "server_dataset": "fslsyn"},
     "data.server_dataset = 'fslsyn' gives images, but data.dataset = 'arrays' gives features: expected "
     "data.server_dataset = 'arrays'"),
    ({"dataset": "arrays", "unlabelled": "stl10"}, "data.unlabelled = 'stl10' gives images"),
    ({"dataset": "arrays", "server_source": "dataset", "server_dataset": "arrays"},
     "data.server_dataset = 'arrays' reads an .npz of its own: expected data.server_data_dir"),
    ({"dataset": "toy", "server_source": "dataset", "server_dataset": "arrays", "server_data_dir": "d0.npz"},
     "data.server_dataset = 'arrays' gives features from an .npz, but data.dataset = 'toy' gives images or text"),
])
def test_features_and_images_do_not_mix_as_server_data(data, message):
    with pytest.raises(ConfigError) as e:
        loading.load(base={"rounds": 2, "data": data, "algorithm": {"name": "fsl"}})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def _touch(path: str) -> None:  # pragma: no cover - never called: the file is never unpickled
    pathlib.Path(path).touch()


class Trap:
    """An object whose unpickling would create a file: a file that held it, loaded with pickles allowed, would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _bad_files(tmp: Path) -> list[tuple[str, Path, str]]:
    """(id, file, what the one line says) of every kind of bad file."""
    (x, y), (xt, yt) = blobs(30), blobs(9, 1)

    def npz(name: str, **over) -> Path:
        arrays = {"x_train": x, "y_train": y, "x_test": xt, "y_test": yt, **over}
        np.savez(tmp / f"{name}.npz", **{k: v for k, v in arrays.items() if v is not None})
        return tmp / f"{name}.npz"

    nan, inf = x.copy(), xt.copy()
    nan[4, 2] = np.nan
    inf[7, 0] = np.inf
    (tmp / "garbage.npz").write_bytes(b"x_train,y_train\n1,2\n")
    (tmp / "folder").mkdir()
    pickle = np.empty(len(y), dtype=object)
    pickle[:] = [Trap(tmp / "unpickled") for _ in range(len(y))]
    return [
        ("no-file", tmp / "absent.npz", "absent.npz': no such file: expected an .npz of x_train"),
        ("folder-without-arrays.npz", tmp / "folder", "arrays.npz': no such file"),
        ("not-an-npz", tmp / "garbage.npz", "garbage.npz' is not a readable .npz"),
        ("missing-key", npz("missing", y_test=None), "missing.npz' has no 'y_test' (it holds 'x_train', 'y_train', "
                                                     "'x_test'): expected an .npz of"),
        ("unknown-key", npz("unknown", X_train=x), "unknown.npz' holds 'X_train': expected only the keys"),
        ("pickle", npz("pickle", x_train=pickle), "pickle.npz': x_train holds Python objects (dtype object: a "
                                                  "pickle, never loaded)"),
        ("float-labels", npz("floaty", y_train=y.astype(np.float64)), "floaty.npz': y_train has dtype float64: "
                                                                      "expected integer labels"),
        ("complex-features", npz("complex", x_test=xt.astype(np.complex64)), "complex.npz': x_test has dtype "
                                                                             "complex64: expected real numbers"),
        ("one-feature-axis-missing", npz("flat", x_train=x[:, 0]), "flat.npz': x_train has shape (30,): expected "
                                                                   "one row per sample"),
        ("labels-2d", npz("y2d", y_train=y[:, None]), "y2d.npz': y_train has shape (30, 1): expected [n]"),
        ("length-mismatch", npz("short", y_train=y[:-1]), "short.npz': x_train has 30 samples and y_train 29 labels"),
        ("shape-mismatch", npz("shapes", x_test=xt[:, :4]), "shapes.npz': x_test's samples have shape (4,), "
                                                            "x_train's (6,): expected the same"),
        ("negative-label", npz("negative", y_test=yt - 1), "negative.npz': y_test holds label -1: expected labels "
                                                           "0..2"),
        ("label-out-of-range", npz("names", class_names=np.array(["a", "b"])), "names.npz': y_train holds label 2: "
                                                                               "expected labels 0..1 (K = 2"),
        ("class-names-not-strings", npz("codes", class_names=np.arange(3)), "codes.npz': class_names has dtype "
                                                                            "int64 and shape (3,): expected [K] "
                                                                            "strings"),
        ("nan", npz("nan", x_train=nan), "nan.npz': x_train holds 1 NaN or infinite values (the first in sample 4)"),
        ("inf", npz("inf", x_test=inf), "inf.npz': x_test holds 1 NaN or infinite values (the first in sample 7)"),
    ]


def test_every_bad_file_is_refused_in_one_line(tmp_path, capsys):
    """`fedsl run` on a TOML naming each bad file stops before any work with one line naming the file and what
    is wrong; the object array is never unpickled (its objects would create a file)."""
    cases = _bad_files(tmp_path)
    assert len({case[0] for case in cases}) == len(cases)
    for name, path, expected in cases:
        toml = write_run(tmp_path, path)
        capsys.readouterr()
        assert main(["run", str(toml), "--out", str(tmp_path / f"out-{name}"), "-q"]) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: data.data_dir = '") and "\n" not in err, (name, err)
        assert expected in err, (name, err)
        assert "Traceback" not in err and not (tmp_path / f"out-{name}").exists(), name
    assert not (tmp_path / "unpickled").exists()


def test_a_model_for_images_is_refused_on_features(tmp_path, capsys):
    toml = write_run(tmp_path, write_npz(tmp_path / "blobs.npz"), model="small_cnn")
    assert main(["run", str(toml), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model.name = 'small_cnn' reads images (C, H, W), but the dataset gives inputs of "
                          "shape (6,): expected mlp, linear or logreg") and "\n" not in err


# ----------------------------------------------------------------------------- float features from Python

def test_float_features_from_python_become_the_tensors_a_federation_takes(one_thread):
    """to_tensor takes float features [n, F, ...] as they are (uint8 pixels are divided by 255 and put channels
    first): the same shape, standardised per feature with feature_stats, the caller's array untouched; a
    Federation of them trains."""
    from torch import nn

    from fedsl import Federation, FunctionalModel, LocalTraining, Simulator, make_algorithm, make_executor
    from fedsl.data.partition import by_classes

    ds = from_arrays(*blobs(240, 1), *blobs(60, 2))
    before = ds.train.x.copy()
    stats = feature_stats(ds.train.x)
    x = to_tensor(ds.train.x, stats)
    assert x.shape == (240, D) and x.dtype == torch.float32
    np.testing.assert_allclose(x.mean(0).numpy(), 0, atol=1e-4)
    np.testing.assert_allclose(x.std(0, unbiased=False).numpy(), 1, atol=1e-4)
    np.testing.assert_array_equal(ds.train.x, before)
    np.testing.assert_array_equal(to_tensor(ds.train.x).numpy(), ds.train.x)  # without stats: as given
    images = np.random.default_rng(0).normal(size=(5, 2, 4, 4)).astype(np.float64)  # [n, C, H, W]: per channel
    mean, std = feature_stats(images)
    assert len(mean) == 2
    np.testing.assert_allclose(mean[1], images[:, 1].mean())
    np.testing.assert_allclose(std[0], images[:, 0].std())

    clients = by_classes(ds.train.y, num_clients=6, classes_per_client=2, samples_per_client=30, seed=0)
    fed = Federation(x, torch.from_numpy(ds.train.y), clients, np.zeros(0, dtype=np.int64),
                     to_tensor(ds.test.x, stats), torch.from_numpy(ds.test.y), K, ds.class_names)
    fm = FunctionalModel(nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, K)), seed=0)
    sim = Simulator(fm, fed, make_algorithm("fedavg", LocalTraining(lr=0.1, batch_size=10), 3 ** 0.5, None),
                    make_executor("sequential", fm, torch.device("cpu")), clients_per_round=3, seed=0)
    state = sim.initial_state()
    for t in range(5):
        state, _ = sim.round(state, t)
    assert sim.evaluate(state.x)[0] > 0.8


def test_to_tensor_refuses_what_is_neither_pixels_nor_features():
    with pytest.raises(DataError, match=r"^inputs of dtype int64 and shape \(4, 3\): expected uint8 images "
                                        r"\[n, H, W\(, C\)\] or float features"):
        to_tensor(np.zeros((4, 3), dtype=np.int64))


# ----------------------------------------------------------------------------- a model beside its config

MODULE = """
import math

from torch import nn


def make(num_classes, input_shape):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 8), nn.ReLU(), nn.Linear(8, num_classes))
"""


def test_a_model_module_beside_the_config_is_found_from_another_folder(tmp_path):
    """`fedsl run study/run.toml` with model.name = 'blobnet_beside:make' imports study/blobnet_beside.py with no
    PYTHONPATH, run from another folder; the config's folder comes first, before a module of the same name in the
    working directory, and the run's config.json keeps it for `fedsl resume`."""
    study, elsewhere = tmp_path / "study", tmp_path / "elsewhere"
    study.mkdir()
    elsewhere.mkdir()
    (study / "blobnet_beside.py").write_text(MODULE, encoding="utf-8")
    (elsewhere / "blobnet_beside.py").write_text("raise ImportError('the working directory's module')\n")
    toml = write_run(study, write_npz(tmp_path / "blobs.npz"), model="blobnet_beside:make")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FEDSL_ALLOW_IMPORT"] = "1"
    done = subprocess.run([sys.executable, "-m", "fedsl.cli", "run", str(toml), "--out", "out", "-q"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(accuracies(elsewhere / "out" / "blobs")[-1]) > 0.5
    saved = json.loads((elsewhere / "out" / "blobs" / "config.json").read_text())
    assert saved["model"] == {**saved["model"], "name": "blobnet_beside:make", "import_dir": str(study.resolve())}


def test_which_configs_name_a_model_folder(tmp_path, monkeypatch):
    """model.import_dir: a config file's own folder when a run imports its model (the top level, a variant or a
    swept value), a relative one from the file's folder; none for a built-in model, a preset or a dict."""
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "run.toml"
    base = RUN.format(data="blobs.npz", model="mlp")
    path.write_text(base)
    assert loading.load(path).model.import_dir is None
    assert loading.load(path, ["model.name='pkg.mod:make'"]).model.import_dir == str(path.parent.resolve())
    path.write_text(base + '\n[variants.Own.model]\nname = "pkg.mod:make"\n[variants.Builtin]\n')
    assert loading.load(path).model.import_dir == str(path.parent.resolve())
    path.write_text(base.replace('name = "mlp"', 'name = "pkg.mod:make"\nimport_dir = "../models"'))
    assert loading.load(path).model.import_dir == str((tmp_path / "models").resolve())
    assert loading.load(base={"rounds": 2, "data": {"dataset": "toy"}, "algorithm": {"name": "fedavg"},
                              "model": {"name": "pkg.mod:make"}}).model.import_dir is None


def test_a_model_folder_that_is_not_one_is_refused(tmp_path, monkeypatch):
    from fedsl.models import build_model
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    with pytest.raises(ValueError, match=r"^model.import_dir = '.*absent' is not a folder: expected the folder of "
                                         r"'blobnet_absent:make''s module"):
        build_model("blobnet_absent:make", K, (D,), seed=0, import_dir=str(tmp_path / "absent"))
