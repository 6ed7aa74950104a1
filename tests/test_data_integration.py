"""The paper's data settings expressed in config and built on the offline copies in ../shared/data."""

import numpy as np
import torch

from fedsl.cli import main
from fedsl.config import expand as sweep
from fedsl.config import loading, presets
from fedsl.data.datasets import build_federation
from fedsl.runs.build import check


def _variant(preset: str, variant: str, data_dir, overrides=()):
    cfg = loading.load(base=presets.load(preset), overrides=[f"data.data_dir={str(data_dir)!r}", *overrides])
    return sweep.expand_variants(cfg)[variant]


def test_scenario2_cifar10_fsl_and_fslsyn_server_sets(shared_data):
    fsl = _variant("scenario2-cifar10", "FSL", shared_data)
    fed = build_federation(fsl.data, fsl.seed)
    y = fed.y.numpy()
    assert fed.num_clients == 1000 and {len(c) for c in fed.clients} == {50}
    assert all(len(np.unique(y[c])) == 2 for c in fed.clients)
    assert fed.n0 == 500
    owners = [i for i, c in enumerate(fed.clients) if np.intersect1d(c, fed.server).size]
    assert len(owners) == 10  # D0 = 10 clients x 50 samples: all of their data here

    syn = _variant("scenario2-cifar10", "FSLsyn", shared_data)
    fed = build_federation(syn.data, syn.seed)
    hist = fed.server_histogram()
    assert fed.n0 == 504 and hist[6] == 0 and all(h == 56 for i, h in enumerate(hist) if i != 6)  # no frog
    assert fed.x.shape[1:] == (3, 32, 32)
    assert fed.server.min() >= 50_000  # STL-10 images are appended to the pool, no client holds them
    assert max(c.max() for c in fed.clients) < 50_000


def test_scenario1_cifar10_iid_server_data(shared_data):
    cfg = _variant("scenario1-cifar10", "FSL", shared_data)
    check(cfg)
    fed = build_federation(cfg.data, cfg.seed)
    assert fed.num_clients == 10 and {len(c) for c in fed.clients} == {5000}
    assert fed.server_histogram() == [50] * 10
    assert len(fed.x_test) == 10_000


def test_emnist_paper45_carved_offline_with_fslsyn(shared_data):
    over = ["data.emnist_split='bymerge'", "data.carve=true", "data.train_per_class=300", "data.test_per_class=60",
            "data.num_clients=45", "data.samples_per_client=300", "data.server_clients=9",
            "data.server_samples_per_client=50"]
    fsl = _variant("scenario2-emnist", "FSL", shared_data, over)
    fed = build_federation(fsl.data, fsl.seed)
    assert fed.num_classes == 45 and "f" not in fed.class_names and "q" not in fed.class_names
    assert len(fed.y) == 45 * 300 and len(fed.y_test) == 45 * 60
    assert fed.n0 == 450

    syn = _variant("scenario2-emnist", "FSLsyn", shared_data, over)
    fed = build_federation(syn.data, syn.seed)
    assert fed.n0 == 675 and fed.server_histogram() == [15] * 45  # the paper's FSLsyn: 15 per class
    assert fed.x.shape[1:] == (1, 28, 28)


def test_missing_dataset_is_one_line_with_the_fix(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 1\n[data]\ndataset = "mnist"\n[algorithm]\nname = "fedavg"\n')
    assert main(["run", str(cfg), "--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "train-images-idx3-ubyte" in err[0]


def test_unsatisfiable_partition_and_unknown_classes(shared_data, tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 1\n[data]\ndataset = "cifar10"\nclasses_per_client = 11\n[algorithm]\nname = "fedavg"\n')
    assert main(["run", str(cfg), "--data-dir", str(shared_data), "--out", str(tmp_path / "o")]) == 2
    assert "data.classes_per_client = 11" in capsys.readouterr().err
    assert main(["run", str(cfg), "--data-dir", str(shared_data), "--set", "data.classes_per_client=2",
                 "--set", "data.classes=['cat', 'lion']", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "lion" in err and "airplane" in err


def test_test_size_evaluates_one_balanced_subset_for_every_seed(tmp_path, capsys):
    base = {"rounds": 1, "data": {"dataset": "synthetic_chars", "train_per_class": 20, "test_per_class": 30,
                                   "partition": "iid", "num_clients": 4},
            "algorithm": {"name": "fedavg", "clients_per_round": 2}}
    full = loading.load(base=base)
    fed = build_federation(full.data, 0)
    sub = [build_federation(loading.load(base=base, overrides=["data.test_size=50"]).data, seed) for seed in (0, 1)]
    assert len(sub[0].y_test) == 50 and np.bincount(sub[0].y_test.numpy()).tolist() == [5] * 10
    assert torch.equal(sub[0].x_test, sub[1].x_test)  # the same images whatever the run's seed
    # rows of the whole test split, and the training side untouched
    rows = [int(np.flatnonzero((fed.x_test == x).flatten(1).all(1))[0]) for x in sub[0].x_test]
    assert len(set(rows)) == 50 and torch.equal(fed.y_test[rows], sub[0].y_test)
    assert torch.equal(fed.x, sub[0].x) and fed.server.tolist() == sub[0].server.tolist()
    cfg = tmp_path / "c.toml"  # the dataset above (already made): its 300 test samples, one too few
    cfg.write_text('rounds = 1\n[data]\ndataset = "synthetic_chars"\ntrain_per_class = 20\ntest_per_class = 30\n'
                   'test_size = 301\npartition = "iid"\n[algorithm]\nname = "fedavg"\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: data.test_size = 301: the test split has only 300 samples"]
