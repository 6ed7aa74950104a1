"""Natural partitions (``data.partition = 'natural'``): one client per id of the files. LEAF's JSON layout (read with
json and numpy alone: always tested) and local files read with Hugging Face datasets and flwr-datasets' partitioners
(the optional ``natural`` extra: tested where it is installed). Every file is written by the test."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsl.cli import main
from fedsl.config.schema import ConfigError, validate
from fedsl.core.errors import DataError
from fedsl.data.datasets import build_federation, load_arrays
from fedsl.data.partition import PartitionError
from fedsl.sources import leaf

pytestmark = pytest.mark.usefixtures("one_thread")

SIDE = 8  # tiny square grey images (FEMNIST's are 28×28)


def _user_samples(gen, n: int, classes: int) -> dict:
    y = gen.integers(0, classes, n)
    x = np.clip(gen.integers(0, 256, (n, SIDE * SIDE)) / 255.0, 0, 1)
    x[:, : classes] = 0.0
    x[np.arange(n), y] = 1.0  # the label written into the image: learnable
    return {"x": x.tolist(), "y": y.tolist()}


def write_leaf(root: Path, train_sizes: dict[str, int], test_sizes: dict[str, int], classes: int = 4,
               files: int = 2, seed: int = 0) -> Path:
    """A LEAF folder: users split over ``files`` JSON files per split, LEAF's keys (users, num_samples,
    user_data)."""
    gen = np.random.default_rng(seed)
    for split, sizes in (("train", train_sizes), ("test", test_sizes)):
        (root / split).mkdir(parents=True, exist_ok=True)
        users = list(sizes)
        for f in range(files):
            part = users[f::files]
            doc = {"users": part, "num_samples": [sizes[u] for u in part],
                   "user_data": {u: _user_samples(gen, sizes[u], classes) for u in part}}
            (root / split / f"all_data_{f}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return root


TRAIN = {"f0003_12": 7, "f0001_40": 5, "f0010_02": 9, "f0002_33": 3, "f0007_19": 6}
TEST = {"f0003_12": 2, "f0001_40": 1, "f0010_02": 3, "f0002_33": 1, "f0007_19": 2, "f0099_00": 4}


def _cfg(root: Path, data=None, algorithm="fsl", **top):
    d = {"dataset": "leaf", "data_dir": str(root), "partition": "natural", "num_clients": 5, "server_size": 8,
         **(data or {})}
    return validate({"rounds": 2, "data": d, "model": {"name": "mlp"},
                     "algorithm": {"name": algorithm, "clients_per_round": 2, "batch_size": 4}, **top})


@pytest.fixture
def leaf_dir(tmp_path):
    return write_leaf(tmp_path / "femnist", TRAIN, TEST)


def test_leaf_files_as_arrays_each_sample_with_its_user(leaf_dir):
    ds = load_arrays(_cfg(leaf_dir).data)
    names = sorted(TRAIN)  # client i: the i-th user name in sorted order
    assert ds.train.owner_names == names
    assert ds.train.x.shape == (sum(TRAIN.values()), SIDE, SIDE) and ds.train.x.dtype == np.uint8
    assert np.bincount(ds.train.owners).tolist() == [TRAIN[u] for u in names]
    # the test split pooled over every user; a user with no training sample tagged -1
    assert len(ds.test.y) == sum(TEST.values())
    assert np.bincount(ds.test.owners + 1).tolist() == [TEST["f0099_00"]] + [TEST[u] for u in names]
    # pixels: LEAF's floats × 255, exactly, inverted (bright strokes on black, as EMNIST's); labels as written
    doc = json.loads(next((leaf_dir / "train").glob("*_0_*.json")).read_text())
    user = doc["users"][0]
    first = np.flatnonzero(ds.train.owners == names.index(user))[0]
    assert ds.train.x[first].reshape(-1).tolist() == [255 - round(v * 255) for v in doc["user_data"][user]["x"][0]]
    assert ds.train.y[first] == doc["user_data"][user]["y"][0]
    assert ds.class_names == ["0", "1", "2", "3"]


def test_natural_partition_gives_each_client_exactly_its_users_samples(leaf_dir):
    cfg = _cfg(leaf_dir)
    fed = build_federation(cfg.data, cfg.seed)
    ds = load_arrays(cfg.data)
    names = sorted(TRAIN)
    assert fed.num_clients == 5
    assert fed.clients.own_sizes.tolist() == [TRAIN[u] for u in names]  # the files' per-user counts
    for i in range(5):
        assert np.all(ds.train.owners[fed.clients[i]] == i)
    assert np.array_equal(np.sort(fed.clients.indices), np.arange(sum(TRAIN.values())))  # every sample once
    # the global test set: the 5 users' test samples pooled (the user without training samples left out)
    assert len(fed.y_test) == sum(TEST.values()) - TEST["f0099_00"]
    assert fed.n0 == 8  # iid D0 from their pool
    again = build_federation(cfg.data, cfg.seed + 1)  # the partition does not depend on the seed; D0 does
    assert np.array_equal(again.clients.indices, fed.clients.indices)


def test_fewer_clients_keep_the_first_ids_and_more_are_refused(leaf_dir):
    fed = build_federation(_cfg(leaf_dir, {"num_clients": 2, "server_size": 2}).data, 0)
    names = sorted(TRAIN)
    assert fed.clients.own_sizes.tolist() == [TRAIN[names[0]], TRAIN[names[1]]]
    assert len(fed.y_test) == TEST[names[0]] + TEST[names[1]]
    assert np.all(fed.server < TRAIN[names[0]] + TRAIN[names[1]])  # D0 only from the federation's samples
    with pytest.raises(PartitionError, match=r"^data.num_clients = 6: the files hold 5 ids") as e:
        build_federation(_cfg(leaf_dir, {"num_clients": 6}).data, 0)
    assert "\n" not in str(e.value)


def test_server_sources_with_a_natural_partition(leaf_dir):
    disjoint = build_federation(_cfg(leaf_dir, {"server_overlap": False, "server_size": 4}).data, 0)
    assert disjoint.n == sum(TRAIN.values()) - 4
    assert not np.isin(disjoint.server, disjoint.clients.indices).any()
    c = build_federation(_cfg(leaf_dir, {"server_source": "clients", "server_clients": 2,
                                         "server_samples_per_client": 3, "server_size": 0}).data, 0)
    owners = load_arrays(_cfg(leaf_dir).data).train.owners
    assert c.n0 == 6 and len(np.unique(owners[c.server])) == 2  # s = 3 samples of c = 2 writers



def test_a_client_emptied_by_a_disjoint_d0_is_refused(tmp_path):
    root = write_labels(tmp_path / "leaf", {"a": [0, 1], "b": [0, 1]})  # D0 of 4 takes every sample
    cfg = _cfg(root, {"num_clients": 2, "server_overlap": False, "server_size": 4})
    with pytest.raises(PartitionError, match="^data.partition = 'natural': client 0 .id 'a'. has no training sample"):
        build_federation(cfg.data, 0)


def test_femnist_classes_are_its_characters_and_fslsyn_can_be_its_server_data(tmp_path):
    """28×28 images with LEAF's labels 0..61: FEMNIST's classes named by their characters (digits, A-Z, a-z), so
    the paper's font-rendered D0 (FSLsyn) draws the same classes, on the same (bright-on-black) polarity."""
    root = tmp_path / "femnist"
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        users = {"w1": [0, 10, 36], "w2": [61, 35]}
        white = [1.0] * 784  # LEAF's blank page
        doc = {"users": list(users), "num_samples": [len(v) for v in users.values()],
               "user_data": {u: {"x": [white] * len(v), "y": v} for u, v in users.items()}}
        (root / split / "data.json").write_text(json.dumps(doc))
    cfg = _cfg(root, {"num_clients": 2, "server_source": "dataset", "server_dataset": "fslsyn", "server_size": 0})
    ds = load_arrays(cfg.data)
    assert len(ds.class_names) == 62 and ds.class_names[:11] == list("0123456789A")
    assert ds.class_names[35:37] == ["Z", "a"] and ds.class_names[61] == "z"
    assert ds.train.x.max() == 0  # a white page is black once inverted
    fed = build_federation(cfg.data, 0)
    assert fed.n0 == 62 * 15 and fed.x.shape[1:] == (1, 28, 28)  # FSLsyn's 15 images of each character


def write_labels(root: Path, users: dict[str, list[int]]) -> Path:
    """A LEAF folder of one file per split, user u's samples labelled ``users[u]`` (images 2×2, all 0.5)."""
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        doc = {"users": list(users), "num_samples": [len(v) for v in users.values()],
               "user_data": {u: {"x": [[0.5] * 4] * len(v), "y": v} for u, v in users.items()}}
        (root / split / "data.json").write_text(json.dumps(doc))
    return root


def test_a_class_subset_drops_users_left_without_samples(tmp_path):
    root = write_labels(tmp_path / "leaf", {"a": [0, 0, 1], "b": [1, 1], "c": [0, 1]})
    sub = load_arrays(_cfg(root, {"num_clients": 2, "classes": ["0"]}).data)
    assert sub.train.owner_names == ["a", "c"] and sub.train.owners.tolist() == [0, 0, 1]
    assert sub.test.owners.tolist() == [0, 0, 1]
    fed = build_federation(_cfg(root, {"num_clients": 2, "classes": ["0"], "server_size": 0}, "fedavg").data, 0)
    assert fed.clients.own_sizes.tolist() == [2, 1]


@pytest.mark.parametrize("data, message", [
    ({"dataset": "toy", "data_dir": None}, "^data.partition = 'natural' needs an id per sample: expected data.da"),
    ({"samples_per_client": 3}, "^data.samples_per_client = 3: with data.partition = 'natural'"),
])
def test_config_refusals_in_one_line(leaf_dir, data, message):
    with pytest.raises(ConfigError, match=message) as e:
        _cfg(leaf_dir, data)
    assert "\n" not in str(e.value)


def _break(root: Path, change) -> None:
    path = sorted((root / "train").glob("*.json"))[0]
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("change, message", [
    (lambda doc: doc["user_data"][doc["users"][0]].update(x=["abcd"] * len(doc["user_data"][doc["users"][0]]["y"])),
     "samples mix text and other values"),
    (lambda doc: doc["num_samples"].__setitem__(0, 99), "num_samples says 99"),
    (lambda doc: doc["user_data"][doc["users"][0]]["x"][0].append(0.5), "not a list of equal-length lists"),
    (lambda doc: doc["user_data"][doc["users"][0]]["x"][0].__setitem__(0, 3.0), "pixel values outside"),
    (lambda doc: doc.pop("user_data"), "no 'users' list and 'user_data' object"),
])
def test_bad_leaf_files_are_one_line_errors(leaf_dir, change, message):
    _break(leaf_dir, change)
    with pytest.raises(DataError, match=message) as e:
        load_arrays(_cfg(leaf_dir).data)
    assert "\n" not in str(e.value)


def test_a_missing_split_is_one_line(tmp_path):
    root = write_leaf(tmp_path / "leaf", {"a": 3}, {"a": 1})
    for f in (root / "test").glob("*.json"):
        f.unlink()
    with pytest.raises(DataError, match=r"^data.dataset = 'leaf': no test/\*.json under"):
        leaf.load(None, root)


@pytest.mark.parametrize("alg", ["fsl", "fedavg"])
def test_fedsl_run_on_a_leaf_folder(leaf_dir, tmp_path, alg):
    """Two rounds through the command line, as a user runs FEMNIST from LEAF's files."""
    toml = tmp_path / f"{alg}.toml"
    toml.write_text(f"""name = "leaf-{alg}"
rounds = 2
threads = 1
[data]
dataset = "leaf"
data_dir = "{leaf_dir}"
partition = "natural"
num_clients = 5
server_size = 8
[model]
name = "small_cnn"
[algorithm]
name = "{alg}"
clients_per_round = 2
batch_size = 3
""")
    out = tmp_path / "out"
    assert main(["run", str(toml), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / f"leaf-{alg}" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_done"] == 2
    assert math.isfinite(summary["final_accuracy"])
    assert torch.load(out / f"leaf-{alg}" / "checkpoint.pt", weights_only=True)["round"] == 2


# ----------------------------------------------------------------------------- local files through Hugging Face


@pytest.fixture
def hf():
    """The ``natural`` extra: Hugging Face datasets and flwr-datasets (tests skip without them)."""
    pytest.importorskip("flwr_datasets")
    return pytest.importorskip("datasets")


WRITERS = {"w3": 6, "w1": 4, "w10": 5, "w2": 3}  # sorted as strings: w1, w10, w2, w3


def _frame(sizes: dict[str, int], seed: int, floats: bool):
    gen = np.random.default_rng(seed)
    rows = []
    for w, n in sizes.items():
        for _ in range(n):
            label = int(gen.integers(0, 3))
            pixels = gen.integers(0, 256, SIDE * SIDE)
            pixels[:3] = 0
            pixels[label] = 255
            rows.append({"writer": w, "label": label,
                         "pixels": (pixels / 255.0).tolist() if floats else pixels.tolist()})
    gen.shuffle(rows)  # ids interleaved, as in real files
    return rows


def _hf_cfg(root: Path, data=None, algorithm="fsl"):
    return _cfg(root, {"dataset": "hf_files", "id_column": "writer", "num_clients": 4, "server_size": 3,
                       **(data or {})}, algorithm)


def test_parquet_files_natural_partition_by_an_id_column(hf, tmp_path):
    import pandas as pd

    root = tmp_path / "parquet"
    root.mkdir()
    train = _frame(WRITERS, 0, floats=True)
    pd.DataFrame(train).to_parquet(root / "train.parquet")
    pd.DataFrame(_frame({"w2": 2, "w3": 1, "w9": 2}, 1, floats=True)).to_parquet(root / "test.parquet")
    cfg = _hf_cfg(root)
    ds = load_arrays(cfg.data)
    names = sorted(WRITERS)  # flwr-datasets' NaturalIdPartitioner: ids sorted, partition i = client i
    assert ds.train.owner_names == names
    assert ds.train.x.shape == (18, SIDE, SIDE) and ds.train.x.dtype == np.uint8
    for p, row in enumerate(train):  # every row in file order, its writer's client, its pixels × 255
        assert ds.train.owner_names[ds.train.owners[p]] == row["writer"]
        assert ds.train.x[p].reshape(-1).tolist() == [round(v * 255) for v in row["pixels"]]
    fed = build_federation(cfg.data, 0)
    assert fed.clients.own_sizes.tolist() == [WRITERS[w] for w in names]
    assert all(ds.train.owners[fed.clients[i]].tolist() == [i] * WRITERS[w] for i, w in enumerate(names))
    assert len(fed.y_test) == 3  # the test split's samples of the federation's writers ('w9' has no training data)


def test_csv_without_a_test_split_holds_out_a_fraction_of_each_id(hf, tmp_path):
    import pandas as pd

    root = tmp_path / "csv"
    root.mkdir()
    frame = _frame({"a": 10, "b": 21, "c": 1}, 2, floats=False)
    rows = [{"writer": r["writer"], "label": r["label"], **{f"p{j}": v for j, v in enumerate(r["pixels"])}}
            for r in frame]
    pd.DataFrame(rows).to_csv(root / "train.csv", index=False)
    cfg = _hf_cfg(root, {"num_clients": 3, "test_fraction": 0.25, "server_size": 0}, "fedavg")
    ds = load_arrays(cfg.data)
    assert np.bincount(ds.test.owners, minlength=3).tolist() == [2, 5, 0]  # ⌊0.25 n_u⌋
    assert np.bincount(ds.train.owners).tolist() == [8, 16, 1]  # every id keeps training samples
    pixels = np.concatenate([ds.train.x, ds.test.x]).reshape(32, -1).tolist()
    assert sorted(pixels) == sorted(r["pixels"] for r in frame)  # integer pixels kept as they are, each row once
    fed = build_federation(cfg.data, 0)
    assert fed.clients.own_sizes.tolist() == [8, 16, 1] and len(fed.y_test) == 7


def test_an_image_folder_with_metadata(hf, tmp_path):
    import pandas as pd
    from PIL import Image

    root = tmp_path / "images"
    meta = []
    for i, (w, c) in enumerate([("w2", "cat"), ("w1", "dog"), ("w1", "cat"), ("w2", "dog"), ("w3", "cat")]):
        (root / "train" / c).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((SIDE, SIDE), 10 * i, dtype=np.uint8)).save(root / "train" / c / f"{i}.png")
        meta.append({"file_name": f"{c}/{i}.png", "writer": w, "label": c})
    pd.DataFrame(meta).to_csv(root / "train" / "metadata.csv", index=False)
    ds = load_arrays(_hf_cfg(root, {"num_clients": 3, "test_fraction": 0.5}).data)
    assert ds.class_names == ["cat", "dog"] and ds.train.owner_names == ["w1", "w2", "w3"]
    # ⌊0.5 n_u⌋ held out: w1 and w2 one each, w3 (one image) none
    assert sorted(ds.test.owners.tolist()) == [0, 1] and np.bincount(ds.train.owners).tolist() == [1, 1, 1]
    assert {int(v) for v in ds.train.x[:, 0, 0]} | {int(v) for v in ds.test.x[:, 0, 0]} == {0, 10, 20, 30, 40}


def test_hf_files_refusals_are_one_line(tmp_path, monkeypatch):
    from fedsl.sources import hf_files

    monkeypatch.setattr(hf_files, "missing", lambda: "datasets, flwr-datasets")
    with pytest.raises(ConfigError, match=r"^data.dataset = 'hf_files' reads local files .* pip install "
                                          r"'fedsl\[natural\]'$") as e:
        _hf_cfg(tmp_path)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(hf_files, "missing", lambda: None)
    with pytest.raises(ConfigError, match="^data.partition = 'natural' with data.dataset = 'hf_files': expected "
                                          "data.id_column"):
        _hf_cfg(tmp_path, {"id_column": None})


def test_a_run_on_parquet_files(hf, tmp_path):
    import pandas as pd

    from fedsl.runs.runner import run

    root = tmp_path / "parquet"
    root.mkdir()
    pd.DataFrame(_frame(WRITERS, 0, floats=True)).to_parquet(root / "train.parquet")
    with pytest.raises(DataError, match="^data.id_column = 'user': the files have no such column"):
        load_arrays(_hf_cfg(root, {"id_column": "user"}).data)
    cfg = _hf_cfg(root, {"test_fraction": 0.3})
    cfg = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"batch_size": 2})})
    summary = run(cfg, tmp_path / "run", log=lambda s: None, progress=False)
    assert summary["status"] == "completed" and math.isfinite(summary["final_accuracy"])
