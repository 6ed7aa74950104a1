"""`fedsl show` on what summary.json does not describe: a run killed with kill -9 (interrupted, at its checkpoint's
round) or in progress (running)."""

import signal
import subprocess

import pytest
from conftest import TINY, start_paused

from fedsl.cli import main
from fedsl.engine import metrics
from fedsl.experiments.results import RunDir
from fedsl.report.tables import fmt


def table_row(out: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first`` in rich's printed table."""
    for line in out.splitlines():
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
    from fedsl.experiments import loading
    from fedsl.experiments.runner import run
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
