"""fedsl tune's budget: trials asked several at a time and run stacked (each equal to its run alone), pruners over
rounds and a budget in rounds run, ranges widened when the best value lies at an edge, trials named by their
folders, and the one-line refusals of bad [tune] values."""

from __future__ import annotations

import copy
import csv
import json
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from test_tune import TOML  # noqa: E402

from fedsl import tune as T  # noqa: E402
from fedsl.algorithms.spec import Range  # noqa: E402
from fedsl.config.schema import ConfigError, validate  # noqa: E402
from fedsl.runs import runner  # noqa: E402
from fedsl.runs.callbacks import Callback, StopRun  # noqa: E402
from fedsl.tune import edges as E  # noqa: E402

# test_tune.py's tiny study, one variant, in float64 with the sequential executor (exact comparisons), evaluated
# every other round, every trial whole
BASE = {**{k: v for k, v in tomllib.loads(TOML).items() if k != "variants"}, "rounds": 6, "dtype": "float64",
        "executor": "sequential", "eval_every": 2, "eval_final_window": False}
BASE["tune"] = {**BASE["tune"], "pruner": "none"}


def _cfg(tune: dict | None = None, **top):
    data = copy.deepcopy(BASE)
    data["tune"].update(tune or {})
    data.update(top)
    return validate(data)


def _rows(folder: Path) -> list[dict]:
    """metrics.csv without its wall-clock column."""
    with open(folder / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in csv.DictReader(f)]


@pytest.mark.parametrize("executor, exact", [("sequential", True), ("vectorised", False)])
def test_stacked_trials_equal_their_runs_alone(tmp_path, monkeypatch, executor, exact):
    """tune.stack = 3: the three trials are asked at once (TPE's constant liar keeps them apart) and run as one
    stack; each one's metrics equal its config run alone: exactly with the sequential executor in float64, to
    1e-12 with the vectorised one (a batched matmul sums in another order)."""
    stacks = []
    real = runner.run_stacked

    def counted(cfgs, outs, **kw):
        stacks.append(len(cfgs))
        return real(cfgs, outs, **kw)
    monkeypatch.setattr(runner, "run_stacked", counted)
    out = tmp_path / "study"
    T.start(_cfg({"stack": 3}, executor=executor), out, log=lambda s: None).run()
    assert stacks == [3]
    folders = sorted((out / "tiny").iterdir())
    assert [f.name for f in folders] == ["trial-0000", "trial-0001", "trial-0002"]
    lrs = set()
    for folder in folders:
        cfg = validate(json.loads((folder / "config.json").read_text()))
        lrs.add(cfg.algorithm.local_lr)
        runner.run(cfg, tmp_path / "alone" / folder.name, log=lambda s: None, progress=False)
        stacked, alone = _rows(folder), _rows(tmp_path / "alone" / folder.name)
        assert len(stacked) == len(alone) == 4  # rounds 0, 2, 4, 6
        for a, b in zip(stacked, alone):
            for key in a:
                if exact or not a[key] or key == "round":
                    assert a[key] == b[key], (folder.name, key)
                else:
                    assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-12, abs=1e-12), (folder.name, key)
    assert len(lrs) == 3  # three draws, not one asked three times
    best = {r["variant"]: r for r in T.results(out)}["tiny"]
    assert best["complete"] == 3 and best["rounds_run"] == 18 and best["folder"] in {f.name for f in folders}


class _StopAt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_evaluation(self, round, metrics):
        if round == self.at:
            raise StopRun(f"round {round}", status="pruned")


def test_a_run_stopped_in_a_stack_leaves_it_and_the_others_equal_their_runs_alone(tmp_path):
    """A callback's StopRun ends its run alone after recording that round whole (its metrics row); the stack goes
    on without it and its other runs end as they would alone."""
    cfgs = [_cfg(algorithm={**BASE["algorithm"], "local_lr": lr}) for lr in (0.05, 0.1, 0.2)]
    ends = runner.run_stacked(cfgs, [tmp_path / f"s{i}" for i in range(3)], log=lambda s: None, progress=False,
                              callbacks=[[], [_StopAt(2)], []])
    assert [e["status"] for e in ends] == ["completed", "pruned", "completed"]
    assert ends[1]["rounds_done"] == 2 and [r["round"] for r in _rows(tmp_path / "s1")] == ["0", "2"]
    for i in (0, 2):
        runner.run(cfgs[i], tmp_path / f"a{i}", log=lambda s: None, progress=False)
        assert _rows(tmp_path / f"s{i}") == _rows(tmp_path / f"a{i}")
    alone = runner.run(cfgs[1], tmp_path / "a1", log=lambda s: None, progress=False, callbacks=[_StopAt(2)])
    assert alone["status"] == "pruned" and _rows(tmp_path / "a1") == _rows(tmp_path / "s1")


def test_stacked_runs_of_a_generated_benchmark_equal_the_runs_alone(tmp_path):
    """Clients made on demand (a generated benchmark) stack: each run's round pool is made per run, and runs of
    one seed share it (a study's trials); runs of two seeds each keep their own."""
    base = {"rounds": 4, "threads": 1, "dtype": "float64", "executor": "sequential", "eval_every": 2,
            "eval_final_window": False,
            "data": {"dataset": "synthetic_fedprox", "num_clients": 30, "server_size": 20,
                     "synthetic_max_samples": 60, "synthetic_test_clients": 10},
            "model": {"name": "logreg"},
            "algorithm": {"name": "fsl", "clients_per_round": 3, "local_lr": 0.05, "batch_size": 5}}
    cfgs = []
    for seed, lr in ((0, 0.05), (0, 0.1), (1, 0.05)):
        data = json.loads(json.dumps(base))
        data["seed"], data["algorithm"]["local_lr"] = seed, lr
        cfgs.append(validate(data))
    runner.run_stacked(cfgs, [tmp_path / f"s{i}" for i in range(3)], log=lambda s: None, progress=False)
    for i, cfg in enumerate(cfgs):
        runner.run(cfg, tmp_path / f"a{i}", log=lambda s: None, progress=False)
        assert _rows(tmp_path / f"s{i}") == _rows(tmp_path / f"a{i}"), i


def test_hyperband_and_a_budget_in_rounds_run(tmp_path):
    """tune.pruner = 'hyperband' prunes over rounds; tune.budget_rounds = 90 runs trials until 90 rounds were run
    (a pruned trial counts what it ran) and best.json states the rounds run."""
    out = tmp_path / "hb"
    said: list[str] = []
    T.start(_cfg({"pruner": "hyperband", "budget_rounds": 90, "startup_trials": 1}, rounds=9, eval_every=1),
            out, log=said.append).run()
    row = T.results(out)[0]
    trials = row["complete"] + row["pruned"] + row["failed"]
    assert row["budget"] is None and row["budget_rounds"] == 90 and 90 <= row["rounds_run"] < 90 + 9
    assert row["rounds_run"] < 9 * trials  # hyperband stopped some trial early
    assert row["pruned"] >= 1 and any(": pruned after round " in s for s in said), said
    assert json.loads((out / "best.json").read_text()) if T.write_report(out) else False


def test_edges_are_judged_on_the_log_scale_and_hard_edges_are_not_widened():
    lr = Range(1e-3, 1.0, log=True)
    assert E.at_edges({"lr": lr}, {"lr": 1.3e-3}) == {"lr": "low"}  # 3.8% of the log-range
    assert E.at_edges({"lr": lr}, {"lr": 0.02}) == {}
    assert E.at_edges({"lr": lr}, {"lr": 0.9}) == {"lr": "high"}
    beta = Range(0.0, 0.99, hard_low=True, hard_high=True)
    assert E.at_edges({"beta": beta}, {"beta": 0.98}) == {"beta": "high (hard)"} and E.widened(beta, "high") is None
    assert E.widened(lr, "low") == Range(1e-4, 1.0, log=True)
    assert E.widened(Range(0.9, 1.0), "low") == Range(0.8, 1.0)
    steps = Range(10, 10_000, log=True, integer=True, hard_high=True)
    assert E.widened(steps, "low") == Range(1, 10_000, log=True, integer=True, hard_high=True)
    assert E.widened(Range(1, 10_000, log=True, integer=True), "low") is None  # nothing below 1 on a log scale
    space, said = E.widen({"lr": lr, "beta": beta}, {"lr": 0.95, "beta": 0.985}, lambda k, v: True)
    assert space["lr"] == Range(1e-3, 10.0, log=True) and space["beta"] == beta
    assert said == {"lr": "high 1 -> 10", "beta": "high 0.99: hard, not widened"}
    space, said = E.widen({"lr": lr}, {"lr": 0.95}, lambda k, v: v <= 1)  # the config refuses the new end
    assert space["lr"].hard_high and said == {"lr": "high 1: hard, not widened"}
    assert E.from_json({"lr": lr}, E.to_json(space)) == space
    grid = {"gamma": [0.6, 0.8, 1.0, 1.2], "name": ["a", "b"]}
    assert E.at_edges(grid, {"gamma": 1.2, "name": "a"}) == {"gamma": "high (of the list)"}
    assert E.at_edges(grid, {"gamma": 0.8}) == {} and E.widen(grid, {"gamma": 0.6}, lambda k, v: True)[1] == {}


def _epochs_study(out: Path, low: int, high: int, said: list[str]) -> dict:
    space = {"algorithm.local_epochs": {"low": low, "high": high, "integer": True}, "algorithm.local_lr": 0.05,
             "algorithm.global_lr": 1.0, "server.gamma": 1.0}
    T.start(_cfg({"trials": 2, "edge_widenings": 1, "edge_trials": 2, "space": space}), out, log=said.append).run()
    return T.results(out)[0]


def test_a_best_value_at_an_edge_widens_its_range_and_the_study_goes_on(tmp_path):
    """E_c in [2, 3] (integer): every value lies at an edge, and neither side is hard. Once the budget of two is
    spent, the best one's side widens by the range's width and two more trials run, drawn from the widened range;
    the study keeps it, so a resumed study asks nothing more."""
    said: list[str] = []
    row = _epochs_study(tmp_path / "edge", 2, 3, said)
    assert row["widenings"] == 1 and row["budget"] == 4 and row["complete"] + row["pruned"] + row["failed"] == 4
    (key, how), = row["widened"].items()
    assert key == "algorithm.local_epochs" and how in ("low 2 -> 1", "high 3 -> 4"), how
    assert any("lies at an edge" in s and "2 more trials" in s for s in said), said
    T.reopen(tmp_path / "edge", log=lambda s: None).run()  # nothing left: the budget and the widening are kept
    assert T.results(tmp_path / "edge")[0]["values"] == row["values"]


def test_a_best_value_at_a_hard_edge_is_reported_not_widened(tmp_path):
    """E_c in [1, 2]: the best trial's E_c = 1, below which the config refuses (E_c >= 1): that edge is reported
    hard (best.json's at_edge, the progress line) and the study ends at its budget."""
    said: list[str] = []
    row = _epochs_study(tmp_path / "hard", 1, 2, said)
    assert row["params"]["algorithm.local_epochs"] == 1 and row["widenings"] == 0 and row["budget"] == 2
    assert row["at_edge"] == {"algorithm.local_epochs": "low (hard)"}
    assert "tiny: the best trial (trial-0000) lies at an edge: algorithm.local_epochs low 1: hard, not widened" in said


def test_trials_are_named_by_their_folders_after_a_kill(tmp_path):
    """A trial left running by a killed process runs again under its name; the next new trial takes the next
    folder, not Optuna's trial number (which counts the interrupted one twice)."""
    out = tmp_path / "named"
    tuner = T.start(_cfg({"trials": 3}), out, log=lambda s: None)
    study, (first,) = tuner.ask("tiny")
    tuner.run_trials("tiny", study, [first])
    study, (second,) = tuner.ask("tiny")  # asked, then the process "dies"
    assert second.user_attrs["folder"] == "trial-0001"
    said: list[str] = []
    T.reopen(out, said.append).run()
    assert "tiny: trial-0001 was interrupted: it runs again with the same values" in said
    assert [s.split(" (")[0] for s in said[1:]] == ["tiny: trial-0001", "tiny: trial-0002"]
    row = T.results(out)[0]
    assert sorted(f for f, _ in row["values"]) == ["trial-0000", "trial-0001", "trial-0002"]
    assert sorted(p.name for p in (out / "tiny").iterdir()) == ["trial-0000", "trial-0001", "trial-0002"]
    assert {f for f, _, _ in row["top"]} <= {"trial-0000", "trial-0001", "trial-0002"}


@pytest.mark.parametrize("tune, expected", [
    ({"stack": 0}, "tune.stack = 0: expected 'auto' or trials asked at once, 1 to 64"),
    ({"stack": 65}, "tune.stack = 65: expected 'auto' or trials asked at once, 1 to 64"),
    ({"pruner": "asha"}, "tune.pruner"),
    ({"storage": "postgres://u:pw@h/db"}, "expected 'postgresql://...'"),
    ({"edge_widenings": -1}, "tune.edge_widenings"),
    ({"budget_rounds": 0}, "tune.budget_rounds"),
    ({"space": {"algorithm.local_lr": {"low": 0.01, "high": 0.1, "hard_top": True}}}, "hard_low and hard_high"),
    # a range past a bound the run refuses (E_c >= 1): the study would widen from there, so it is refused first
    ({"space": {"algorithm.local_epochs": {"low": 0, "high": 3, "integer": True}}},
     "tune.space.'algorithm.local_epochs' = 0"),
])
def test_bad_tune_values_stop_in_one_line(tmp_path, tune, expected):
    with pytest.raises(ConfigError) as e:
        T.start(_cfg(tune), tmp_path / "out", log=lambda s: None)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "pw" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_an_unreachable_database_stops_in_one_line_before_any_trial(tmp_path):
    pytest.importorskip("psycopg2")
    with pytest.raises(ConfigError) as e:
        T.start(_cfg({"storage": "postgresql+psycopg2://u:secret@127.0.0.1:1/x"}), tmp_path / "out",
                log=lambda s: None)
    assert "cannot connect" in str(e.value) and "secret" not in str(e.value) and "\n" not in str(e.value)
    assert not list((tmp_path / "out").rglob("trial-*"))
