"""End-to-end runs through the CLI: results folder, resume after SIGKILL / Ctrl-C, divergence."""

import csv
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import TINY, start_paused, tiny_config

from fedsl.cli import main
from fedsl.config import expand as sweep
from fedsl.config import loading, presets
from fedsl.config import schema as C
from fedsl.runs.callbacks import Callback, StopRun
from fedsl.runs.runner import run


def tiny(tmp_path: Path, rounds=12, alg="fsl", dtype="float32", executor="auto", extra="") -> Path:
    p = tmp_path / f"tiny-{alg}-{dtype}-{executor}.toml"
    p.write_text(TINY.format(rounds=rounds, alg=alg, dtype=dtype, executor=executor) + extra)
    return p


def rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def cols(rs, names=("round", "accuracy", "loss", "rolling_accuracy")):
    return [[r[c] for c in names] for r in rs]


def test_run_writes_results_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(tiny(tmp_path, rounds=5)), "--out", str(out), "--quiet"]) == 0
    run_dir = out / "tiny"
    assert json.loads((out / "group.json").read_text())["runs"] == {"tiny": {
        "dir": "tiny", "variant": "tiny", "base": "tiny", "seed": 3, "params": {}}}
    cfg = C.validate(json.loads((run_dir / "config.json").read_text()))  # the resolved config re-validates
    assert cfg.rounds == 5
    r = rows(run_dir)
    assert [int(x["round"]) for x in r] == [0, 1, 2, 3, 4, 5]  # round 0: x_0's accuracy
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_done"] == 5
    assert float(r[0]["accuracy"]) == summary["initial_accuracy"]
    # the paper's metrics are over rounds 1..T: round 0 is not in the rolling window
    assert summary["final_accuracy"] == pytest.approx(sum(float(x["accuracy"]) for x in r[1:]) / 5)
    assert summary["server_data"]["size"] == 12 and sum(summary["server_data"]["class_histogram"]) == 12
    assert summary["hyperparameters"]["η_g"]["source"].startswith("paper default")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 5
    printed = capsys.readouterr().out
    assert "tiny" in printed and "completed" in printed
    assert main(["show", str(out)]) == 0
    assert "completed" in capsys.readouterr().out


def test_run_checks_every_run_first_and_builds_each_once(tmp_path, monkeypatch):
    """`fedsl run` checks all runs before any work, and the runs take over what the checks built:
    each run's federation and model are built once (here a stacked pair), and its numbers are
    those of the same run building its own."""
    from fedsl.runs import build
    calls = []
    for name in ("build_federation", "make_model"):
        real = getattr(build, name)
        monkeypatch.setattr(build, name, lambda *a, _f=real, _n=name, **k: calls.append(_n) or _f(*a, **k))
    text = tiny(tmp_path, rounds=2, dtype="float64").read_text().replace("seed = 3\n", "seeds = [1, 2]\nstack = 2\n")
    (tmp_path / "two.toml").write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "two.toml"), "--out", str(out), "--quiet"]) == 0
    assert calls.count("build_federation") == 2 and calls.count("make_model") == 2
    calls.clear()
    for r in ("tiny-seed1", "tiny-seed2"):  # each run alone, building its own data and model
        cfg = C.validate({**json.loads((out / r / "config.json").read_text()), "stack": 1})
        run(cfg, tmp_path / r, log=lambda s: None, progress=False)
        for a, b in zip(rows(tmp_path / r), rows(out / r), strict=True):
            assert float(a["accuracy"]) == pytest.approx(float(b["accuracy"]), abs=1e-9), r
            assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-9), r
    assert calls.count("make_model") == 2


def test_same_seed_same_metrics_whichever_executor(tmp_path):
    res = {}
    for ex in ("sequential", "vectorised"):
        cfg = loading.load(tiny(tmp_path, rounds=4, dtype="float64", executor=ex))
        run(cfg, tmp_path / ex, log=lambda s: None, progress=False)
        res[ex] = rows(tmp_path / ex)
    a, b = res["sequential"], res["vectorised"]
    assert [r["accuracy"] for r in a] == [r["accuracy"] for r in b]
    assert all(abs(float(x["loss"]) - float(y["loss"])) < 1e-10 for x, y in zip(a, b))
    # and the same seed twice gives the same numbers, a different seed other numbers
    cfg = loading.load(tiny(tmp_path, rounds=4, dtype="float64", executor="sequential"))
    run(cfg, tmp_path / "again", log=lambda s: None, progress=False)
    assert cols(rows(tmp_path / "again")) == cols(a)
    cfg = loading.load(tiny(tmp_path, rounds=4, dtype="float64", executor="sequential"), ["seed=4"])
    run(cfg, tmp_path / "other", log=lambda s: None, progress=False)
    assert cols(rows(tmp_path / "other")) != cols(a)


def test_sparse_evaluation_has_the_every_round_final_accuracy(tmp_path):
    """eval_every = 5 with eval_final_window: rounds 5, 10 and each of the final window's, the same models as an
    every-round run (evaluating draws no randomness), and the same final accuracy bit for bit."""
    res = {}
    for every in (1, 5):
        cfg = loading.load(tiny(tmp_path, rounds=16), [f"eval_every={every}", "rolling_window=5"])
        res[every] = run(cfg, tmp_path / f"e{every}", log=lambda s: None, progress=False), rows(tmp_path / f"e{every}")
    (s1, r1), (s5, r5) = res[1], res[5]
    assert [int(r["round"]) for r in r5] == [0, 5, 10, 12, 13, 14, 15, 16]
    by_round = {r["round"]: r["accuracy"] for r in r1}
    assert all(by_round[r["round"]] == r["accuracy"] for r in r5)
    assert s5["final_accuracy"] == s1["final_accuracy"] and r5[-1]["rolling_accuracy"] == r1[-1]["rolling_accuracy"]
    assert (s1["time_resolution"], s5["time_resolution"]) == (1, 5)
    cfg = loading.load(tiny(tmp_path, rounds=16), ["eval_every=5", "rolling_window=5", "eval_final_window=false"])
    run(cfg, tmp_path / "off", log=lambda s: None, progress=False)
    assert [int(r["round"]) for r in rows(tmp_path / "off")] == [0, 5, 10, 15, 16]


def test_interrupted_run_resumes_identically(tmp_path):
    cfg = loading.load(tiny(tmp_path, rounds=10))
    run(cfg, tmp_path / "full", log=lambda s: None, progress=False)
    part = run(cfg, tmp_path / "part", log=lambda s: None, progress=False, stop_after=4)
    assert part["status"] == "interrupted" and part["rounds_done"] == 4
    assert len(rows(tmp_path / "part")) == 5  # finished rounds are kept (and round 0)
    done = run(cfg, tmp_path / "part", resume=True, log=lambda s: None, progress=False)
    assert done["status"] == "completed"
    assert cols(rows(tmp_path / "part")) == cols(rows(tmp_path / "full"))
    assert [int(r["round"]) for r in rows(tmp_path / "part")] == list(range(11))
    assert json.loads((tmp_path / "part" / "summary.json").read_text())["final_accuracy"] == done["final_accuracy"]
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["params"]
    b = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.slow
def test_resume_without_checkpoints_starts_over_with_one_round_zero(tmp_path):
    cfg = loading.load(tiny(tmp_path, rounds=4), ["checkpoint_every=0"])
    run(cfg, tmp_path / "r", log=lambda s: None, progress=False, stop_after=2)
    (tmp_path / "r" / "checkpoint.pt").unlink()  # killed before any checkpoint was written
    run(cfg, tmp_path / "r", resume=True, log=lambda s: None, progress=False)
    run(cfg, tmp_path / "full", log=lambda s: None, progress=False)
    assert [int(r["round"]) for r in rows(tmp_path / "r")] == [0, 1, 2, 3, 4]
    assert cols(rows(tmp_path / "r")) == cols(rows(tmp_path / "full"))


@pytest.mark.slow
def test_sigkilled_run_resumes_bit_identically(tmp_path, one_thread):
    """A `fedsl run` process killed mid-run (rounds 0-7 of 20 in metrics.csv, checkpoints at 3 and 6), resumed:
    the files of the uninterrupted run. The uninterrupted run and the resume run in this process, with one torch
    thread as the killed process (OMP_NUM_THREADS=1): the same float sums. The run is SCAFFOLD with server learning
    and its control variates c_i in the sparse store on disk (a memory-mapped file the killed process went on
    writing after its last checkpoint): the resumed run must take the rows of the checkpoint."""
    sparse = '\n[server]\nlearning = "incremental"\n\n[client_state]\nstore = "sparse"\non_disk = true\n'
    cfg_file = tiny(tmp_path, rounds=20, alg="scaffold", extra=sparse)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert main(["run", str(cfg_file), "--out", str(tmp_path / "full"), "--quiet"]) == 0

    killed = tmp_path / "killed"
    proc = start_paused(["run", str(cfg_file), "--out", str(killed), "--quiet"], tmp_path / "ready", "round:8", env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.poll() is None, "the run ended before round 8"
    proc.send_signal(signal.SIGKILL)  # paused after round 8: checkpoints at 3 and 6, the store written since
    proc.wait()
    n_rows = len(rows(killed / "tiny"))
    assert n_rows == 9, "killed after round 8"
    assert not (killed / "tiny" / "summary.json").exists() or \
        json.loads((killed / "tiny" / "summary.json").read_text())["status"] != "completed"

    assert main(["resume", str(killed), "--quiet"]) == 0
    assert cols(rows(killed / "tiny")) == cols(rows(tmp_path / "full" / "tiny"))
    a = torch.load(tmp_path / "full" / "tiny" / "checkpoint.pt", weights_only=True)["params"]
    b = torch.load(killed / "tiny" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert json.loads((killed / "tiny" / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_resumes(tmp_path, one_thread):
    """Ctrl-C at round 5 of 8 (after round 3's checkpoint): status interrupted, a checkpoint at round 5;
    `fedsl resume` (here, in this process: ``one_thread`` restores the thread count the resume takes from
    the run's summary) finishes the run."""
    cfg_file = tiny(tmp_path, rounds=8)
    out, ready = tmp_path / "int", tmp_path / "ready"
    # A shell starts background jobs with SIGINT ignored, children inherit that, and Python then
    # keeps it ignored: the child would run to the end (rc 0). Restore the default, as a terminal has.
    proc = start_paused(["run", str(cfg_file), "--out", str(out), "--quiet"], ready, "round:5", stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.send_signal(signal.SIGINT)  # paused after round 5: the handler is installed, the run cannot finish first
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    summary = json.loads((out / "tiny" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds_done"] == 5
    ckpt = torch.load(out / "tiny" / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == summary["rounds_done"] == len(rows(out / "tiny")) - 1  # checkpoint at the last round
    assert main(["resume", str(out), "--quiet"]) == 0
    assert json.loads((out / "tiny" / "summary.json").read_text())["status"] == "completed"
    assert len(rows(out / "tiny")) == 9


def test_ignored_sigint_is_kept_ignored_as_nohup_asks(tmp_path):
    """A run started with SIGINT ignored (``nohup``, a shell's background job) keeps it ignored: SIGINT
    does not stop it (SIGTERM does, like Ctrl-C; README)."""
    cfg_file = tiny(tmp_path, rounds=8)
    proc = start_paused(["run", str(cfg_file), "--out", str(tmp_path / "o"), "--quiet"], tmp_path / "ready", "round:5",
                        pause="time.sleep(1)", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads((tmp_path / "o" / "tiny" / "summary.json").read_text())["status"] == "completed"


def test_diverged_run_stops_and_keeps_metrics(tmp_path):
    cfg = loading.load(tiny(tmp_path, rounds=30), ["algorithm.local_lr=1e4", "algorithm.name=fedavg"])
    s = run(cfg, tmp_path / "div", log=lambda s: None, progress=False)
    assert s["status"] == "diverged"
    assert s["rounds_done"] < 30
    r = rows(tmp_path / "div")
    assert len(r) == s["rounds_done"]  # round 0 and every finite round before the NaN are kept
    assert json.loads((tmp_path / "div" / "summary.json").read_text())["status"] == "diverged"


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "missing.toml" in err[0]
    assert main(["run", "--preset", "nope"]) == 2
    assert "quickstart" in capsys.readouterr().err
    assert main(["run", str(tiny(tmp_path)), "--set", "algorithm.clients_per_round=9",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "algorithm.clients_per_round = 9" in err and "data.num_clients = 6" in err
    # batch larger than a client's data is caught once the data is known, before training
    assert main(["run", str(tiny(tmp_path)), "--set", "algorithm.batch_size=500", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "algorithm.batch_size = 500" in err and not (tmp_path / "b" / "tiny" / "metrics.csv").exists()
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("")
    assert main(["run", str(tiny(tmp_path)), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["resume", str(tmp_path)]) == 2
    assert main(["show", str(tmp_path)]) == 2


def test_presets_listed_and_valid(capsys):
    assert main(["presets"]) == 0
    assert "quickstart" in capsys.readouterr().out
    for name in presets.names():
        sweep.expand_variants(C.validate(presets.load(name)))


@pytest.mark.slow
def test_quickstart_shows_fsl_ahead_of_fedavg(tmp_path):
    """The main job, shortened: 8 rounds, FSL's rolling accuracy above FedAvg's by more than 0.1 (0.48 and 0.23
    at 8 rounds; 0.69 and 0.32 at 20)."""
    out = tmp_path / "qs"
    assert main(["run", "--preset", "quickstart", "--set", "rounds=8", "--out", str(out), "--quiet"]) == 0
    fedavg = json.loads((out / "FedAvg" / "summary.json").read_text())
    fsl = json.loads((out / "FSL" / "summary.json").read_text())
    assert fsl["final_accuracy"] > fedavg["final_accuracy"] + 0.1
    assert (out / "comparison.png").stat().st_size > 10_000
    assert "| FSL |" in (out / "comparison.md").read_text()


USER_MODELS = '''
from torch import nn

def make_net(num_classes, input_shape):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, num_classes))

def make_bn_net(num_classes, input_shape):
    return nn.Sequential(nn.Conv2d(input_shape[0], 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(num_classes))
'''


def test_user_module_and_seeds_with_mean_std(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")  # imported factories are code: opted in
    (tmp_path / "user_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = '[variants.FedAvg.algorithm]\nname = "fedavg"\n[variants.FSL.algorithm]\nname = "fsl"\n'
    cfg = tiny(tmp_path, rounds=3, extra=extra)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--set", "model.name=user_models:make_net", "--set", "seeds=[0, 1]",
                 "--out", str(out), "--quiet"]) == 0
    group = json.loads((out / "group.json").read_text())["runs"]
    assert set(group) == {"FedAvg-seed0", "FedAvg-seed1", "FSL-seed0", "FSL-seed1"}
    assert group["FSL-seed1"] == {"dir": "FSL-seed1", "variant": "FSL", "base": "FSL", "seed": 1, "params": {}}
    s0 = json.loads((out / "FSL-seed0" / "summary.json").read_text())
    s1 = json.loads((out / "FSL-seed1" / "summary.json").read_text())
    md = (out / "comparison.md").read_text()
    mean = (s0["final_accuracy"] + s1["final_accuracy"]) / 2
    std = abs(s0["final_accuracy"] - s1["final_accuracy"]) / 2 ** 0.5  # sample std of two values: |a - b| / √2
    assert f"| FSL | 2 | {mean:.4f} ± {std:.4f}" in md
    assert "mean ± sample std over seeds" in capsys.readouterr().out
    # a model the engine cannot run is refused with one line, before any work
    assert main(["run", str(cfg), "--set", "model.name=user_models:make_bn_net", "--out", str(tmp_path / "bn")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'3' is LazyLinear with parameters not yet made" in err[0]
    assert not (tmp_path / "bn").exists()
    assert main(["run", str(cfg), "--set", "model.name=user_models:nope", "--out", str(tmp_path / "x")]) == 2
    assert "cannot import" in capsys.readouterr().err


def test_sweep_grid_index_resume_and_divergence(tmp_path, capsys):
    import pandas as pd

    extra = '\n[sweep]\n"algorithm.local_lr" = [0.05, 1e9]\n"server.gamma" = [0.5, 1.0]\n'
    cfg = tiny(tmp_path, rounds=4, extra=extra)
    out = tmp_path / "sweep"
    assert main(["run", str(cfg), "--set", "seeds=[0, 1]", "--out", str(out), "--quiet"]) == 0
    index = pd.read_csv(out / "index.csv")
    assert len(index) == 8  # 2 lr x 2 gamma x 2 seeds
    assert set(index["algorithm.local_lr"]) == {0.05, 1e9} and set(index["server.gamma"]) == {0.5, 1.0}
    assert set(index["run"]) >= {"tiny-local_lr=0.05-gamma=0.5-seed0", "tiny-local_lr=1e+09-gamma=1-seed1"}
    # the diverging learning rate is recorded as such and the sweep went on
    assert set(index.loc[index["algorithm.local_lr"] == 1e9, "status"]) == {"diverged"}
    assert set(index.loc[index["algorithm.local_lr"] == 0.05, "status"]) == {"completed"}
    run_dir = out / "tiny-local_lr=0.05-gamma=0.5-seed1"
    assert json.loads((run_dir / "config.json").read_text())["server"]["gamma"] == 0.5
    # seeds aggregate per sweep point in the comparison
    assert "| tiny-local_lr=0.05-gamma=0.5 | 2 |" in (out / "comparison.md").read_text()

    # an interrupted run is resumed, finished ones are skipped
    (run_dir / "summary.json").write_text(json.dumps({**json.loads((run_dir / "summary.json").read_text()),
                                                      "status": "interrupted"}))
    before = (out / "tiny-local_lr=0.05-gamma=1-seed0" / "metrics.csv").stat().st_mtime_ns
    assert main(["resume", str(out), "--quiet"]) == 0
    assert (out / "tiny-local_lr=0.05-gamma=1-seed0" / "metrics.csv").stat().st_mtime_ns == before
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    capsys.readouterr()
    assert main(["sweep", "status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "8 runs" in text and "4 completed" in text and "4 diverged" in text


def test_bad_sweep_is_a_one_line_error(tmp_path, capsys):
    cfg = tiny(tmp_path, rounds=2, extra='\n[sweep]\n"server.gamma" = [1.0, -1.0]\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: sweep point tiny-gamma=-1: server.gamma = -1.0") and "\n" not in err
    cfg = tiny(tmp_path, rounds=2, extra='\n[sweep]\n"seed" = [1, 2]\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "use seeds" in capsys.readouterr().err


def test_run_only_some_variants(tmp_path, capsys):
    out = tmp_path / "only"
    extra = '\n[variants.A]\n[variants.B]\nalgorithm = { "local_lr" = 0.1 }\n'
    assert main(["run", str(tiny(tmp_path, rounds=2, extra=extra)),
                 "--variants", "B", "--out", str(out), "--quiet"]) == 0
    assert list(json.loads((out / "group.json").read_text())["runs"]) == ["B"]
    assert main(["run", str(tiny(tmp_path, rounds=2, extra='\n[variants.A]\n')), "--variants", "A,C",
                 "--out", str(tmp_path / "x"), "--quiet"]) == 2  # usage error
    assert "--variants 'A,C': expected names from ['A']" in capsys.readouterr().err


def test_threads_setting(tmp_path):
    from fedsl.runs.build import prepare
    before = torch.get_num_threads()
    try:
        prepare(loading.load(tiny(tmp_path, rounds=1), ["threads=1"]))
        assert torch.get_num_threads() == 1
        prepare(loading.load(tiny(tmp_path, rounds=1)))  # 0 (default): torch's setting is left alone
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(C.ConfigError, match="threads"):
        loading.load(tiny(tmp_path, rounds=1), ["threads=-1"])


def test_resume_with_automatic_threads_uses_the_count_the_run_started_with(tmp_path, monkeypatch):
    """threads = 0 follows the machine's load, and results follow the thread count: a resumed run
    takes the count recorded in its summary.json, not the one the load would give now."""
    from fedsl.core import threads
    cfg = loading.load(tiny(tmp_path, rounds=4), ["threads=0"])
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "auto_threads", lambda: 1)
        torch.set_num_threads(2)
        run(cfg, tmp_path / "r", log=lambda s: None, progress=False, stop_after=2)
        summary = json.loads((tmp_path / "r" / "summary.json").read_text())
        assert summary["threads"] == 1
        monkeypatch.setattr(threads, "auto_threads", lambda: 2)  # the machine got quieter
        torch.set_num_threads(2)
        run(cfg, tmp_path / "r", resume=True, log=lambda s: None, progress=False)
        assert torch.get_num_threads() == 1
        assert json.loads((tmp_path / "r" / "summary.json").read_text())["threads"] == 1
    finally:
        torch.set_num_threads(before)


class _StopAt(Callback):
    def __init__(self, at):
        self.at = at

    def on_evaluation(self, round, metrics):
        if round == self.at:
            raise StopRun(f"round {round}", status="pruned")


@pytest.mark.parametrize("stop_at", [None, 2])
def test_a_finished_run_leaves_nothing_for_the_garbage_collector(tmp_path, stop_at):
    """A run ended (completed, or stopped by a callback as a pruned trial is) holds no reference cycle to its session:
    its simulator, data and models are freed when run() returns, not at the next full collection, which a long
    study of many trials in one process may not reach before memory runs out."""
    import gc

    from fedsl.engine.simulator import Simulator
    cfg = C.validate(tiny_config(rounds=3, eval_every=1))
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects() if type(o) is Simulator}  # other tests' (caches) may live on
        end = run(cfg, tmp_path / "r", log=lambda s: None, progress=False,
                  callbacks=[] if stop_at is None else [_StopAt(stop_at)])
        assert end["status"] == ("completed" if stop_at is None else "pruned")
        assert not [o for o in gc.get_objects() if type(o) is Simulator and id(o) not in before]
    finally:
        gc.enable()
