"""`fedsl show` on what summary.json does not describe: a run killed with kill -9 (interrupted, at its checkpoint's
round) or in progress (running), and a Flower ServerApp's out-dir."""

import json
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import FLOWER_RUN, TINY, start_paused

from fedsl.cli import main
from fedsl.engine import metrics
from fedsl.report.tables import fmt
from fedsl.runs.results import RunDir


def table_row(out: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first`` in rich's printed table."""
    for line in out.splitlines():
        if "│" not in line:  # a title (the folder's path, wrapped: its last part may be the run's name) or a rule
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{out}")


def expected_row(rd: RunDir, last: int, status: str) -> list[str]:
    """`fedsl show`'s row of run ``rd`` stopped after round ``last``: the paper's metrics over metrics.csv's rows
    1..last (window 20), the rounds and the wall time of the last row."""
    rows = [r for r in rd.read_metrics() if 0 < r["round"] <= last]
    s = metrics.summarize([r["round"] for r in rows], [r["accuracy"] for r in rows], 20)
    return [rd.path.name, status, fmt(s["final_accuracy"], "final_accuracy"), fmt(s["rise_time"], "rise_time"),
            fmt(s["T_0.5"], "T_0.5"), str(last), fmt(rows[-1]["wall_time"], "wall_time")]


@pytest.mark.slow
def test_a_run_in_progress_shows_running_and_killed_interrupted_at_its_checkpoint(tmp_path, capsys):
    """A `fedsl run` paused after round 8 of 20 (checkpoints at 3 and 6; no summary.json yet): running, 8 rounds. Killed
    with SIGKILL there: interrupted, 6 rounds (where `fedsl resume` continues), the metrics of rounds 1..6."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.format(rounds=20, alg="fsl", dtype="float32", executor="sequential"))
    out = tmp_path / "out"
    proc = start_paused(["run", str(cfg), "--out", str(out), "--quiet"], tmp_path / "ready", "round:8",
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.poll() is None, "the run ended before round 8"
        rd = RunDir(out / "tiny")
        assert not rd.summary_file.exists()
        capsys.readouterr()
        assert main(["show", str(out)]) == 0
        assert table_row(capsys.readouterr().out, "tiny") == expected_row(rd, 8, "running")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert rd.checkpoint_round() == 6 and len(rd.read_metrics()) == 9
    assert main(["show", str(out)]) == 0
    assert table_row(capsys.readouterr().out, "tiny") == expected_row(rd, 6, "interrupted")


def test_a_run_killed_after_an_interruption_shows_its_later_checkpoint(tmp_path, capsys, one_thread):
    """summary.json of an earlier Ctrl-C (interrupted after 2 rounds) and a checkpoint of round 4 since (a resume
    killed with kill -9): interrupted, 4 rounds. Stopped by Ctrl-C alone, summary.json is shown as it is."""
    from fedsl.config import loading
    from fedsl.runs.runner import run
    cfg_file = tmp_path / "tiny.toml"
    cfg_file.write_text(TINY.format(rounds=8, alg="fsl", dtype="float64", executor="sequential"))
    cfg = loading.load(cfg_file)
    rd = RunDir(tmp_path / "run")
    run(cfg, rd.path, log=lambda s: None, progress=False, stop_after=2)
    summary = rd.read_summary()
    assert main(["show", str(rd.path)]) == 0
    assert table_row(capsys.readouterr().out, "run")[1:] == [
        "interrupted", fmt(summary["final_accuracy"]), fmt(summary["rise_time"], "rise_time"),
        fmt(summary["T_0.5"], "T_0.5"), "2", fmt(summary["wall_time"], "wall_time")]
    run(cfg, rd.path, resume=True, log=lambda s: None, progress=False, stop_after=2)
    rd.write_summary(summary)  # what a kill -9 of the resume leaves: the summary of round 2, a checkpoint of round 4
    assert rd.checkpoint_round() == 4
    assert main(["show", str(rd.path)]) == 0
    assert table_row(capsys.readouterr().out, "run") == expected_row(rd, 4, "interrupted")


def flower_out_dir(tmp_path: Path) -> Path:
    """A Flower ServerApp's out-dir: FSL for 3 rounds on nodes in this process (tests/test_flower.py's ``LoopGrid``),
    evaluated every round as the ServerApp evaluates, then the end it writes (``finish``: final.pt, done.json)."""
    pytest.importorskip("flwr")
    from test_flower import LoopGrid

    from fedsl.flower import FedslStrategy, load_setup
    from fedsl.flower.records import to_record
    out = tmp_path / "flower-out"
    rc = {**FLOWER_RUN, "eval_every": 1, "out-dir": str(out)}
    strategy = FedslStrategy(load_setup(rc))
    strategy.start(LoopGrid(rc, {100 + i: i for i in range(4)}), to_record(strategy.state.x), num_rounds=3,
                   timeout=5.0, evaluate_fn=strategy.evaluate)
    strategy.finish()
    return out


@pytest.mark.usefixtures("flower_task_identity")
def test_show_a_flower_out_dir(tmp_path, capsys, one_thread):
    """Completed (done.json): its row as a run's, with 3 of 3 rounds and the paper's metrics over evaluations.json's
    rounds 1..3, what the rounds aggregated, and each evaluation. Failed (failed.json): its reason. Neither:
    unfinished. A malformed evaluations.json: one line naming it."""
    out = flower_out_dir(tmp_path)
    evals = json.loads((out / "evaluations.json").read_text())
    history = json.loads((out / "rounds.json").read_text())
    assert [e["round"] for e in evals] == [0, 1, 2, 3] and (out / "done.json").is_file()
    scored = evals[1:]
    s = metrics.summarize([e["round"] for e in scored], [e["accuracy"] for e in scored], 20)
    seconds = sum(h["seconds"] for h in history)

    assert main(["show", str(out)]) == 0
    printed = capsys.readouterr().out
    assert table_row(printed, out.name) == [out.name, "completed", fmt(s["final_accuracy"], "final_accuracy"),
                                            fmt(s["rise_time"], "rise_time"), fmt(s["T_0.5"], "T_0.5"), "3 of 3",
                                            fmt(seconds, "wall_time")]
    trained = sum(len(h["trained"]) for h in history)
    assert f"{trained} client updates aggregated in 3 rounds (0 rounds without one), 0 replies rejected; " \
           "federation replay" in printed
    rolling = metrics.rolling([1, 2, 3], [e["accuracy"] for e in scored], 20)
    assert table_row(printed, "0")[1:] == [f"{evals[0]['accuracy']:.4f}", f"{evals[0]['loss']:.4f}",
                                           f"{evals[0]['accuracy']:.4f}"]
    for e, roll in zip(scored, rolling):
        assert table_row(printed, str(e["round"]))[1:] == [f"{e['accuracy']:.4f}", f"{e['loss']:.4f}", f"{roll:.4f}"]

    # what fail() writes instead of done.json and final.pt
    (out / "done.json").unlink()
    (out / "final.pt").unlink()
    (out / "failed.json").write_text(json.dumps({"status": "failed", "reason": "no SuperNode to train", "rounds": 3}))
    assert main(["show", str(out)]) == 0
    printed = capsys.readouterr().out
    assert table_row(printed, out.name)[1] == "failed" and "failed: no SuperNode to train" in printed
    (out / "failed.json").unlink()
    assert main(["show", str(out)]) == 0
    printed = capsys.readouterr().out
    assert table_row(printed, out.name)[1] == "unfinished" and "no done.json or failed.json" in printed

    (out / "evaluations.json").write_text('[{"round": 1, "accuracy": "high"}]')
    assert main(["show", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "evaluations.json' is not a list of entries with round, accuracy, loss" in err
