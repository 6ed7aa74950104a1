"""The on-disk cache of decoded arrays shared by processes: an entry is built once."""

import threading
import time

import numpy as np

from fedsl.sources.arrays import cached_arrays


def test_an_entry_wanted_by_two_at_once_is_built_once(tmp_path, monkeypatch):
    # two threads open the lock file separately, so they contend for it as two processes do
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))
    calls, got = [], []

    def build():
        calls.append(1)
        time.sleep(0.5)  # long enough for the other caller to arrive while this one builds
        return {"x": np.arange(6, dtype=np.uint8).reshape(2, 3)}

    threads = [threading.Thread(target=lambda: got.append(cached_arrays("t", {"k": 1}, build))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(got) == 2 and all(np.array_equal(g["x"], np.arange(6).reshape(2, 3)) for g in got)
    assert cached_arrays("t", {"k": 1}, build)["x"].shape == (2, 3) and len(calls) == 1  # and it is kept


def test_an_unwritable_cache_still_builds(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FEDSL_CACHE", str(blocker / "cache"))
    assert cached_arrays("t", {"k": 2}, lambda: {"x": np.ones(2)})["x"].tolist() == [1.0, 1.0]


def test_runs_of_one_pool_share_its_channels_last_copy():
    import torch

    from fedsl.engine.simulator import channels_last_pool

    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    a, b = channels_last_pool(x), channels_last_pool(x)
    assert a.data_ptr() == b.data_ptr() != x.data_ptr()  # converted once, shared by the second run
    assert a.is_contiguous(memory_format=torch.channels_last) and torch.equal(a, x)
    other = x.clone()
    assert channels_last_pool(other).data_ptr() != a.data_ptr()  # another pool: its own copy
