"""One dataset registry (fedsl.data.registry): the config's choices, `fedsl data list` and the loader all
read it, so a dataset is one module and one entry -- shown with the toy dataset, end to end."""

from __future__ import annotations

import csv
import importlib
import typing

import numpy as np
import pytest

from fedsl.cli import main
from fedsl.config.schema import ConfigError, DataConfig, validate
from fedsl.data import registry
from fedsl.data.datasets import build_federation, external_server_set, load_arrays
from fedsl.data.registry import DATASETS, DatasetInfo
from fedsl.sources.synthetic import make_font_chars, synthetic_chars


def _targets(info: DatasetInfo):
    for fn in (info.load, info.identify, info.check_config, info.federation):
        if fn is not None:
            yield fn


def test_every_entry_names_a_function_of_the_data_layer():
    """The loaders are imported lazily, by name (which tests/test_layers.py cannot see): each must exist
    and sit in fedsl.sources (a reader) or fedsl.data (a generated federation)."""
    for info in DATASETS.values():
        assert info.name in DATASETS and DATASETS[info.name] is info
        for fn in _targets(info):
            module, _, function = fn.__qualname__.partition(":")
            assert module.startswith(("fedsl.sources.", "fedsl.data.")), (info.name, module)
            assert callable(getattr(importlib.import_module(module), function)), (info.name, fn.__qualname__)


def test_config_choices_and_cli_list_come_from_the_registry(capsys):
    choices = typing.get_args(DataConfig.model_fields["dataset"].annotation)
    assert choices == registry.names() and "toy" in choices and "stl10" not in choices  # STL-10: a D0 source only
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for info in DATASETS.values():
        assert info.name in out
    assert "50,000 / 10,000, 10 classes" in out and "112,800 / 18,800, 47 classes" in out


def test_server_sources_are_registry_entries_the_config_and_loader_read():
    """D0's other sources (``data.server_dataset``): each entry's loader is a function of the data layer, named
    lazily like the datasets'; the config's choices are the registry's; the dataset a source reads is registered."""
    for source in registry.SERVER_SOURCES.values():
        module, _, function = source.load.__qualname__.partition(":")
        assert module.startswith(("fedsl.sources.", "fedsl.data.")), (source.name, module)
        assert callable(getattr(importlib.import_module(module), function)), (source.name, function)
        assert source.dataset is None or source.dataset in DATASETS, source.name
    choices = typing.get_args(DataConfig.model_fields["server_dataset"].annotation)
    assert choices == registry.server_source_names() == ("fslsyn", "synthetic_chars", "stl10", "stl10_unlabelled",
                                                         "image_folder", "arrays")
    # FedDF's unlabelled data: D0's images, or any source (labels never read; stl10_unlabelled has none)
    assert typing.get_args(DataConfig.model_fields["unlabelled"].annotation) == ("server", *choices)
    assert [s.name for s in registry.SERVER_SOURCES.values() if not s.labelled] == ["stl10_unlabelled"]
    with pytest.raises(ConfigError, match="^data.server_dataset = 'svhn'"):
        validate({"rounds": 2, "data": {"dataset": "toy", "server_source": "dataset", "server_dataset": "svhn"},
                  "algorithm": {"name": "fsl"}})


def test_unknown_dataset_names_the_value_and_every_registered_choice():
    with pytest.raises(ConfigError) as e:
        validate({"rounds": 2, "data": {"dataset": "svhn"}, "algorithm": {"name": "fedavg"}})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data.dataset = 'svhn'")
    assert all(repr(n) in msg for n in registry.names())


TOY_RUN = """
name = "toy"
rounds = 2
seed = 1
dtype = "float64"

[data]
dataset = "toy"
num_clients = 4
classes_per_client = 2
server_size = 8

[model]
name = "small_cnn"

[algorithm]
name = "fsl"
clients_per_round = 2
batch_size = 8
"""


def test_toy_dataset_end_to_end(tmp_path):
    """The toy module + its one registry entry: the config validates, the loader gives what the entry
    declares, the entry's fixed statistics standardise the inputs, and a 2-round run completes."""
    import tomllib
    cfg = validate(tomllib.loads(TOY_RUN))
    info = DATASETS["toy"]
    ds = load_arrays(cfg.data)
    assert (len(ds.train), len(ds.test), len(ds.class_names)) == (info.train_size, info.test_size, info.num_classes)
    assert ds.train.x.shape[1:] == info.image_size and info.channels == 1
    again = DATASETS["toy"].load(cfg.data, tmp_path)
    np.testing.assert_array_equal(ds.train.x, again.train.x)  # generated, deterministic
    assert not np.array_equal(ds.train.x[:10], ds.test.x[:10])  # class 0 in both: two different draws

    fed = build_federation(cfg.data, cfg.seed)
    mean, std = info.stats
    assert fed.input_stats == (list(mean), list(std))
    np.testing.assert_allclose(fed.x_test[0, 0].numpy(), (ds.test.x[0] / 255.0 - mean[0]) / std[0], atol=1e-6)

    path = tmp_path / "toy.toml"
    path.write_text(TOY_RUN, encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "-q"]) == 0
    with open(tmp_path / "out" / "toy" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["round"] for r in rows] == ["0", "1", "2"] and all(0 <= float(r["accuracy"]) <= 1 for r in rows)


def test_font_streams_draw_the_images_they_always_drew():
    """The named streams FONT_TEST and FONT_SERVER (fedsl.core.rng) replaced the raw offsets seed + 10_007
    and seed + 20_011: the images of every seed must stay the same (results stay bit-identical)."""
    ds = synthetic_chars("01", 3, 2, seed=4)
    np.testing.assert_array_equal(ds.train.x, make_font_chars("01", per_class=3, seed=4)[0])
    np.testing.assert_array_equal(ds.test.x, make_font_chars("01", per_class=2, seed=4 + 10_007)[0])
    d = DataConfig(dataset="synthetic_chars", chars="01", train_per_class=3, test_per_class=2,
                   server_source="dataset", server_dataset="synthetic_chars", server_per_class=2)
    s = external_server_set(d, ds.train, seed=7)
    np.testing.assert_array_equal(s.x, make_font_chars("01", per_class=2, seed=7 + 20_011)[0])


def test_dataset_checks_keep_their_messages():
    """The dataset's own config rules moved into its module (the registry's check_config): same one line."""
    base = {"rounds": 2, "algorithm": {"name": "fedavg", "clients_per_round": 2}}
    with pytest.raises(ConfigError, match=r"^data.classes_per_client = 5: expected at most the 4 classes of "
                                          r"data.chars$"):
        validate({**base, "data": {"dataset": "synthetic_chars", "chars": "0123", "classes_per_client": 5}})
    # chars is synthetic_chars' alone: with toy it would change nothing, so it is refused (the size rule is not run)
    with pytest.raises(ConfigError, match=r"^data.chars = '0123': read only with data.dataset = 'synthetic_chars', "
                                          r"not 'toy': expected it unset$"):
        validate({**base, "data": {"dataset": "toy", "chars": "0123", "classes_per_client": 5}})
    with pytest.raises(ConfigError, match=r"^data.classes = 'paper45' is for dataset 'emnist', not 'toy'$"):
        validate({**base, "data": {"dataset": "toy", "classes": "paper45"}})


@pytest.mark.parametrize("dataset, data, readers", [
    ("cifar10", {"carve": True}, "'emnist'"),
    ("mnist", {"emnist_split": "digits"}, "'emnist'"),
    ("toy", {"id_column": "writer"}, "'hf_files'"),
    ("leaf", {"test_fraction": 0.2}, "'shakespeare' or 'hf_files'"),
    ("synthetic_fedprox", {"synthetic_model_seed": 1}, "'synthetic_leaf'"),
    ("toy", {"synthetic_max_samples": 100}, "'synthetic_fedprox' or 'synthetic_leaf'"),
    ("cifar10", {"train_per_class": 300}, "'synthetic_chars' or 'emnist'"),
])
def test_a_key_only_other_datasets_read_is_refused(dataset, data, readers):
    """A dataset-specific key changed with a dataset that never reads it would change nothing (a sweep of it would
    run one config several times): refused in one line naming the key, its value and the datasets that read it."""
    key, value = next(iter(data.items()))
    base = {"rounds": 2, "algorithm": {"name": "fedavg", "clients_per_round": 2}}
    with pytest.raises(ConfigError, match=rf"^data.{key} = {value!r}: read only with data.dataset = {readers}, "
                                          rf"not '{dataset}': expected it unset$"):
        validate({**base, "data": {"dataset": dataset, **data}})


def test_emnist_reads_the_carving_keys_only_when_carving():
    base = {"rounds": 2, "algorithm": {"name": "fedavg", "clients_per_round": 2}}
    with pytest.raises(ConfigError, match=r"^data.train_per_class = 315: EMNIST reads it only when carving a split "
                                          r"\(data.carve = true\): expected data.carve = true, or the key unset$"):
        validate({**base, "data": {"dataset": "emnist", "train_per_class": 315}})
    with pytest.raises(ConfigError, match=r"^data.carve_test = 'exact': EMNIST reads it only when carving"):
        validate({**base, "data": {"dataset": "emnist", "carve_test": "exact"}})
    cfg = validate({**base, "data": {"dataset": "emnist", "carve": True, "train_per_class": 315,
                                     "carve_test": "exact"}})
    assert (cfg.data.train_per_class, cfg.data.carve_test) == (315, "exact")


@pytest.mark.parametrize("dataset", registry.names())
def test_a_saved_config_of_every_dataset_loads_again(dataset):
    """A saved config writes every key, the dataset-specific ones at their defaults: those are not refused."""
    if dataset == "hf_files":
        pytest.importorskip("flwr_datasets", reason="hf_files needs the 'natural' extra")
    data = {"dataset": dataset, **({"id_column": "id"} if dataset == "hf_files" else {})}
    cfg = validate({"rounds": 2, "algorithm": {"name": "fedavg", "clients_per_round": 2}, "data": data})
    saved = cfg.model_dump(mode="json")
    assert set(registry.specific_keys()) <= set(saved["data"])
    assert validate(saved) == cfg


def test_label_and_font_generators_are_the_ones_they_replaced():
    """core/rng.py's per_label and font_images took over np.random.default_rng([seed, label]) (carve_emnist,
    per_class_subset) and default_rng(seed) (make_font_chars): every carve, D0 subset and font image stays."""
    from fedsl.core.rng import font_images, per_label
    from fedsl.sources.image_folder import per_class_subset
    for seed in (0, 3, 2**40 + 1):
        for label in (0, 7, 122):
            np.testing.assert_array_equal(per_label(seed, label).integers(0, 2**62, 20),
                                          np.random.default_rng([seed, label]).integers(0, 2**62, 20))
        np.testing.assert_array_equal(font_images(seed).uniform(size=20), np.random.default_rng(seed).uniform(size=20))
    labels = np.repeat(np.arange(3), 10)
    old = np.sort(np.concatenate([np.sort(np.random.default_rng([5, c]).choice(np.flatnonzero(labels == c), 4,
                                                                                replace=False)) for c in range(3)]))
    np.testing.assert_array_equal(per_class_subset(labels, 4, 5), old)


def test_every_named_random_stream_is_its_own():
    """Two features given the same stream number would draw the same numbers (FINETUNE and TOY were both 9
    when their branches met): every stream constant of core/rng.py is distinct."""
    from fedsl.core import rng
    streams = {k: v for k, v in vars(rng).items() if k.isupper() and isinstance(v, int) and k != "DROPOUT"}
    assert len(set(streams.values())) == len(streams), streams
