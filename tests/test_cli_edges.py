"""The command line's rough edges (issue 17): what a newcomer tripped over, each pinned by a test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_cli_uses_no_deprecated_click_api():
    """typer < 0.21 imports click's get_text_stream/get_binary_stream, deprecated in Click 8.5 and
    removed in Click 9: importing the CLI and rendering its help must raise no DeprecationWarning.
    A fresh interpreter, because an earlier import in this process would already have warned."""
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "import fedsl.cli\n"
            "from typer.testing import CliRunner\n"
            "r = CliRunner().invoke(fedsl.cli.app, ['--help'])\n"
            "assert r.exit_code == 0 and 'Usage' in r.output, r.output\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _help_texts(cmd, path=()):
    """(command path, help texts) of every command and group under the click command ``cmd``."""
    import click

    texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
    yield list(path), texts
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _help_texts(sub, (*path, name))
            yield list(path), [sub.help or "", sub.short_help or ""]  # as listed in the group's help


def test_help_keeps_bracketed_words():
    """Help texts are rich markup: an unescaped '[sweep]' or '[ray]' was taken for a style tag and vanished."""
    import re

    import typer
    from typer.testing import CliRunner

    from fedsl.cli import app

    runner = CliRunner()
    checked = 0
    for path, texts in _help_texts(typer.main.get_command(app)):
        words = {w for t in texts for w in re.findall(r"\[(\w+)\]", t.replace("\\[", "["))}
        if words:
            shown = runner.invoke(app, [*path, "--help"], terminal_width=200).output
            for w in words:
                assert f"[{w}]" in shown, (path, w)
                checked += 1
    assert checked >= 3  # [sweep] in `fedsl --help` and `fedsl sweep --help`, [ray] in run/resume


def test_version_prints_the_package_version(capsys):
    import fedsl
    from fedsl.cli import main
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fedsl {fedsl.__version__}"


def test_unknown_key_suggests_the_closest(capsys):
    from fedsl.cli import main

    for wrong, meant in (("algorithm.local_rl", "algorithm.local_lr"), ("gamma", "server.gamma")):
        assert main(["run", "--preset", "quickstart", "--set", f"{wrong}=0.1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"unknown key '{wrong}': did you mean '{meant}'? expected one of" in err[0], err


def test_a_typo_that_leaves_a_key_missing_still_says_did_you_mean(tmp_path, capsys):
    """`round = 1` is an unknown key and leaves `rounds` missing: the line names the typo and its fix, not the
    missing key alone with "(and 1 more)"."""
    from fedsl.cli import main

    config = tmp_path / "typo.toml"
    config.write_text('round = 1\n[data]\ndataset = "synthetic_chars"\n[algorithm]\nname = "fsl"\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown key 'round': did you mean 'rounds'?"), err
    assert err[0].endswith("(and 1 more)"), err


def test_missing_mnist_says_how_on_the_command_line(tmp_path, capsys):
    from fedsl.cli import main

    assert main(["data", "prepare", "mnist", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set data.download=true" in err[0] and "download=True" not in err[0], err


QUICK_GROUP = """
name = "int"
rounds = {rounds}
eval_every = 5
eval_final_window = false
threads = 1
[data]
dataset = "synthetic_chars"
chars = "0123"
train_per_class = 20
test_per_class = 10
num_clients = 4
classes_per_client = 2
server_size = 12
[model]
name = "linear"
[algorithm]
name = "fedavg"
clients_per_round = 2
local_lr = 0.05
batch_size = 10
[variants.FedAvg.algorithm]
name = "fedavg"
[variants.FSL.algorithm]
name = "fsl"
"""


def test_progress_lines_show_the_last_accuracy(tmp_path, capsys):
    """eval_every = 5: the rounds between evaluations show the last accuracy and its round, not 'acc -'."""
    from fedsl.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(QUICK_GROUP.format(rounds=12))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--variants", "FedAvg"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FedAvg: round ")]
    assert len(lines) == 12
    assert all(" acc - " not in ln for ln in lines[4:]), lines  # rounds 1-4: nothing measured yet
    assert " acc " in lines[5] and lines[5].split("  ")[1].endswith("@r5"), lines[5]
    assert lines[11].split("  ")[1].startswith("acc ") and "@r" not in lines[11]  # round 12: measured


def test_interrupt_hint_names_the_group(tmp_path, capsys, monkeypatch):
    """Ctrl-C in a group: the hint resumes the group (all its runs), not the one run it stopped in."""
    from fedsl.cli import main
    from fedsl.engine.simulator import Simulator

    real = Simulator.round

    def round_(self, state, t):
        if t == 2:
            raise KeyboardInterrupt
        return real(self, state, t)

    monkeypatch.setattr(Simulator, "round", round_)
    cfg, out = tmp_path / "c.toml", tmp_path / "int"
    cfg.write_text(QUICK_GROUP.format(rounds=4))
    assert main(["run", str(cfg), "--out", str(out)]) == 130
    printed = capsys.readouterr().out
    hint = [ln for ln in printed.splitlines() if "continue with:" in ln]
    assert hint == [f"FedAvg: interrupted after round 2; continue with: fedsl resume {out}"], printed
    monkeypatch.setattr(Simulator, "round", real)
    assert main(["resume", str(out)]) == 0  # the hint's command finishes every run of the group
    assert "completed" in capsys.readouterr().out


def test_readme_commands_find_fedsl():
    """The README's commands call `fedsl`: its one set-up command must leave it on PATH (or they name
    .venv/bin/fedsl)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    setup = [ln for ln in readme.splitlines() if "-m venv .venv" in ln]
    assert len(setup) == 1, setup
    bare = [ln for ln in readme.splitlines() if ln.startswith("    fedsl ")]  # commands in code blocks
    assert "source .venv/bin/activate" in setup[0] or not bare, (setup[0], bare[:3])


def test_live_progress_bar_shows_the_last_accuracy_too():
    from fedsl.runs.progress import RunProgress
    bar = RunProgress("FSL", 10, 0, lambda s: None, live=True)
    try:
        bar.update(5, 0.91, 1.0)
        bar.update(6, None, 1.0)
        assert bar.bar.tasks[0].fields["acc"] == "0.9100 @r5"
    finally:
        bar.close()


def test_a_run_saved_with_another_algorithms_key_resumes(tmp_path, one_thread):
    """A FedAvg run of a FedProx group, started before such keys were refused, saved μ = 0.1 in its config.json
    (never read): `fedsl resume` continues it (the key dropped, as it never counted), where validation of the same
    config as a new one refuses it."""
    import json

    import pytest
    from conftest import tiny_config

    from fedsl.cli import main
    from fedsl.config import schema as C
    from fedsl.runs.runner import run

    out = tmp_path / "run"
    run(C.validate(tiny_config(rounds=3, alg="fedavg")), out, log=lambda s: None, progress=False, stop_after=1)
    saved = json.loads((out / "config.json").read_text())
    saved["algorithm"]["mu"] = 0.1
    (out / "config.json").write_text(json.dumps(saved))
    with pytest.raises(C.ConfigError, match=r"^algorithm\.mu = 0\.1: read only with algorithm.name = 'fedprox'"):
        C.validate(saved)
    assert main(["resume", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_done"] == 3


def test_set_of_a_key_the_variants_or_the_sweep_replace_is_refused_in_one_line(capsys, tmp_path):
    """Variants apply after --set: `--set algorithm.name=fedavgm` on quickstart (FedAvg and FSL each set the name)
    ran FedAvg and FSL as before without a word. Refused, naming the variants and the variants.NAME. form; with
    --variants, only the variants chosen count; the variants.NAME. form and a key no variant sets run as before."""
    from fedsl.cli import main
    from fedsl.config import loading, presets

    assert main(["run", "--preset", "quickstart", "--set", "algorithm.name=fedavgm", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every variant (FedAvg, FSL) sets algorithm.name itself" in err[0], err
    assert "--set variants.FedAvg.algorithm.name=fedavgm" in err[0], err
    assert not (tmp_path / "a").exists()
    base = presets.load("quickstart")
    base["variants"]["FedAvg"]["algorithm"]["local_lr"] = 0.1
    with pytest.raises(loading.ConfigError, match=r"variant FedAvg sets algorithm\.local_lr itself"):
        loading.load(base=base, overrides=["algorithm.local_lr=0.02"])
    cfg = loading.load(base=base, overrides=["algorithm.local_lr=0.02"], variants=["FSL"])  # FedAvg does not run
    assert cfg.algorithm.local_lr == 0.02
    assert loading.load(base=base, overrides=["algorithm.local_lr=0.1"]).algorithm.local_lr == 0.1  # the same value
    cfg = loading.load(base=base, overrides=["variants.FSL.algorithm.name=fedavgm"])
    assert cfg.variants["FSL"]["algorithm"]["name"] == "fedavgm"
    base["sweep"] = {"server.gamma": [0.5, 1.0]}
    with pytest.raises(loading.ConfigError, match=r"the sweep sets server\.gamma to each of \[0\.5, 1\.0\]"):
        loading.load(base=base, overrides=["server.gamma=2.0"])
    assert loading.load(base=base, overrides=['sweep={"server.gamma" = [2.0]}']).sweep == {"server.gamma": [2.0]}


def test_the_terminal_table_says_what_its_columns_mean_and_what_a_short_runs_final_accuracy_is(tmp_path, capsys):
    """The table after a run names final acc, rise time and T_0.5, as comparison.md does; for a run of at most the
    window's rounds (a short trial), whose "final acc" is the mean over the whole run, it says so."""
    from fedsl.cli import main
    from fedsl.report.tables import legend

    assert legend(20, [100]).startswith("Final accuracy = rolling mean over 20 rounds at the last round; rise time")
    assert "mean over the whole run" not in legend(20, [21, 100])
    assert "In a run of at most 20 rounds the window holds every round" in legend(20, [100, 20])
    out = tmp_path / "out"
    assert main(["run", "--preset", "quickstart", "--quiet", "--out", str(out), "--set", "rounds=2", "--set",
                 "threads=1", "--set", "data.train_per_class=40", "--set", "data.test_per_class=5"]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    assert "Final accuracy = rolling mean over 20 rounds" in shown and "T_0.5 = first round" in shown
    assert "the mean over the whole run" in shown
    assert "the mean over the whole run" in (out / "comparison.md").read_text()


def test_variants_runs_a_subset_whose_runs_do_not_read_a_template_key(tmp_path):
    """A template key that only the variants left out read (FedProx's μ, as serverdata-cifar10's [distill] that only
    its FedDF variants read) does not make ``--variants`` refuse the rest: it goes back to its default in the smaller
    config, which is saved and resumes; the whole config still refuses the key where no run reads it."""
    from fedsl.cli import main
    from fedsl.config.expand import only_variants
    from fedsl.config.loading import load

    text = QUICK_GROUP.format(rounds=2).replace('[algorithm]\n', '[algorithm]\nmu = 0.3\n') + \
        '[variants.FedProx.algorithm]\nname = "fedprox"\n'
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--variants", "FedAvg,FSL", "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.is_dir()) == ["FSL", "FedAvg"]
    whole = load(cfg)
    assert whole.algorithm.mu == 0.3 and only_variants(whole, ["FedAvg"]).algorithm.mu == 0.01  # the default
    assert only_variants(whole, ["FedProx"]).algorithm.mu == 0.3  # a kept run that reads it keeps it
