"""One checkpoint format (``fedsl.runs.checkpoint``): written atomically, read defensively, and the
simulator's checkpoints written before it still resume bit-identically (the Flower server's: test_flower_safety)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsl.algorithms.base import RunState
from fedsl.config import schema as C
from fedsl.runs import checkpoint
from fedsl.runs.checkpoint import FORMAT, Checkpoint, CorruptCheckpoint
from fedsl.runs.results import RunDir
from fedsl.runs.runner import run


def _state() -> RunState:
    stacked = torch.arange(12.0).reshape(3, 4)  # run 1 of a stack of 3: a view into all runs' tensor
    return RunState({"w": stacked[1], "b": torch.zeros(2, dtype=torch.float64)}, {"c": {"w": torch.ones(4)}}, 0.25,
                    {"c_i": {"w": torch.full((5, 4), 2.0)}})


def test_a_checkpoint_holds_round_state_and_records(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, Checkpoint(7, _state(), {"wall_time": 1.5, "history": [{"round": 1, "trained": [0, 2]}]}))
    blob = torch.load(path, weights_only=True)
    assert blob["format"] == FORMAT and blob["round"] == 7
    assert blob["params"]["w"].untyped_storage().nbytes() == 4 * 4  # the run's row, not the stack's storage
    got = checkpoint.load(path)
    assert got.round == 7 and got.extra == {"wall_time": 1.5, "history": [{"round": 1, "trained": [0, 2]}]}
    assert torch.equal(got.state.x["w"], torch.tensor([4.0, 5.0, 6.0, 7.0]))
    assert got.state.x["b"].dtype == torch.float64 and got.state.gamma == 0.25
    assert torch.equal(got.state.algo["c"]["w"], torch.ones(4)) and got.state.clients["c_i"]["w"].shape == (5, 4)
    assert checkpoint.read_round(path) == 7
    assert checkpoint.load(tmp_path / "none.pt") is None and checkpoint.read_round(tmp_path / "none.pt") is None
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def _one_line(err: pytest.ExceptionInfo, path: Path) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: the checkpoint cannot be read (")
    e = err.value  # not torch's error chained below it (a traceback of its own)
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)
    return msg


@pytest.mark.parametrize("damage", ["cut in half", "empty", "not a checkpoint", "no round", "no parameters",
                                    "records not JSON"])
def test_a_damaged_checkpoint_is_one_line_naming_the_file_and_what_to_do(tmp_path, damage):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, Checkpoint(3, _state(), {"wall_time": 2.0}))
    blob = torch.load(path, weights_only=True)
    if damage == "cut in half":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "not a checkpoint":
        path.write_text("model weights, surely")
    elif damage == "no round":
        torch.save({**blob, "round": "3"}, path)
    elif damage == "no parameters":
        torch.save({k: v for k, v in blob.items() if k != "params"}, path)
    else:
        torch.save({**blob, "extra": "{wall_time"}, path)
    with pytest.raises(CorruptCheckpoint) as err:
        checkpoint.load(path)
    assert _one_line(err, path).endswith(checkpoint.RESTART_RUN)
    if damage not in ("no parameters", "records not JSON"):  # read_round reads no further than the round
        with pytest.raises(CorruptCheckpoint):
            checkpoint.read_round(path)
    with pytest.raises(CorruptCheckpoint) as err:
        checkpoint.load(path, "do this")
    assert str(err.value).endswith("; do this")


def test_a_checkpoint_of_a_newer_format_says_upgrade(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, Checkpoint(3, _state()))
    torch.save({**torch.load(path, weights_only=True), "format": "fedsl-checkpoint/2"}, path)
    with pytest.raises(CorruptCheckpoint) as err:
        checkpoint.load(path)
    msg = _one_line(err, path)
    assert "'fedsl-checkpoint/2', written by a newer fedsl" in msg and "upgrade fedsl to resume it" in msg


def _cfg(**over) -> C.RunConfig:
    """SCAFFOLD (server state c, clients' tables c_i) with adaptive γ (γ_t in the checkpoint), 7 rounds."""
    d = {"name": "tiny", "rounds": 7, "seed": 3, "checkpoint_every": 3, "dtype": "float32", "executor": "sequential",
         "data": {"dataset": "synthetic_chars", "chars": "0123", "train_per_class": 30, "test_per_class": 15,
                  "num_clients": 6, "classes_per_client": 2, "server_size": 12},
         "model": {"name": "mlp"},
         "algorithm": {"name": "scaffold", "clients_per_round": 3, "local_lr": 0.05, "batch_size": 8},
         "server": {"learning": "incremental", "gamma_schedule": "adaptive", "gamma_threshold": 0.3}, **over}
    return C.validate(d)


def _old_simulator_layout(path: Path) -> None:
    """Rewrite a checkpoint as the simulator wrote it before FORMAT (``RunDir.save_checkpoint`` until then)."""
    ckpt = checkpoint.load(path)
    s = ckpt.state
    torch.save({"round": ckpt.round, "params": s.x, "algo": s.algo, "gamma": s.gamma, "clients": s.clients,
                "wall_time": ckpt.extra["wall_time"]}, path)


def test_a_simulator_checkpoint_of_the_old_layout_resumes_bit_identically(tmp_path):
    quiet = {"log": lambda s: None, "progress": False}
    cfg = _cfg()
    run(cfg, tmp_path / "full", **quiet)
    run(cfg, tmp_path / "part", stop_after=3, **quiet)
    part = RunDir(tmp_path / "part")
    before = part.load_checkpoint()
    assert before.round == 3 and before.state.gamma is not None and before.state.clients and before.state.algo
    _old_simulator_layout(part.checkpoint_file)
    assert "format" not in torch.load(part.checkpoint_file, weights_only=True)
    old = part.load_checkpoint()
    assert old.round == 3 and old.extra == before.extra and old.state.gamma == before.state.gamma
    run(cfg, tmp_path / "part", resume=True, **quiet)
    a, b = RunDir(tmp_path / "full").load_checkpoint(), part.load_checkpoint()
    assert a.round == b.round == 7 and a.state.gamma == b.state.gamma
    assert all(torch.equal(a.state.x[n], b.state.x[n]) for n in a.state.x)
    assert all(torch.equal(a.state.algo["c"][n], b.state.algo["c"][n]) for n in a.state.algo["c"])
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["final_accuracy"] == \
        json.loads((tmp_path / "part" / "summary.json").read_text())["final_accuracy"]
