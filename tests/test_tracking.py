"""Callbacks and trackers (fedsl.runs.callbacks, fedsl.runs.tracking): the order of a run's calls,
a resumed run's, a stacked run's, and TensorBoard's and MLflow's files read back after a real run."""

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, tiny_config

from fedsl.cli import main
from fedsl.config import schema as C
from fedsl.runs.callbacks import Callback
from fedsl.runs.runner import run, run_stacked

QUIET = {"log": lambda s: None, "progress": False}


def rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_run_start(self, run):
        self.calls.append(("start", run.resumed, run.first_round))

    def on_evaluation(self, round, metrics):
        self.calls.append(("evaluation", round, dict(metrics)))

    def on_round_end(self, round, metrics):
        self.calls.append(("round_end", round, dict(metrics)))

    def on_run_end(self, summary):
        self.calls.append(("end", summary["status"]))

    def names(self):
        return [c[:2] if c[0] != "start" else c for c in self.calls]


def test_callback_sees_start_rounds_evaluations_and_end_in_order(tmp_path):
    # evaluated: every 2 rounds and the last; rolling_window = 1 keeps the final window to round T
    cfg = C.validate(tiny_config(rounds=5, eval_every=2, rolling_window=1))
    rec = Recorder()
    summary = run(cfg, tmp_path / "r", callbacks=[rec], **QUIET)
    assert rec.names() == [("start", False, 0), ("evaluation", 0), ("round_end", 1), ("evaluation", 2),
                           ("round_end", 2), ("round_end", 3), ("evaluation", 4), ("round_end", 4),
                           ("evaluation", 5), ("round_end", 5), ("end", "completed")]
    assert rec.calls[-1] == ("end", summary["status"])
    csv_rows = {int(r["round"]): r for r in rows(tmp_path / "r")}
    assert sorted(csv_rows) == [0, 2, 4, 5]
    evaluations = {c[1]: c[2] for c in rec.calls if c[0] == "evaluation"}
    for t, m in evaluations.items():  # the evaluations are metrics.csv's numbers
        assert set(m) == {"accuracy", "loss", "rolling_accuracy"}
        assert repr(m["accuracy"]) == csv_rows[t]["accuracy"] and repr(m["loss"]) == csv_rows[t]["loss"]
    ends = {c[1]: c[2] for c in rec.calls if c[0] == "round_end"}
    for t, m in ends.items():  # every round: its γ_t, traffic and time; an evaluated round: its evaluation too
        assert m["gamma"] == 1.0 and m["comm_params"] > 0 and m["wall_time"] > 0
        assert ("accuracy" in m) == (t in evaluations)
        if t in csv_rows:
            assert repr(m["wall_time"]) == csv_rows[t]["wall_time"] and m["accuracy"] == evaluations[t]["accuracy"]
    assert summary["initial_accuracy"] == evaluations[0]["accuracy"]


def test_resumed_run_tells_callbacks_where_it_continues(tmp_path):
    cfg = C.validate(tiny_config(rounds=5))
    first, second = Recorder(), Recorder()
    run(cfg, tmp_path / "r", callbacks=[first], stop_after=2, **QUIET)
    assert first.names() == [("start", False, 0), ("evaluation", 0), ("evaluation", 1), ("round_end", 1),
                             ("evaluation", 2), ("round_end", 2), ("end", "interrupted")]
    run(cfg, tmp_path / "r", resume=True, callbacks=[second], **QUIET)
    # the interruption checkpointed round 2: the resumed process reports rounds 3.. only, x_0 not again
    assert second.names() == [("start", True, 3), ("evaluation", 3), ("round_end", 3), ("evaluation", 4),
                              ("round_end", 4), ("evaluation", 5), ("round_end", 5), ("end", "completed")]


def test_stacked_runs_each_call_their_own_callbacks(tmp_path):
    cfgs = [C.validate(tiny_config(rounds=2, seed=s, name=f"s{s}", dtype="float64")) for s in (1, 2)]
    recs = [Recorder(), Recorder()]
    run_stacked(cfgs, [tmp_path / "a", tmp_path / "b"], callbacks=[[recs[0]], [recs[1]]], **QUIET)
    for rec, out in zip(recs, ["a", "b"]):
        assert rec.names() == [("start", False, 0), ("evaluation", 0), ("evaluation", 1), ("round_end", 1),
                               ("evaluation", 2), ("round_end", 2), ("end", "completed")]
        accs = [repr(c[2]["accuracy"]) for c in rec.calls if c[0] == "evaluation"]
        assert accs == [r["accuracy"] for r in rows(tmp_path / out)]


def _interrupted_then_resumed(tmp_path: Path, tracking: list[str]) -> Path:
    """A run of 6 rounds with ``tracking`` as a kill -9 leaves it and `fedsl resume` finishes it: the process
    logged rounds 0..4 but its last checkpoint is round 2, so the resumed process runs rounds 3 and 4 again."""
    cfg = C.validate(tiny_config(rounds=6, checkpoint_every=2, tracking=tracking))
    out = tmp_path / "r"
    run(cfg, out, stop_after=2, **QUIET)  # checkpoint of round 2
    kept = (out / "checkpoint.pt").read_bytes()
    run(cfg, out, resume=True, stop_after=2, **QUIET)  # rounds 3, 4 logged, checkpoint of round 4
    (out / "checkpoint.pt").write_bytes(kept)  # ... as if killed before writing it
    run(cfg, out, resume=True, **QUIET)
    return out


def test_tensorboard_event_files_hold_metrics_csv(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = _interrupted_then_resumed(tmp_path, ["tensorboard"])
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 3  # one per process
    ea = EventAccumulator(str(out / "tensorboard"))
    ea.Reload()
    table = rows(out)
    assert [int(r["round"]) for r in table] == list(range(7))
    for key in ("accuracy", "loss", "rolling_accuracy"):
        logged = ea.Scalars(key)
        # rounds 3 and 4 of the interrupted process are hidden (purge_step): each round once, the rerun's numbers
        assert [e.step for e in logged] == list(range(7))
        assert [e.value for e in logged] == [np.float32(r[key]) for r in table]
    assert [e.step for e in ea.Scalars("gamma")] == list(range(1, 7))
    assert [e.value for e in ea.Scalars("wall_time")] == [np.float32(r["wall_time"]) for r in table[1:]]
    assert "hyperparameters/text_summary" in ea.Tags()["tensors"]  # the resolved η_l, η_g, γ, K0, ... once


def test_mlflow_store_holds_metrics_csv(tmp_path):
    pytest.importorskip("mlflow")
    out = _interrupted_then_resumed(tmp_path, ["mlflow"])
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("fedsl").experiment_id])
    assert found.info.status == "FINISHED" and found.info.run_name == "tiny"
    assert found.data.params["algorithm.name"] == "fsl" and found.data.params["hp.η_l"] == "0.05"
    assert found.data.tags["fedsl.status"] == "completed"
    table = rows(out)
    for key in ("accuracy", "loss", "rolling_accuracy"):
        logged = sorted(client.get_metric_history(found.info.run_id, key), key=lambda m: m.step)
        # rounds 3 and 4 were logged by the interrupted process and not again; a CPU rerun is bit for bit
        assert [m.step for m in logged] == list(range(7))
        assert [m.value for m in logged] == [float(r[key]) for r in table]
    assert sorted(m.step for m in client.get_metric_history(found.info.run_id, "gamma")) == list(range(1, 7))
    assert not (Path.cwd() / "mlruns").exists() and not (Path.cwd() / "mlflow.db").exists()


def test_stacked_runs_each_track_into_their_own_mlflow_store(tmp_path):
    """Stacked runs (one process, several stores: the later ones start as copies of the first's empty schema)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    cfgs = [C.validate(tiny_config(rounds=2, seed=s, name=f"s{s}", dtype="float64", tracking=["mlflow"]))
            for s in (1, 2)]
    run_stacked(cfgs, [tmp_path / "a", tmp_path / "b"], **QUIET)
    for cfg, out in zip(cfgs, ["a", "b"]):
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / out / 'mlflow.db'}")
        (found,) = client.search_runs([client.get_experiment_by_name("fedsl").experiment_id])
        assert found.info.run_name == cfg.name and found.data.params["seed"] == str(cfg.seed)
        logged = sorted(client.get_metric_history(found.info.run_id, "accuracy"), key=lambda m: m.step)
        assert [m.value for m in logged] == [float(r["accuracy"]) for r in rows(tmp_path / out)]


def test_cli_track_writes_tensorboard_files(tmp_path):
    pytest.importorskip("tensorboard")
    (tmp_path / "c.toml").write_text(TINY.format(rounds=2, alg="fedavg", dtype="float32", executor="auto"))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "c.toml"), "--out", str(out), "--quiet", "--track", "tensorboard"]) == 0
    assert json.loads((out / "tiny" / "config.json").read_text())["tracking"] == ["tensorboard"]
    assert list((out / "tiny" / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("name", ["tensorboard", "mlflow"])
def test_missing_tracker_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == name else real(mod, *a))
    (tmp_path / "c.toml").write_text(TINY.format(rounds=2, alg="fedavg", dtype="float32", executor="auto"))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "c.toml"), "--out", str(out), "--quiet", "--track", name]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"pip install 'fedsl[{name}]'" in err, err
    assert not out.exists()  # checked before any work


def test_unknown_tracker_is_one_line(tmp_path, capsys):
    (tmp_path / "c.toml").write_text(TINY.format(rounds=2, alg="fedavg", dtype="float32", executor="auto"))
    assert main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o"), "--quiet", "--track", "wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tracking" in err and "wandb" in err and "tensorboard" in err, err
