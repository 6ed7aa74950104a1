"""Input scaling (data.normalize): per-channel standardisation with the training split's statistics,
the same for clients, D0 (also from another dataset) and the test set; and the summary that records it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_config

from fedsl.config import schema as config
from fedsl.core.threads import one_thread
from fedsl.data.datasets import build_federation, channel_stats, load_arrays, to_tensor
from fedsl.runs import runner


def data_config(**over):
    return config.validate(tiny_config() | {"data": {**tiny_config()["data"], **over}}).data


def test_channel_stats_are_exact():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(50, 6, 5, 3), dtype=np.uint8)
    mean, std = channel_stats(rgb)
    ref = rgb.astype(np.float64) / 255.0
    np.testing.assert_allclose(mean, ref.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(std, ref.std(axis=(0, 1, 2)), rtol=1e-12)
    gray = rng.integers(0, 256, size=(20, 4, 4), dtype=np.uint8)
    m, s = channel_stats(gray)
    assert len(m) == 1 and m[0] == pytest.approx(gray.mean() / 255, rel=1e-12)
    assert channel_stats(np.full((3, 2, 2), 7, dtype=np.uint8))[1] == [1.0]  # constant: centred only


def test_to_tensor_converts_in_pieces_on_one_thread_to_the_whole_pools_numbers():
    """The pieces (of 2^16 pixels) give the numbers of one conversion of the whole pool, and the caller's torch
    threads are as they were after it, also when the conversion fails."""
    rgb = np.random.default_rng(1).integers(0, 256, size=(3000, 8, 8, 3), dtype=np.uint8)  # 3 rows of pieces
    stats = channel_stats(rgb)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = to_tensor(rgb, stats)
        assert torch.get_num_threads() == 2
        whole = torch.from_numpy(rgb).permute(0, 3, 1, 2).float().div(255.0)
        whole = whole.sub(torch.tensor(stats[0]).view(1, 3, 1, 1)).div(torch.tensor(stats[1]).view(1, 3, 1, 1))
        assert torch.equal(got, whole)
        with pytest.raises(RuntimeError), one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_standardize_uses_the_training_split_for_pool_server_and_test():
    d = data_config()
    assert d.normalize == "standardize"  # the default
    fed = build_federation(d, seed=3)
    ds = load_arrays(d)
    mean, std = channel_stats(ds.train.x)
    assert fed.input_stats == (mean, std)
    raw = torch.from_numpy(ds.train.x).double().unsqueeze(1) / 255
    torch.testing.assert_close(fed.x.double(), (raw - mean[0]) / std[0], rtol=0, atol=1e-6)
    raw_test = torch.from_numpy(ds.test.x).double().unsqueeze(1) / 255
    torch.testing.assert_close(fed.x_test.double(), (raw_test - mean[0]) / std[0], rtol=0, atol=1e-6)
    # the training pool is now zero-mean, unit-variance per channel
    assert abs(fed.x.double().mean().item()) < 1e-5 and abs(fed.x.double().std(unbiased=False).item() - 1) < 1e-5


def test_unit_is_pixels_over_255():
    d = data_config(normalize="unit")
    fed = build_federation(d, seed=3)
    ds = load_arrays(d)
    assert fed.input_stats is None
    assert torch.equal(fed.x, torch.from_numpy(ds.train.x).float().unsqueeze(1) / 255)
    assert fed.x.min() >= 0 and fed.x.max() <= 1


def test_external_server_data_takes_the_clients_statistics():
    """D0 from another source (font-rendered characters) is standardised with the clients' mean and std,
    not its own: the server's model must see inputs on the clients' scale."""
    d = data_config(server_source="dataset", server_dataset="synthetic_chars", server_per_class=5, server_size=0)
    fed = build_federation(d, seed=3)
    unit = build_federation(data_config(server_source="dataset", server_dataset="synthetic_chars",
                                        server_per_class=5, server_size=0, normalize="unit"), seed=3)
    mean, std = fed.input_stats
    s = torch.as_tensor(fed.server)
    torch.testing.assert_close(fed.x[s], (unit.x[s] - mean[0]) / std[0], rtol=0, atol=1e-6)


def test_summary_records_inputs_init_and_test_set(tmp_path):
    cfg = config.validate(tiny_config(rounds=2))
    runner.run(cfg, tmp_path / "r", log=lambda m: None, progress=False)
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    fed = build_federation(cfg.data, cfg.seed)
    assert s["inputs"] == {"normalize": "standardize", "mean": fed.input_stats[0], "std": fed.input_stats[1]}
    assert s["model_init"] == "auto"
    assert s["test_data"] == {"size": 60, "class_histogram": [15, 15, 15, 15]}


def test_bad_normalize_is_one_line():
    with pytest.raises(config.ConfigError, match="data.normalize = 'zscore'"):
        config.validate(tiny_config() | {"data": {**tiny_config()["data"], "normalize": "zscore"}})


def test_model_init_and_carve_test_in_config():
    cfg = config.validate(tiny_config())
    assert cfg.model.init == "auto" and cfg.data.carve_test == "up_to"
    with pytest.raises(config.ConfigError, match="model.init = 'xavier'"):
        config.validate(tiny_config() | {"model": {"name": "small_cnn", "init": "xavier"}})
    with pytest.raises(config.ConfigError, match="data.carve_test = 'some'"):
        config.validate(tiny_config() | {"data": {**tiny_config()["data"], "carve_test": "some"}})
