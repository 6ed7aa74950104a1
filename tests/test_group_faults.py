"""Faults around groups and sweeps: kill -9 at any moment, SIGTERM, stale temporary files, finite blow-ups.

A killed group or sweep resumes (`fedsl resume GROUP`) into files equal to an uninterrupted
run's: same metrics (without the wall clock) and the same final tensors.
"""

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY, start_paused

from fedsl.config import loading
from fedsl.config import schema as C
from fedsl.runs.runner import run

GROUP = '\n[variants.FSL.algorithm]\nname = "fsl"\n[variants.FedAvg.algorithm]\nname = "fedavg"\n'
SWEEP = '\n[sweep]\n"server.gamma" = [0.5, 1.0, 1.5]\n'
KINDS = {"group": GROUP, "sweep": SWEEP}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # same threads in every process: same float sums


def write_config(tmp_path: Path, kind: str, rounds: int = 8) -> Path:
    p = tmp_path / f"{kind}.toml"
    seeds = "seeds = [0, 1]\n" if kind == "group" else ""  # a group: 2 variants × 2 seeds; a sweep: 3 γ
    p.write_text(seeds + TINY.format(rounds=rounds, alg="fsl", dtype="float32", executor="sequential") + KINDS[kind])
    return p


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedsl.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


def metric_rows(run_dir: Path) -> list[list[str]]:
    with open(run_dir / "metrics.csv") as f:
        return [[v for k, v in r.items() if k != "wall_time"] for r in csv.DictReader(f)]


def assert_same_group(a: Path, b: Path) -> None:
    runs = json.loads((a / "group.json").read_text())["runs"]
    assert runs == json.loads((b / "group.json").read_text())["runs"]
    for r in runs:
        sa, sb = (json.loads((d / r / "summary.json").read_text()) for d in (a, b))
        assert sa["status"] == sb["status"] == "completed", r
        assert sa["final_accuracy"] == sb["final_accuracy"] and sa["rounds_done"] == sb["rounds_done"]
        assert metric_rows(a / r) == metric_rows(b / r), r
        ta, tb = (torch.load(d / r / "checkpoint.pt", weights_only=True) for d in (a, b))
        assert ta["round"] == tb["round"]
        for part in ("params", "algo"):
            assert _flat(ta[part]).keys() == _flat(tb[part]).keys()
            assert all(torch.equal(v, _flat(tb[part])[k]) for k, v in _flat(ta[part]).items()), (r, part)


def _flat(d: dict, prefix: str = "") -> dict:
    """{"c": {"w": t}} -> {"c.w": t}: a rule's state nests (SCAFFOLD's c holds one tensor per parameter)."""
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def kill_at(cmd: list[str], at: str, ready: Path) -> None:
    """Run ``fedsl CMD`` paused at ``at`` (conftest's ``start_paused``), then SIGKILL it there."""
    proc = start_paused(cmd, ready, at, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.poll() is None, "the run ended before the kill point"
    finally:
        proc.kill()
        proc.wait()


_reference: dict[str, Path] = {}


def reference(kind: str, tmp_path_factory) -> Path:
    """The uninterrupted group (computed once per kind), run in this process with one torch thread (the
    ``one_thread`` fixture): the killed processes' ``OMP_NUM_THREADS=1``, so the same float sums."""
    if kind not in _reference:
        from fedsl.cli import main
        d = tmp_path_factory.mktemp(f"ref-{kind}")
        out = d / "out"
        assert main(["run", str(write_config(d, kind)), "--out", str(out), "--quiet"]) == 0
        _reference[kind] = out
    return _reference[kind]


def first_run(out: Path) -> Path | None:
    spec = out / "group.json"
    return out / next(iter(json.loads(spec.read_text())["runs"])) if spec.is_file() else None


POINTS = {
    "before_any_run": "unit:0",  # the group's folder and group.json exist, no run has begun
    "mid_run": "round:4",  # the first run is half-way (4 of 8 rounds)
    "between_runs": "unit:1",  # the first run has finished (summary.json), the next has not begun
}


@pytest.mark.slow
@pytest.mark.parametrize("kind,point", [("group", "before_any_run"), ("group", "mid_run"),
                                        ("sweep", "between_runs"), ("sweep", "mid_run")])
def test_killed_group_resumes_into_the_uninterrupted_files(tmp_path, tmp_path_factory, one_thread, kind, point):
    """The killed `fedsl run` is a real process; `fedsl resume` runs here (one thread, as the killed one)."""
    from fedsl.cli import main
    ref = reference(kind, tmp_path_factory)
    out = tmp_path / "out"
    kill_at(["run", str(write_config(tmp_path, kind)), "--out", str(out), "--quiet"], POINTS[point],
            tmp_path / "ready")
    statuses = [json.loads((out / r / "summary.json").read_text()).get("status") if (out / r / "summary.json").is_file()
                else None for r in json.loads((out / "group.json").read_text())["runs"]]
    assert statuses.count("completed") < len(statuses), "killed before the end"
    assert main(["resume", str(out), "--quiet"]) == 0
    assert_same_group(out, ref)


@pytest.mark.slow
def test_sigterm_checkpoints_and_resumes(tmp_path, one_thread):
    """SIGTERM once the first run is 4 rounds in (of 16: the signal lands well before its end); `fedsl resume`
    runs here (``one_thread``: the resumed runs take the killed process's one thread, and the setting is
    restored after the module)."""
    from fedsl.cli import main
    out = tmp_path / "out"
    cfg = write_config(tmp_path, "sweep", rounds=16)
    proc = start_paused(["run", str(cfg), "--out", str(out), "--quiet"], tmp_path / "ready", "round:4", env=ENV,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.poll() is None, "the run ended before round 4"
    proc.send_signal(signal.SIGTERM)  # paused after round 4 of the first run: its handler is installed
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    r = first_run(out)
    summary = json.loads((r / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    ckpt = torch.load(r / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == summary["rounds_done"] == len(metric_rows(r)) - 1  # checkpoint at the last round
    assert not list(r.glob(".*.tmp"))
    assert main(["resume", str(out), "--quiet"]) == 0
    for name in json.loads((out / "group.json").read_text())["runs"]:
        assert json.loads((out / name / "summary.json").read_text())["status"] == "completed"


def test_stale_tmp_checkpoint_removed_on_resume(tmp_path):
    from fedsl.config.expand import expand_variants
    cfg = next(iter(expand_variants(loading.load(write_config(tmp_path, "sweep", rounds=4))).values()))  # one run
    d = tmp_path / "r"
    run(cfg, d, log=lambda s: None, progress=False, stop_after=2)
    stale = d / ".checkpoint.pt.12345.tmp"  # what a kill -9 during torch.save leaves
    stale.write_bytes(b"\0" * 1000)
    lines = []
    run(cfg, d, resume=True, log=lines.append, progress=False)
    assert not stale.exists()
    assert any(".checkpoint.pt.12345.tmp" in s for s in lines)


def test_interrupted_write_leaves_no_tmp(tmp_path):
    from fedsl.runs.results import atomic_write

    def write(p: Path):
        p.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "checkpoint.pt", write)
    assert list(tmp_path.iterdir()) == []


def blow_up(override: str, *more: str, rounds: int = 12) -> C.RunConfig:
    """The issue's commands on the quickstart as it was then (PyTorch init, inputs in [0, 1]),
    where they stay finite; FSL, 12 rounds."""
    from fedsl.config import presets
    return loading.load(None, [override, *more, "variants={}", "algorithm.name=fsl", "model.init=torch",
                         "data.normalize=unit", f"rounds={rounds}", "threads=1"], base=presets.load("quickstart"))


@pytest.mark.slow
@pytest.mark.parametrize("override", ["server.gamma=1e5", "algorithm.local_lr=1e4", "server.gamma=1e6"])
def test_blow_up_is_diverged(tmp_path, override):
    """γ = 1e5 and η_l = 1e4: losses ≈ 5e3–1e4 at chance accuracy, finite (γ = 1e6 here: NaN at once)."""
    lines = []
    s = run(blow_up(override), tmp_path / "r", log=lines.append, progress=False)
    assert s["status"] == "diverged", lines[-3:]
    with open(tmp_path / "r" / "metrics.csv") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    if override != "server.gamma=1e6":
        assert s["rounds_done"] == 3  # three evaluations in a row above the bound (diverge_patience)
        assert len(losses) == 4 and all(x > 100 * losses[0] for x in losses[1:])
        # with the check off, the same run is "completed" at chance accuracy: 4 rounds, one past where it stopped
        off = run(blow_up(override, "diverge_loss=0", rounds=4), tmp_path / "off", log=lambda s: None,
                  progress=False)
        assert off["status"] == "completed" and off["final_accuracy"] < 0.2


@pytest.mark.slow
def test_divergence_count_survives_resume(tmp_path):
    """The count of evaluations above the bound is rebuilt from metrics.csv on resume."""
    more = ("diverge_patience=4", "checkpoint_every=1")
    full = run(blow_up("server.gamma=1e5", *more), tmp_path / "full", log=lambda s: None, progress=False)
    assert full["status"] == "diverged" and full["rounds_done"] == 4
    part = run(blow_up("server.gamma=1e5", *more), tmp_path / "part", log=lambda s: None, progress=False,
               stop_after=3)
    assert part["status"] == "interrupted"
    again = run(blow_up("server.gamma=1e5", *more), tmp_path / "part", resume=True, log=lambda s: None,
                progress=False)
    assert again["status"] == "diverged" and again["rounds_done"] == 4


def test_spike_that_recovers_is_not_diverged(tmp_path):
    """A single evaluation above the bound (γ = 100: one loss of ≈ 3e3 at round 1, then ≈ 2.5) is not a
    divergence: 4 rounds, where a loss that stayed above the bound would stop the run at round 3."""
    s = run(blow_up("server.gamma=100", rounds=4), tmp_path / "r", log=lambda s: None, progress=False)
    assert s["status"] == "completed"
    with open(tmp_path / "r" / "metrics.csv") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    bound = blow_up("server.gamma=100").diverge_loss
    assert losses[1] > bound and all(x < bound for x in losses[2:]), losses  # the spike happened, then passed


def test_data_warnings_print_as_one_line(tmp_path, capsys):
    """A test split missing a class: `warning: ...` on one line, not Python's file:line echo."""
    from PIL import Image

    from fedsl.cli import main
    for split, classes in (("train", "abc"), ("test", "ab")):
        for c in classes:
            (tmp_path / "imgs" / split / c).mkdir(parents=True)
            for k in range(20):
                Image.new("L", (8, 8), color=k * 20).save(tmp_path / "imgs" / split / c / f"{k}.png")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'name = "w"\nrounds = 1\n[data]\ndataset = "image_folder"\ndata_dir = "{tmp_path / "imgs"}"\n'
                   'num_clients = 2\npartition = "iid"\nserver_size = 0\n[model]\nname = "linear"\n'
                   '[algorithm]\nname = "fedavg"\nclients_per_round = 1\nbatch_size = 2\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "'c'" in x]
    assert lines and all(x.startswith("warning: ") for x in lines), err
    assert "warnings.warn" not in err and "DataWarning" not in err


def test_a_folder_in_use_is_refused_by_a_second_process(tmp_path, capsys):
    """Two `fedsl resume` (or run) processes on one folder would write the same files; the second
    stops with one line, and the lock dies with its process (no stale lock after kill -9)."""
    from fedsl.cli import main
    from fedsl.runs.results import folder_lock
    out = tmp_path / "out"
    assert main(["run", str(write_config(tmp_path, "sweep", rounds=2)), "--out", str(out), "--quiet"]) == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from fedsl.runs.results import "
                               "folder_lock\nwith folder_lock(sys.argv[1]):\n print('held', flush=True); "
                               "time.sleep(60)", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(["resume", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "in use by another fedsl process" in err and "\n" not in err
        assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(out):  # the killed holder's lock is gone
        pass
    assert main(["resume", str(out), "--quiet"]) == 0


def scaffold_stack() -> C.RunConfig:
    """Two SCAFFOLD runs (seeds 0, 1) stacked, 6 rounds, a checkpoint every 2: the disk-fault tests' sweep."""
    data = loading.load(base=__import__("tomllib").loads(TINY.format(rounds=6, alg="scaffold", dtype="float64",
                                                               executor="sequential")))
    return C.validate({**data.model_dump(), "seeds": [0, 1], "stack": 2, "checkpoint_every": 2})


@pytest.fixture(scope="module")
def scaffold_whole(tmp_path_factory) -> Path:
    """The disk-fault tests' sweep run without a fault (once for the module)."""
    from fedsl.sweeps.compare import run_group
    out = tmp_path_factory.mktemp("scaffold") / "whole"
    run_group(scaffold_stack(), out, log=lambda m: None, progress=False)
    return out


def test_ctrl_c_with_a_full_disk_stays_an_interruption(tmp_path, monkeypatch, scaffold_whole):
    """Ctrl-C while the disk is full: the stacked runs' interruption checkpoints cannot be written. The
    interrupt still ends the sweep (it did not fall back to running the stack's runs one by one), each run
    keeps its last checkpoint, and the sweep resumes into the uninterrupted sweep's files."""
    from fedsl.engine.stacked import StackedSimulator
    from fedsl.runs.results import RunDir
    from fedsl.sweeps.compare import run_group

    cfg = scaffold_stack()
    quiet = {"log": lambda m: None, "progress": False}

    real_round, real_save = StackedSimulator.round, RunDir.save_checkpoint

    def round_(self, states, t):
        if t == 3:
            raise KeyboardInterrupt
        return real_round(self, states, t)

    def save(self, round_, state, wall):
        if round_ == 3:
            raise OSError(28, "No space left on device")
        return real_save(self, round_, state, wall)
    monkeypatch.setattr(StackedSimulator, "round", round_)
    monkeypatch.setattr(RunDir, "save_checkpoint", save)
    with pytest.raises(KeyboardInterrupt):
        run_group(cfg, tmp_path / "cut", **quiet)
    runs = sorted(p for p in (tmp_path / "cut").iterdir() if p.is_dir())
    assert len(runs) == 2
    for r in runs:
        assert RunDir(r).read_summary()["status"] == "interrupted" and RunDir(r).checkpoint_round() == 2
    monkeypatch.undo()
    run_group(cfg, tmp_path / "cut", resume=True, **quiet)
    assert_same_group(scaffold_whole, tmp_path / "cut")


def test_a_full_disk_at_a_periodic_checkpoint_does_not_stop_the_runs(tmp_path, monkeypatch, scaffold_whole):
    """The disk is full when round 4's checkpoints are due: one log line per run, the (stacked) runs train
    on and end with the files of runs that never met a full disk; round 2's checkpoints stayed meanwhile."""
    from fedsl.runs.results import RunDir
    from fedsl.sweeps.compare import run_group

    cfg = scaffold_stack()
    real_save, lines, seen = RunDir.save_checkpoint, [], []

    def save(self, round_, state, wall):
        if round_ == 4:
            seen.append(self.checkpoint_round())
            raise OSError(28, "No space left on device")
        return real_save(self, round_, state, wall)
    monkeypatch.setattr(RunDir, "save_checkpoint", save)
    run_group(cfg, tmp_path / "full-disk", log=lines.append, progress=False)
    assert seen == [2, 2]
    failed = [m for m in lines if "could not write the checkpoint of round 4" in m]
    assert len(failed) == 2 and all("an interruption resumes from round 2" in m for m in failed), lines
    assert not any("one by one" in m for m in lines), lines
    assert_same_group(scaffold_whole, tmp_path / "full-disk")


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what a full disk or a partial copy leaves


def test_a_checkpoint_cut_in_half_is_one_line_and_the_group_goes_on(tmp_path, capsys):
    """A truncated checkpoint.pt: `fedsl resume` of the run says which file and what to do in one line (it was
    a torch traceback); in a group the other runs go on; removing the file starts that run over. The error line
    is read from a real `fedsl` process; the other commands run in this one."""
    from fedsl.cli import main
    cfg_file = write_config(tmp_path, "sweep", rounds=4)
    single = tmp_path / "single"
    run(loading.load(cfg_file, ["sweep={}"]), single, log=lambda s: None, progress=False, stop_after=2)
    _cut_in_half(single / "checkpoint.pt")
    res = cli("resume", str(single))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and "remove it" in line
    assert "checkpoint.pt: the checkpoint cannot be read" in line
    (single / "checkpoint.pt").unlink()
    assert main(["resume", str(single), "--quiet"]) == 0
    assert json.loads((single / "summary.json").read_text())["status"] == "completed"

    group = tmp_path / "group"
    assert main(["run", str(cfg_file), "--out", str(group), "--quiet"]) == 0
    names = list(json.loads((group / "group.json").read_text())["runs"])
    for name in names[:2]:  # two runs left interrupted, the first with a broken checkpoint
        s = json.loads((group / name / "summary.json").read_text())
        (group / name / "summary.json").write_text(json.dumps({**s, "status": "interrupted"}))
    _cut_in_half(group / names[0] / "checkpoint.pt")
    capsys.readouterr()
    main(["resume", str(group)])
    res = capsys.readouterr()
    assert "Traceback" not in res.out + res.err, res.out + res.err
    assert f"{names[0]}: failed (CorruptCheckpoint:" in res.out and "remove it" in res.out, res.out
    assert json.loads((group / names[1] / "summary.json").read_text())["status"] == "completed"
