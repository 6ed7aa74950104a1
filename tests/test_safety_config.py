"""Issue 13, nothing escapes: names stay inside --out, imported models need an opt-in, absurd
numbers stop at validation, and a huge sweep asks before it starts. Every refusal is one line."""

from __future__ import annotations

import copy
import json
import tomllib
import typing
from pathlib import Path
from unittest import mock

import annotated_types as at
import pytest
from conftest import TINY
from pydantic import BaseModel

from fedsl.cli import main
from fedsl.config import presets
from fedsl.config.expand import count_runs, expand_runs
from fedsl.config.schema import NAME_MAX, RUNS_MAX, ConfigError, RunConfig, name_problem, validate
from fedsl.models import build_model
from fedsl.sweeps import compare

TINY_DICT = tomllib.loads(TINY.format(rounds=1, alg="fsl", dtype="float32", executor="auto"))


def tiny(**top) -> dict:
    d = copy.deepcopy(TINY_DICT)
    d.update(top)
    return d


def error_of(data: dict, expand: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        cfg = validate(data)
        if expand:
            expand_runs(cfg)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg and msg, msg
    return msg


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(data))
    return p


def one_line_error(capsys, status: int) -> str:
    out, err = capsys.readouterr()
    assert status == 2, (status, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


class RunStarted(AssertionError):
    pass


# ----------------------------------------------------------------------------- 1. names stay inside --out

BAD_NAMES = ["../../escaped", "..", ".", ".hidden", "/tmp/abs", "a/b", "a\\b", "a\x00b", "", " lead", "-x",
             "a\nb", "x" * (NAME_MAX + 1), "é" * (NAME_MAX // 2 + 1), "a:b", "a*b", "\ud800"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_variant_names_are_refused_with_one_line(name):
    msg = error_of(tiny(variants={name: {}}))
    assert msg.startswith(f"variants.{name!r}: ") and "expected" in msg


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_run_names_are_refused_with_one_line(name):
    msg = error_of(tiny(name=name))
    assert msg.startswith("name = ")


@pytest.mark.parametrize("name", ["FSL", "FSL-p", "DS-S2", "FSL-g0.09375", "my run (v2)", "a+b=c,d", "γ_1",
                                  "_x", "0", "x" * NAME_MAX])
def test_ordinary_names_are_valid(name):
    assert name_problem(name) is None
    assert list(expand_runs(validate(tiny(variants={name: {}})))) == [name]


def test_every_preset_name_and_run_name_is_valid_and_unchanged():
    for preset in presets.names():
        cfg = validate(presets.load(preset))
        assert name_problem(cfg.name) is None, preset
        for v in cfg.variants:
            assert name_problem(v) is None, (preset, v)
        for run in expand_runs(cfg):
            assert name_problem(run) is None and "/" not in run, (preset, run)
    # ordinary swept values keep their names
    runs = expand_runs(validate(tiny(seeds=[0], variants={"FSL": {}},
                                     sweep={"algorithm.local_lr": [0.01, 1e-05], "server.gamma": [1.0, 0.5]})))
    assert list(runs) == ["FSL-local_lr=0.01-gamma=1-seed0", "FSL-local_lr=0.01-gamma=0.5-seed0",
                          "FSL-local_lr=1e-05-gamma=1-seed0", "FSL-local_lr=1e-05-gamma=0.5-seed0"]


def test_swept_strings_are_written_with_safe_characters(tmp_path):
    cfg = validate(tiny(sweep={"data.data_dir": ["../../up", "/abs/path", "a\\b", "plain"]}))
    runs = list(expand_runs(cfg))
    assert runs == ["tiny-data_dir=.._.._up", "tiny-data_dir=_abs_path", "tiny-data_dir=a_b", "tiny-data_dir=plain"]
    for r in runs:
        assert name_problem(r) is None
        assert (tmp_path / r).resolve().parent == tmp_path.resolve()


def test_float_sweep_values_that_print_alike_get_distinct_runs():
    # f"{v:g}" printed both as 0.1: one run silently replaced the other
    runs = expand_runs(validate(tiny(sweep={"server.gamma": [0.1, 0.1000001]})))
    assert list(runs) == ["tiny-gamma=0.1", "tiny-gamma=0.1000001"]
    assert [c.server.gamma for _, c in runs.values()] == [0.1, 0.1000001]


def test_two_runs_of_one_name_are_refused():
    data = tiny(variants={"A": {}, "A-gamma=1": {"server": {"gamma": 1.0}}}, sweep={"server.gamma": [1.0, 2.0]})
    msg = error_of(data, expand=True)
    assert msg.startswith("run name 'A-gamma=1' is given twice") and "expected distinct run names" in msg
    msg = error_of(tiny(sweep={"data.data_dir": ["a/b", "a\\b"]}), expand=True)
    assert "'tiny-data_dir=a_b' is given twice" in msg


def test_too_long_run_name_is_refused():
    data = tiny(sweep={"data.data_dir": ["d" * 190]})
    msg = error_of(data, expand=True)
    assert msg.startswith("sweep point tiny-data_dir=ddd") and f"expected at most {NAME_MAX}" in msg


def test_cli_refuses_an_escaping_variant_before_writing_anything(tmp_path, capsys):
    root = tmp_path / "root"
    out = root / "a" / "b" / "out"
    data = tiny(variants={"../../escaped": {}})
    status = main(["run", str(write(tmp_path, data)), "--out", str(out), "--quiet"])
    line = one_line_error(capsys, status)
    assert "variants.'../../escaped'" in line
    assert not root.exists()


@pytest.mark.parametrize("absolute", [False, True])
def test_cli_refuses_an_escaping_run_name(tmp_path, capsys, absolute):
    name = str(tmp_path / "abs") if absolute else "../../x"
    out = tmp_path / "a" / "out"
    status = main(["run", str(write(tmp_path, tiny(name=name))), "--out", str(out), "--quiet"])
    assert one_line_error(capsys, status).startswith(f"error: name = {name!r}")
    assert files_under(tmp_path) == {"cfg.json"}


def test_run_group_keeps_every_run_folder_inside_out(tmp_path, monkeypatch):
    """Defence in depth: a run name that slipped past validation does not leave the output folder."""
    cfg = validate(tiny())
    monkeypatch.setattr(compare, "expand_runs", lambda c: {"../escaped": ("tiny", cfg)})
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^run '\.\./escaped': folder '\.\./escaped' is outside"):
        compare.run_group(cfg, out, log=lambda s: None)
    assert files_under(tmp_path) == set()


@pytest.mark.parametrize("folder", ["../../evil", "/tmp/evil", "..", ".", "", 3, None])
def test_tampered_group_json_cannot_send_a_resume_outside(tmp_path, capsys, folder):
    group = tmp_path / "g" / "group"
    group.mkdir(parents=True)
    (group / "group.json").write_text(json.dumps({"name": "g", "runs": {"r": {"dir": folder, "variant": "r"}}}))
    with pytest.raises(ConfigError, match=r"run 'r': folder .*expected a folder name inside"):
        compare.group_runs(group)
    line = one_line_error(capsys, main(["resume", str(group), "--quiet"]))
    assert "group.json" in line and "run 'r': folder" in line
    assert files_under(tmp_path) == {"g", "g/group", "g/group/group.json"}


def test_group_runs_reads_ordinary_groups(tmp_path):
    (tmp_path / "group.json").write_text(json.dumps({"runs": {"A-seed0": {"dir": "A-seed0"}}}))
    assert {r: d.path for r, d in compare.group_runs(tmp_path).items()} == {"A-seed0": tmp_path / "A-seed0"}


# ----------------------------------------------------------------------------- 2. imported models are code

@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "fedsl_safety_models.py").write_text(
        "from torch import nn\n"
        "def good(num_classes, input_shape):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], "
        "num_classes))\n"
        "def not_a_module(num_classes, input_shape):\n"
        "    return 3\n"
        "def boom(num_classes, input_shape):\n"
        "    raise RuntimeError('the factory broke')\n"
        "constant = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fedsl_safety_models"


def test_import_path_needs_the_environment_opt_in(monkeypatch, user_models):
    monkeypatch.delenv("FEDSL_ALLOW_IMPORT", raising=False)
    msg = error_of(tiny(model={"name": f"{user_models}:good"}))
    assert msg.startswith(f"model.name = '{user_models}:good' imports and runs Python code")
    assert "FEDSL_ALLOW_IMPORT=1" in msg
    with pytest.raises(ValueError, match="FEDSL_ALLOW_IMPORT=1"):  # also where models are built
        build_model(f"{user_models}:good", 3, (1, 2, 2), seed=0)
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    assert validate(tiny(model={"name": f"{user_models}:good"})).model.name == f"{user_models}:good"
    model = build_model(f"{user_models}:good", 3, (1, 2, 2), seed=0)
    assert model(__import__("torch").zeros(1, 1, 2, 2)).shape == (1, 3)


@pytest.mark.parametrize("path", ["os:system", "os.path:join", "subprocess:run", "builtins:eval", "sys:exit",
                                  "shutil:rmtree", "importlib:import_module", "pty:spawn", "socket:socket",
                                  "_posixsubprocess:fork_exec"])
@pytest.mark.parametrize("allowed", [False, True])
def test_denied_modules_are_never_imported(monkeypatch, path, allowed):
    if allowed:
        monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    else:
        monkeypatch.delenv("FEDSL_ALLOW_IMPORT", raising=False)
    with mock.patch("os.system", side_effect=AssertionError("os.system was called")):
        msg = error_of(tiny(model={"name": path}))
        assert msg.startswith(f"model.name = {path!r}: module ") and "never imported" in msg
        with pytest.raises(ValueError, match="never imported"):
            build_model(path, 3, (1, 2, 2), seed=0)


def test_cli_os_system_is_one_line_and_never_called(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    with mock.patch("os.system", side_effect=AssertionError("os.system was called")):
        status = main(["run", str(write(tmp_path, tiny(model={"name": "os:system"}))), "--out", str(tmp_path / "o"),
                       "--quiet"])
    assert "never imported" in one_line_error(capsys, status)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("attr, token", [("not_a_module", "returned int: expected a torch.nn.Module"),
                                         ("boom", "the factory failed (RuntimeError: the factory broke)"),
                                         ("constant", "is a int, not callable"),
                                         ("missing", "cannot import it")])
def test_permitted_import_that_is_no_model_factory_is_one_line(tmp_path, capsys, monkeypatch, user_models,
                                                               attr, token):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    status = main(["run", str(write(tmp_path, tiny(model={"name": f"{user_models}:{attr}"}))),
                   "--out", str(tmp_path / "o"), "--quiet"])
    line = one_line_error(capsys, status)
    assert line.startswith(f"error: model.name = '{user_models}:{attr}'") and token in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("path", ["json:dumps", "math:floor", "operator:add"])
def test_permitted_import_with_another_signature_is_not_called(tmp_path, capsys, monkeypatch, path):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")
    status = main(["run", str(write(tmp_path, tiny(model={"name": path}))), "--out", str(tmp_path / "o"), "--quiet"])
    line = one_line_error(capsys, status)
    assert line.startswith(f"error: model.name = {path!r}") and "num_classes" in line and "torch.nn.Module" in line


# ----------------------------------------------------------------------------- 3. bounds

TOO_BIG = [
    ("rounds", 10**23), ("rounds", 10**7 + 1), ("seed", 2**64), ("seed", 2**63), ("eval_every", 10**8),
    ("eval_batch_size", 10**9), ("rolling_window", 10**8), ("checkpoint_every", 10**8), ("diag_every", 10**8),
    ("threads", 10**6), ("data.num_clients", 10**9), ("data.classes_per_client", 10**6),
    ("data.samples_per_client", 10**9), ("data.shards_per_client", 10**6), ("data.server_size", 10**9),
    ("data.server_clients", 10**9), ("data.server_samples_per_client", 10**9), ("data.server_per_class", 10**9),
    ("data.train_per_class", 2_000_000_000), ("data.test_per_class", 2_000_000_000),
    ("algorithm.clients_per_round", 10**9), ("algorithm.batch_size", 10**9), ("algorithm.local_epochs", 10**9),
    ("algorithm.local_steps", 10**9), ("server.gamma_every", 10**8), ("server.batch_size", 10**9),
    ("server.epochs", 10**9), ("server.steps", 10**9), ("server.pretrain_epochs", 10**9),
    ("server.pretrain_batch_size", 10**9), ("server.finetune_epochs", 10**9),
]


def _set(data: dict, key: str, value) -> dict:
    node = data
    for part in key.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[key.split(".")[-1]] = value
    return data


@pytest.mark.parametrize("key, value", TOO_BIG)
def test_absurd_numbers_are_refused_naming_the_key(key, value):
    msg = error_of(_set(tiny(), key, value))
    assert msg.startswith(f"{key} = {value}"), msg


def test_stack_and_seeds_have_bounds_too():
    assert error_of(tiny(stack=10**6)).startswith(
        "stack = 1000000: expected 'auto' or an integer >= 1 (1 = no stacking), at most 1024")
    msg = error_of(tiny(seeds=[0, 2**64]))
    assert msg.startswith("seeds = [0, 18446744073709551616]: 18446744073709551616 is out of range") and "2**63" in msg


def test_bounds_themselves_are_accepted():
    cfg = validate(tiny(rounds=10**7, seed=2**63 - 1, seeds=[0, 2**63 - 1]))
    assert (cfg.rounds, cfg.seed) == (10**7, 2**63 - 1)
    assert validate(_set(tiny(), "data.train_per_class", 10**5)).data.train_per_class == 10**5


def test_rounds_must_be_an_integer():
    assert error_of(tiny(rounds=1e23)).startswith("rounds = 1e+23: Input should be a valid integer")


def test_synthetic_chars_total_is_bounded():
    msg = error_of(_set(_set(tiny(), "data.train_per_class", 300_000), "data.test_per_class", 10))
    assert msg.startswith("data.train_per_class = 300000, data.test_per_class = 10: 4 classes × 300010 = 1200040 "
                          "images to render; expected at most 1000000")


def test_every_integer_field_has_an_upper_bound():
    """A new integer key without a bound would let absurd values through again."""
    def fields(model: type[BaseModel], prefix: str = ""):
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                yield from fields(ann, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", f
    unbounded = []
    for key, f in fields(RunConfig):
        args = set(typing.get_args(f.annotation)) | {f.annotation}
        if int in args and key not in ("stack", "seeds", "tune.stack"):  # bounded in their validators
            if not any(isinstance(m, (at.Le, at.Lt)) for m in f.metadata):
                unbounded.append(key)
    assert unbounded == []


@pytest.mark.parametrize("extra, token", [(["--set", "seed=18446744073709551616"], "seed = 18446744073709551616"),
                                          (["--set", "data.train_per_class=2000000000"], "data.train_per_class"),
                                          (["--set", "rounds=100000000000000000000000"], "rounds = ")])
def test_cli_bounds_are_one_line(tmp_path, capsys, extra, token):
    status = main(["run", str(write(tmp_path, tiny())), "--out", str(tmp_path / "o"), "--quiet", *extra])
    assert token in one_line_error(capsys, status)


def test_too_many_runs_are_refused_before_expanding():
    data = tiny(sweep={"server.gamma": [0.1 * i for i in range(1, 1001)],
                       "algorithm.local_lr": [0.001 * i for i in range(1, 102)]})
    cfg = validate(data)
    assert count_runs(cfg) == 101_000 > RUNS_MAX
    with mock.patch("fedsl.config.schema.validate", side_effect=AssertionError("expanded")):
        with pytest.raises(ConfigError, match=r"^sweep: 101000 runs .*expected at most 100000"):
            expand_runs(cfg)


def test_count_runs_matches_expand_runs():
    data = tiny(seeds=[0, 1], sweep={"server.gamma": [0.5, 1.0, 1.5]},
                variants={"FSL": {}, "DS": {"algorithm": {"name": "ds"}, "server": {"gamma": 0.0}}})
    cfg = validate(data)
    assert count_runs(cfg) == len(expand_runs(cfg)) == 3 * 2 + 1 * 2


# ----------------------------------------------------------------------------- 4. big sweeps ask first

def big_sweep(n: int) -> dict:
    return tiny(sweep={"server.gamma": [round(0.001 * i, 3) for i in range(1, n + 1)]})


def test_big_sweep_needs_yes(tmp_path, capsys):
    with mock.patch("fedsl.runs.build.check", side_effect=AssertionError("checks started")), \
            mock.patch("fedsl.sweeps.compare.run_group", side_effect=RunStarted("a run started")):
        status = main(["run", str(write(tmp_path, big_sweep(501))), "--out", str(tmp_path / "o")])
    line = one_line_error(capsys, status)
    assert line.startswith("error: the config makes 501 runs") and "--yes" in line
    assert not (tmp_path / "o").exists()


def test_big_sweep_with_yes_says_how_many_it_checks(tmp_path, capsys):
    checked = []
    with mock.patch("fedsl.runs.build.check", side_effect=lambda cfg, *a, **k: checked.append(cfg)), \
            mock.patch("fedsl.sweeps.compare.run_group", side_effect=RunStarted("a run started")):
        with pytest.raises(RunStarted):
            main(["run", str(write(tmp_path, big_sweep(501))), "--out", str(tmp_path / "o"), "--yes"])
    assert len(checked) == 501
    assert capsys.readouterr().out.startswith("checking 501 runs...")


def test_small_sweep_needs_no_yes(tmp_path, capsys):
    checked = []
    with mock.patch("fedsl.runs.build.check", side_effect=lambda cfg, *a, **k: checked.append(cfg)), \
            mock.patch("fedsl.sweeps.compare.run_group", side_effect=RunStarted("a run started")):
        with pytest.raises(RunStarted):
            main(["run", str(write(tmp_path, big_sweep(500))), "--out", str(tmp_path / "o")])
    assert len(checked) == 500 and capsys.readouterr().out.startswith("checking 500 runs...")
