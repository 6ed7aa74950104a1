"""fedsl tune: an Optuna study per variant on validation data, the same budget each; it never reads the test set,
bad input stops before any trial, and a study killed with kill -9 resumes to what it would have been."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from fedsl import tune as T  # noqa: E402
from fedsl.config.schema import ConfigError, validate  # noqa: E402
from fedsl.config.tune_space import default_space  # noqa: E402

TOML = """
name = "tiny"
rounds = 8
threads = 1
checkpoint_every = 2
[data]
dataset = "synthetic_chars"
num_clients = 10
classes_per_client = 2
server_size = 50
train_per_class = 60
test_per_class = 10
[model]
name = "mlp"
[algorithm]
name = "fsl"
clients_per_round = 3
local_lr = 0.05
batch_size = 10
[tune]
trials = 3
startup_trials = 1
edge_widenings = 0         # a budget of three: its best lies at an edge too often (widening: its own tests)
[variants.FedAvg.algorithm]
name = "fedavg"
[variants.FSL.algorithm]
name = "fsl"
"""


def _cfg(text: str = TOML, **tune):  # noqa: D103
    import tomllib
    data = tomllib.loads(text)
    data["tune"].update(tune)
    return validate(data)


def _values(out: Path) -> dict[str, list]:
    """Each variant's finished trials in order: (state, value, values drawn), from the folder's storage."""
    import optuna

    from fedsl.config.tune_storage import open_storage, study_name
    record = json.loads((out / T.TUNE_FILE).read_text())
    kind = record["config"]["tune"]["storage"]
    storage = open_storage(kind, out)
    return {v: [(t.state.name, t.value, t.params) for t in optuna.load_study(
                study_name=study_name(kind, record["study_prefix"], v), storage=storage).trials
                if "rerun" not in t.user_attrs]
            for v in record["variants"]}


def test_each_rule_searches_what_it_reads():
    base = {"rounds": 1, "data": {"dataset": "synthetic_chars", "server_size": 20}}
    space = {name: set(default_space(validate({**base, "algorithm": {"name": name}})))
             for name in ("fedavg", "fsl", "fedprox", "fedadam", "feddu", "d0_only", "feddyn", "feddf")}
    assert space["fedavg"] == {"algorithm.local_lr", "algorithm.global_lr"}
    assert space["fsl"] == {"algorithm.local_lr", "algorithm.global_lr", "server.gamma"}
    assert space["fedprox"] == {"algorithm.local_lr", "algorithm.global_lr", "algorithm.mu"}
    assert space["fedadam"] == {"algorithm.local_lr", "algorithm.global_lr", "algorithm.tau"}  # β fixed, as Reddi
    assert space["feddu"] == {"algorithm.local_lr", "algorithm.global_lr", "algorithm.feddu_decay"}  # sets γ_t
    assert space["d0_only"] == {"algorithm.local_lr", "server.gamma"}  # the clients' updates are dropped: no η_g
    assert space["feddyn"] == {"algorithm.local_lr", "algorithm.alpha"}  # no η_g
    assert space["feddf"] == {"algorithm.local_lr", "algorithm.global_lr", "distill.lr", "distill.steps"}
    fedadam = default_space(validate({**base, "algorithm": {"name": "fedadam"}}))["algorithm.global_lr"]
    assert (fedadam.low, fedadam.high, fedadam.log) == (1e-3, 1.0, True)


@pytest.mark.parametrize("tune, set_, expected", [
    ({"trails": 3}, {}, "unknown key 'tune.trails': did you mean 'tune.trials'?"),
    ({"space": {"algorithm.local_lr": {"low": 0.1, "high": 0.01}}}, {}, "expected low < high"),
    ({"metric": "test_accuracy"}, {}, "tune.metric = 'test_accuracy'"),
    ({"space": {"algorithm.mu": {"low": 0.001, "high": 0.1}}}, {}, "tune.space.'algorithm.mu'"),
    ({"space": {"algorithm.local_rate": 0.1}}, {}, "tune.space.'algorithm.local_rate': not a key"),
    ({}, {"sweep": {"server.gamma": [0.5, 1.0]}}, "sweep: a config with a [sweep] is not tuned"),
])
def test_bad_input_stops_in_one_line_before_any_trial(tmp_path, tune, set_, expected):
    import tomllib
    data = tomllib.loads(TOML)
    data["tune"].update(tune)
    data.update(set_)
    with pytest.raises(ConfigError) as e:
        T.start(validate(data), tmp_path / "out", log=lambda s: None)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out" / T.STUDY_FILE).exists()


def test_a_folder_that_holds_a_study_is_not_overwritten(tmp_path):
    out = tmp_path / "out"
    T.start(_cfg(trials=1), out, log=lambda s: None).run()
    with pytest.raises(ConfigError, match=r"is not empty: choose a new folder, or continue it with `fedsl resume"):
        T.start(_cfg(trials=2), out, log=lambda s: None)


@pytest.mark.slow
def test_a_study_never_reads_the_test_set(tmp_path, monkeypatch):
    """The same study with the test set's labels scrambled and its images zeroed draws and scores every trial
    alike: neither the objective nor the pruning reads the test set (trials still evaluate it, as any run)."""
    import torch

    from fedsl.runs import build

    said: list[str] = []
    T.start(_cfg(), tmp_path / "a", log=said.append).run()
    real = build.build_federation

    def poisoned(d, seed):
        fed = real(d, seed)
        fed.y_test = torch.randint(0, fed.num_classes, fed.y_test.shape, generator=torch.Generator().manual_seed(1))
        fed.x_test = torch.zeros_like(fed.x_test)
        return fed

    monkeypatch.setattr(build, "build_federation", poisoned)
    T.start(_cfg(), tmp_path / "b", log=lambda s: None).run()
    a, b = _values(tmp_path / "a"), _values(tmp_path / "b")
    assert a == b and len(a["FSL"]) == 3 and len(a["FedAvg"]) == 3, (a, b)
    assert any(state == "COMPLETE" for state, _, _ in a["FSL"]), a
    summary = json.loads((tmp_path / "a" / "FSL" / "trial-0000" / "summary.json").read_text())
    assert 0 <= summary["final_val_accuracy"] <= 1 and summary["validation_size"] > 0
    assert any(s.startswith("FSL: trial-0002 (") for s in said), said


KILLER = """
import os, signal, sys
from fedsl import tune as T
from fedsl.config.loading import load
on_evaluation = T._Pruning.on_evaluation

def die_in_trial_1(self, round, metrics):  # kill -9 in the middle of FSL's second trial, after its checkpoint at 4
    if self.trial.study.study_name.endswith("FSL") and self.trial.number == 1 and round == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    on_evaluation(self, round, metrics)

T._Pruning.on_evaluation = die_in_trial_1
T.start(load(sys.argv[1]), sys.argv[2], print).run()
"""


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["sqlite", "journal", "postgresql"])
def test_kill_9_mid_trial_then_resume_keeps_finished_trials_and_ends_as_uninterrupted(tmp_path, storage, request):
    """On each tune.storage: the tune folder's SQLite file, Optuna's journal file, a real PostgreSQL server."""
    if storage == "postgresql":
        storage = request.getfixturevalue("postgres_url")
    text = TOML.replace("[tune]\n", f"[tune]\nstorage = {storage!r}\n")
    config = tmp_path / "tiny.toml"
    config.write_text(text)
    T.start(_cfg(text), tmp_path / "whole", log=lambda s: None).run()
    killed = subprocess.run([sys.executable, "-c", KILLER, str(config), str(tmp_path / "cut")], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = _values(tmp_path / "cut")
    assert [s for s, _, _ in before["FSL"]] == ["COMPLETE", "RUNNING"]  # trial 0 finished, trial 1 cut
    said: list[str] = []
    T.reopen(tmp_path / "cut", said.append).run()
    assert any("FSL: trial-0001 was interrupted: it runs again with the same values" in s for s in said), said
    after = _values(tmp_path / "cut")
    assert after["FSL"][0] == before["FSL"][0]  # the finished trial is kept, not run again
    assert after == _values(tmp_path / "whole")  # every trial drawn and scored as without the kill
    metrics = (tmp_path / "cut" / "FSL" / "trial-0001" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 1 + 9  # header, rounds 0..8: the cut trial continued its run folder from round 5


@pytest.mark.slow
def test_trials_in_two_processes_share_the_studies_and_keep_the_budget(tmp_path):
    """--parallel 2: two spawned workers ask for trials under a lock: the variant ends with exactly its budget of
    finished trials, none left running, each in its own run folder."""
    config = tmp_path / "tiny.toml"
    config.write_text(TOML)
    done = subprocess.run([sys.executable, "-m", "fedsl.cli", "tune", str(config), "--variants", "FSL", "--parallel",
                           "2", "--quiet", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    values = _values(tmp_path / "out")
    assert {v: len(t) for v, t in values.items()} == {"FSL": 3}
    assert all(state in ("COMPLETE", "PRUNED") for trials in values.values() for state, _, _ in trials), values
    assert sorted(p.name for p in (tmp_path / "out" / "FSL").iterdir()) == ["trial-0000", "trial-0001", "trial-0002"]


@pytest.mark.slow
def test_run_tuned_runs_each_variants_seeds_at_the_values_its_study_chose(tmp_path, capsys):
    """`fedsl run --tuned`: the studies in OUT/tune, then the group in OUT at each variant's best values, trained
    on the whole training data (the study's validation split is its own) and judged on the test set."""
    from fedsl.cli import main

    config = tmp_path / "tiny.toml"
    config.write_text(TOML.replace("trials = 3", "trials = 2"))
    out = tmp_path / "out"
    assert main(["run", str(config), "--tuned", "--quiet", "--set", "seeds=[5, 6]", "--out", str(out)]) == 0
    best = {r["variant"]: r["params"] for r in T.results(out / "tune")}
    for variant in ("FSL", "FedAvg"):
        for seed in (5, 6):
            run = json.loads((out / f"{variant}-seed{seed}" / "config.json").read_text())
            assert run["seed"] == seed and run["data"]["validation"] == 0
            for key, value in best[variant].items():
                section, name = key.split(".")
                assert run[section][name] == value, (variant, key)
            assert json.loads((out / f"{variant}-seed{seed}" / "summary.json").read_text())["status"] == "completed"
    assert best["FSL"] != best["FedAvg"]
    capsys.readouterr()
    assert main(["show", str(out)]) == 0  # the group, and where its values came from
    shown = capsys.readouterr().out
    assert "FSL-seed5" in shown and f"the studies that chose these values: `fedsl show {out / 'tune'}`" in shown
    from fedsl.report.report import write_report  # the group's report states each study's budget and choice
    report = write_report(out).read_text()
    assert "## Tuning (validation data" in report
    assert "| FSL | 2/2 | " in report and "| FedAvg | 2/2 | " in report, report


def test_show_of_a_tuned_run_still_in_its_studies_shows_the_studies(tmp_path, capsys):
    """`fedsl show OUT` of a `fedsl run --tuned` stopped in its studies (OUT/tune, no group yet) shows the studies
    and how it continues, not "holds no run"."""
    from fedsl.cli import main

    T.start(_cfg(trials=1), tmp_path / "out" / "tune", log=lambda s: None).run()
    capsys.readouterr()
    assert main(["show", str(tmp_path / "out")]) == 0
    shown = capsys.readouterr().out
    assert "`fedsl run --tuned` in its studies" in shown and f"fedsl resume {tmp_path / 'out'}" in shown
    assert "FedAvg" in shown and "1/1" in shown and "validation accuracy" in shown


def test_a_grid_tries_each_point_once_and_refuses_ranges_and_keys_a_run_does_not_read(tmp_path):
    """tune.sampler = 'grid' (the paper's small grids, chosen on validation data): every combination of the lists
    once, every other key at the config's value; a range, more trials than points, or γ for a rule without
    server learning stop in one line."""
    import tomllib
    data = tomllib.loads(TOML)
    data["tune"] = {"sampler": "grid", "trials": 2}
    data["variants"] = {"FSL": {"tune": {"space": {"server.gamma": [0.5, 2.0]}}}}
    T.start(validate(data), tmp_path / "grid", log=lambda s: None).run()
    tried = _values(tmp_path / "grid")["FSL"]
    assert sorted(p["server.gamma"] for _, _, p in tried) == [0.5, 2.0] and all(set(p) == {"server.gamma"}
                                                                                 for _, _, p in tried)
    for tune, variants, expected in [
        ({"sampler": "grid", "trials": 3}, {"FSL": {"tune": {"space": {"server.gamma": [0.5, 2.0]}}}},
         "tune.trials = 3 with tune.sampler = 'grid' (variant FSL): expected at most the grid's 2 combinations"),
        ({"sampler": "grid", "trials": 2}, {"FSL": {"tune": {"space": {"server.gamma": {"low": 0.5, "high": 2}}}}},
         "server.gamma has a range, not a list"),
        ({"trials": 2}, {"FSL": {}, "FedAvg": {"algorithm": {"name": "fedavg"},
                                                "tune": {"space": {"server.gamma": [1, 2]}}}},
         "runs without server learning, so a trial would change nothing"),
    ]:
        data["tune"], data["variants"] = tune, variants
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            T.start(validate(data), tmp_path / "bad", log=lambda s: None)


def test_chosen_values_leave_no_template_key_that_no_run_reads(monkeypatch):
    """A template sets [distill] lr for its FedDF variant; once FedDF's study chose its own, the template's value is
    read by no run (a config refuses that): apply_best drops it, and every variant runs at its own choice."""
    import tomllib
    data = tomllib.loads(TOML)
    data["distill"] = {"lr": 0.0001}
    data["data"]["unlabelled"] = "server"
    data["variants"] = {"FedAvg": {"algorithm": {"name": "fedavg"}}, "FedDF": {"algorithm": {"name": "feddf"}}}
    cfg = validate(data)
    chosen = [{"variant": "FedAvg", "best": 0.5, "params": {"algorithm.local_lr": 0.03}},
              {"variant": "FedDF", "best": 0.4, "params": {"algorithm.local_lr": 0.02, "distill.lr": 0.003}}]
    monkeypatch.setattr(T, "results", lambda study: chosen)
    tuned = T.apply_best(cfg, "study")
    assert tuned.variants["FedDF"]["distill"]["lr"] == 0.003 and tuned.distill.lr != 0.0001
    assert {v: tuned.variants[v]["algorithm"]["local_lr"] for v in tuned.variants} == {"FedAvg": 0.03, "FedDF": 0.02}
    chosen[0]["best"] = None
    with pytest.raises(ConfigError, match="variant 'FedAvg' has no finished trial"):
        T.apply_best(cfg, "study")


def test_the_old_module_name_still_imports_with_a_deprecation_warning():
    """fedsl.experiments.tune moved to fedsl.tune: the old name re-exports it for one release, and says so."""
    import importlib

    sys.modules.pop("fedsl.experiments.tune", None)
    with pytest.warns(DeprecationWarning, match="fedsl.experiments.tune is now fedsl.tune"):
        old = importlib.import_module("fedsl.experiments.tune")
    assert old.start is T.start and old.reopen is T.reopen and old.TUNE_FILE == T.TUNE_FILE
