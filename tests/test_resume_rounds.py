"""`fedsl resume DIR --rounds T`: a run or group taken on to T rounds equals one asked for T from the start, bit
for bit (config.json, metrics.csv but its wall times, the checkpoint, summary.json but its wall time); what cannot
be extended so is refused in one line, with the folder left as it was."""

import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from fedsl.cli import main
from fedsl.config import schema as C
from fedsl.runs import checkpoint
from fedsl.runs.runner import run

# eval_every = 2 with a window of 3: a run of 4 rounds evaluates rounds 2, 3, 4 (its final window), one of 7
# rounds 2, 4, 5, 6, 7: the extension drops round 3's row and computes round 4's rolling accuracy again
SPARSE = {"dtype": "float64", "executor": "sequential", "threads": 1, "eval_every": 2, "rolling_window": 3}


def config(rounds: int, **dotted) -> dict:
    """The tiny run (conftest) at ``rounds`` with ``SPARSE`` and the ``dotted`` keys (data__validation:
    data.validation)."""
    data = tiny_config(rounds=rounds, **SPARSE)
    for key, value in dotted.items():
        *tables, last = key.split("__")
        node = data
        for t in tables:
            node = node.setdefault(t, {})
        node[last] = value
    return data


def quiet(_line: str) -> None:
    pass


def rows(folder: Path) -> list[dict]:
    """metrics.csv's rows as text, less wall_time (a time, never equal)."""
    with open(folder / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in csv.DictReader(f)]


def assert_same_run(got: Path, want: Path) -> None:
    """Run folder ``got`` holds run ``want``'s files exactly, wall times aside."""
    assert json.loads((got / "config.json").read_text()) == json.loads((want / "config.json").read_text())
    assert rows(got) == rows(want)
    a, b = checkpoint.load(got / "checkpoint.pt"), checkpoint.load(want / "checkpoint.pt")
    assert a.round == b.round
    for name in b.state.x:
        assert torch.equal(a.state.x[name], b.state.x[name]), name
    assert a.state.algo.keys() == b.state.algo.keys() and a.state.clients == b.state.clients == {}
    for key, group in b.state.algo.items():
        assert all(torch.equal(a.state.algo[key][n], t) for n, t in group.items()), key
    assert (a.state.gamma, a.state.clip) == (b.state.gamma, b.state.clip)
    sa, sb = (json.loads((f / "summary.json").read_text()) for f in (got, want))
    assert sa.pop("wall_time") > 0 and sb.pop("wall_time") > 0
    assert sa == sb


def snapshot(folder: Path) -> dict[str, bytes]:
    """The folder's files and their bytes (less the lock `fedsl resume` takes: empty)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_a_completed_run_extended_is_the_run_asked_for_T(tmp_path, one_thread):
    """A run folder of 4 rounds, with a validation set (rolling_val_accuracy) and the fine-tuning control after its last
    round, taken on to 7: the run of 7 rounds."""
    extra = {"data__validation": 0.1, "server__finetune_epochs": 1}
    run(C.validate(config(4, **extra)), tmp_path / "ext", log=quiet, progress=False)
    run(C.validate(config(7, **extra)), tmp_path / "ref", log=quiet, progress=False)
    before = rows(tmp_path / "ext")
    assert [r["round"] for r in before] == ["0", "2", "3", "4"]  # round 3: only the end of 4 rounds evaluates it
    assert before[2]["rolling_accuracy"] != rows(tmp_path / "ref")[2]["rolling_accuracy"]  # round 4's window had 3

    assert main(["resume", str(tmp_path / "ext"), "--rounds", "7", "--quiet"]) == 0
    assert_same_run(tmp_path / "ext", tmp_path / "ref")
    summary = json.loads((tmp_path / "ext" / "summary.json").read_text())
    assert (summary["rounds"], summary["rounds_done"], summary["status"]) == (7, 7, "completed")
    assert "final_accuracy_finetuned" in summary and "rolling_val_accuracy" in rows(tmp_path / "ext")[0]


def test_an_interrupted_run_takes_T_as_its_target(tmp_path, one_thread):
    """A run of 4 rounds stopped after 3 (its checkpoint there), resumed with --rounds 7: the run of 7 rounds."""
    part = run(C.validate(config(4)), tmp_path / "ext", log=quiet, progress=False, stop_after=3)
    assert (part["status"], part["rounds_done"]) == ("interrupted", 3)
    run(C.validate(config(7)), tmp_path / "ref", log=quiet, progress=False)
    assert main(["resume", str(tmp_path / "ext"), "--rounds", "7", "--quiet"]) == 0
    assert_same_run(tmp_path / "ext", tmp_path / "ref")


def test_a_group_extended_is_the_group_asked_for_T(tmp_path, one_thread):
    """`fedsl run` of two seeds for 4 rounds, `fedsl resume --rounds 7`: group.json and each run as `fedsl run
    --set rounds=7` writes them."""
    cfg = tmp_path / "two.json"
    cfg.write_text(json.dumps({**config(4), "seeds": [1, 2]}))
    assert main(["run", str(cfg), "--out", str(tmp_path / "ext"), "--quiet"]) == 0
    assert main(["run", str(cfg), "--set", "rounds=7", "--out", str(tmp_path / "ref"), "--quiet"]) == 0
    assert main(["resume", str(tmp_path / "ext"), "--rounds", "7", "--quiet"]) == 0
    assert json.loads((tmp_path / "ext" / "group.json").read_text()) == \
        json.loads((tmp_path / "ref" / "group.json").read_text())
    for r in ("tiny-seed1", "tiny-seed2"):
        assert_same_run(tmp_path / "ext" / r, tmp_path / "ref" / r)
    assert "| 7 |" in (tmp_path / "ext" / "comparison.md").read_text()  # written again, of the 7 rounds


def test_a_diverged_run_is_relabelled_when_a_run_of_T_diverges_alike(tmp_path, one_thread, capsys):
    """diverge_loss = 0.01 stops a run at its second evaluation. Every round evaluated (eval_every = 1): a run of 7
    rounds diverges at round 2 too, and the run of 4 becomes it. Every second round evaluated: the run of 4 rounds
    diverged at round 3, which a run of 7 rounds does not evaluate: refused, nothing changed."""
    every = {"eval_every": 1, "diverge_loss": 0.01, "diverge_patience": 2}
    for rounds, name in ((4, "ext"), (7, "ref")):
        summary = run(C.validate({**config(rounds), **every}), tmp_path / name, log=quiet, progress=False)
        assert (summary["status"], summary["rounds_done"]) == ("diverged", 2)
    assert main(["resume", str(tmp_path / "ext"), "--rounds", "7", "--quiet"]) == 0
    assert_same_run(tmp_path / "ext", tmp_path / "ref")

    sparse = {"diverge_loss": 0.01, "diverge_patience": 2}
    summary = run(C.validate({**config(4), **sparse}), tmp_path / "odd", log=quiet, progress=False)
    assert (summary["status"], summary["rounds_done"]) == ("diverged", 3)
    before = snapshot(tmp_path / "odd")
    assert main(["resume", str(tmp_path / "odd"), "--rounds", "7", "--quiet"]) == 2
    assert snapshot(tmp_path / "odd") == before
    assert "diverged at round 3, counting an evaluation of round 3" in capsys.readouterr().err


@pytest.fixture(scope="module")
def done2(tmp_path_factory):
    """A completed run folder of 2 rounds (FSL)."""
    folder = tmp_path_factory.mktemp("done2") / "run"
    run(C.validate(config(2)), folder, log=quiet, progress=False)
    return folder


def refused(capsys, folder: Path, rounds: str, *words: str) -> None:
    """`fedsl resume FOLDER --rounds ROUNDS` stops with one line holding ``words`` and leaves the folder as it was."""
    before = snapshot(folder)
    capsys.readouterr()
    assert main(["resume", str(folder), "--rounds", rounds, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --rounds"), err
    assert all(w in err for w in words), err
    assert snapshot(folder) == before


@pytest.mark.parametrize("rounds, words", [("2", ("has run 2 rounds already", "expected more than 2")),
                                           ("1", ("has done 2 rounds", "expected more than 2")),
                                           ("0", ("expected a number of rounds from 1",))])
def test_T_not_above_the_rounds_done_is_refused(capsys, done2, rounds, words):
    refused(capsys, done2, rounds, *words)


@pytest.mark.parametrize("dotted, key", [
    ({"server__gamma_schedule": "linear", "server__gamma_final": 0.5}, "server.gamma_schedule = 'linear'"),
    ({"server__gamma_schedule": "cosine"}, "server.gamma_schedule = 'cosine'"),
    ({"algorithm__name": "fedavg", "privacy__clip": 1.0, "privacy__target_epsilon": 50.0},
     "privacy.target_epsilon = 50"),
    ({"algorithm__name": "scaffold"}, "algorithm.name = 'scaffold'"),
])
def test_what_moves_with_T_is_refused_naming_its_key(capsys, tmp_path, one_thread, dotted, key):
    run(C.validate(config(2, **dotted)), tmp_path / "run", log=quiet, progress=False)
    refused(capsys, tmp_path / "run", "5", key, "--set rounds=5")


def test_an_unfinished_run_is_not_shortened(capsys, tmp_path, one_thread):
    """Stopped after round 1 of 4: --rounds 3 is refused (its rows were those of a run of 4 rounds), 4 finishes it."""
    run(C.validate(config(4)), tmp_path / "run", log=quiet, progress=False, stop_after=1)
    refused(capsys, tmp_path / "run", "3", "1 of its 4 rounds", "at least 4")


def test_a_group_whose_variant_sets_rounds_and_a_study_are_refused(capsys, tmp_path, one_thread):
    cfg = tmp_path / "two.json"
    cfg.write_text(json.dumps({**config(2), "variants": {"tiny": {}, "longer": {"rounds": 3}}}))
    assert main(["run", str(cfg), "--out", str(tmp_path / "group"), "--quiet"]) == 0
    refused(capsys, tmp_path / "group", "5", "variants.longer sets rounds = 3")
    (tmp_path / "study").mkdir()
    from fedsl.tune import TUNE_FILE
    (tmp_path / "study" / TUNE_FILE).write_text("{}")
    refused(capsys, tmp_path / "study", "5", "is a study of `fedsl tune`")
