"""Run configuration: validation, defaults, --set overrides, variants and one-line errors."""

from __future__ import annotations

import copy
import math

import pytest

from fedsl.config import presets
from fedsl.config.expand import count_runs, expand_runs, expand_variants
from fedsl.config.loading import apply_overrides, load, read_file
from fedsl.config.schema import ConfigError, RunConfig, validate

MINIMAL = {"rounds": 3, "data": {"dataset": "synthetic_chars"}, "algorithm": {"name": "fedavg"}}


def minimal(**top) -> dict:
    d = copy.deepcopy(MINIMAL)
    d.update(top)
    return d


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        validate(data)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg and msg, msg
    return msg


# ----------------------------------------------------------------------------- valid configs

def test_minimal_config_validates_with_documented_defaults():
    cfg = validate(copy.deepcopy(MINIMAL))
    assert isinstance(cfg, RunConfig)
    assert cfg.rounds == 3
    # top level
    assert (cfg.name, cfg.seed, cfg.eval_every, cfg.eval_batch_size) == ("run", 0, 1, 100)
    assert (cfg.rolling_window, cfg.checkpoint_every) == (20, 10)
    assert (cfg.device, cfg.dtype, cfg.executor, cfg.description) == ("auto", "float32", "auto", "")
    assert cfg.variants == {}
    # data
    d = cfg.data
    assert d.dataset == "synthetic_chars" and d.data_dir is None
    assert (d.num_clients, d.partition, d.classes_per_client) == (20, "classes", 2)
    assert d.samples_per_client is None
    assert (d.server_size, d.server_overlap) == (0, True)
    assert (d.chars, d.train_per_class, d.test_per_class) == ("0123456789", 200, 100)
    # model
    assert cfg.model.name == "small_cnn"
    # algorithm
    a = cfg.algorithm
    assert (a.name, a.clients_per_round, a.local_lr, a.batch_size, a.local_epochs) == ("fedavg", 5, 0.01, 50, 1)
    assert a.local_steps is None and a.global_lr is None and a.weighted is False
    # server: gamma = 1 (paper); the rest follow the paper's rules once the data are known
    s = cfg.server
    assert s.gamma == 1.0
    assert (s.lr, s.batch_size, s.epochs, s.steps, s.weight) == (None, None, None, None, None)
    assert (s.pretrain, s.pretrain_epochs, s.pretrain_lr, s.pretrain_batch_size) == (False, 500, 0.01, None)


def test_defaults_are_independent_between_configs():
    a = validate(copy.deepcopy(MINIMAL))
    b = validate(minimal(algorithm={"name": "fsl"}, data={"dataset": "synthetic_chars", "server_size": 20},
                         server={"gamma": 0.5}))
    assert a.server.gamma == 1.0 and b.server.gamma == 0.5


@pytest.mark.parametrize("key,value", [("gamma", 0.5), ("steps", 7), ("lr", 0.1), ("gamma_schedule", "cosine"),
                                       ("batch_size", 8), ("epochs", 2)])
def test_a_server_learning_key_without_server_learning_is_refused(key, value):
    """FedAvg reads none of server learning's keys: set, each would change nothing (a sweep of one would run one run
    many times). With server.learning adding server learning to FedAvg they are read; w0 only in FSL-p's parallel
    mode; γ = 0 is what a run without server learning has (DS at γ = 0 in the paper's Fig. 3), so it may say so."""
    problem = error_of(minimal(server={key: value}))
    assert problem.startswith(f"server.{key} = {value!r}: read only with server learning (algorithm.name = 'fsl', "
                              "'fsl_p', ") and problem.endswith("or server.learning = 'incremental' or 'parallel'), "
                                                                "not server learning 'off': expected it unset"), problem
    d0 = {"dataset": "synthetic_chars", "server_size": 20}
    assert getattr(validate(minimal(data=d0, server={"learning": "incremental", key: value})).server, key) == value
    assert validate(minimal(server={"gamma": 0.0})).server.gamma == 0.0
    assert error_of(minimal(algorithm={"name": "fsl"}, data=d0, server={"weight": 0.3})).startswith(
        "server.weight = 0.3: read only with server learning (algorithm.name = 'fsl_p', or server.learning = "
        "'parallel'), not server learning 'incremental'")


def test_a_sweep_over_gamma_runs_fedavg_once_and_a_fedavg_only_sweep_over_it_is_refused():
    """γ is read by the runs that learn on the server: a sweep over it runs FSL at each value and FedAvg once (its
    runs could not differ); a sweep over γ that only FedAvg variants would run is refused, as is a γ template key that
    only they would inherit (a FedAvg variant of an FSL template runs without it)."""
    d0 = {"dataset": "synthetic_chars", "server_size": 20}
    runs = expand_variants(validate(minimal(data=d0, sweep={"server.gamma": [0.5, 2.0]}, algorithm={"name": "fsl"},
                                            variants={"FSL": {}, "FedAvg": {"algorithm": {"name": "fedavg"}}})))
    assert sorted(runs) == ["FSL-gamma=0.5", "FSL-gamma=2", "FedAvg"]
    assert runs["FedAvg"].server.gamma == 1.0
    with pytest.raises(ConfigError, match=r"^sweep over server\.gamma: read by no variant"):
        expand_variants(validate(minimal(sweep={"server.gamma": [0.5, 2.0]})))
    runs = expand_variants(validate(minimal(data=d0, algorithm={"name": "fsl"}, server={"gamma": 0.5, "steps": 3},
                                            variants={"FSL": {}, "FedAvg": {"algorithm": {"name": "fedavg"}}})))
    assert (runs["FSL"].server.gamma, runs["FSL"].server.steps) == (0.5, 3)
    assert (runs["FedAvg"].server.gamma, runs["FedAvg"].server.steps) == (1.0, None)


def test_quickstart_preset_validates_and_its_variants_expand():
    data = presets.load("quickstart")
    cfg = validate(data)
    assert cfg.name == "quickstart"
    runs = expand_variants(cfg)
    assert list(runs) == ["FedAvg", "FSL"]
    assert runs["FedAvg"].algorithm.name == "fedavg" and runs["FSL"].algorithm.name == "fsl"
    for vname, vcfg in runs.items():
        assert isinstance(vcfg, RunConfig)
        assert vcfg.name == vname
        assert vcfg.variants == {}
        # the base settings are carried into each variant
        assert vcfg.data == cfg.data and vcfg.rounds == cfg.rounds
        assert vcfg.algorithm.local_lr == cfg.algorithm.local_lr


def test_a_variant_that_sets_a_swept_key_is_pinned_at_its_value():
    """Fig. 3: DS sits at γ = 0 and runs once per η_l, while FSL runs the whole γ × η_l grid."""
    cfg = validate(minimal(data={"dataset": "synthetic_chars", "server_size": 20}, algorithm={"name": "fsl"},
                           sweep={"server.gamma": [0.5, 1.0], "algorithm.local_lr": [0.01, 0.02]},
                           variants={"DS": {"algorithm": {"name": "ds"}, "server": {"gamma": 0.0}},
                                     "FSL": {"algorithm": {"name": "fsl"}}}))
    runs = expand_runs(cfg)
    assert sorted(r for r, (v, _) in runs.items() if v == "DS") == ["DS-local_lr=0.01", "DS-local_lr=0.02"]
    assert all(c.server.gamma == 0.0 for v, c in runs.values() if v == "DS")
    fsl = {r: c for r, (v, c) in runs.items() if v == "FSL"}
    assert len(fsl) == 4 and fsl["FSL-gamma=1-local_lr=0.02"].server.gamma == 1.0
    assert fsl["FSL-gamma=1-local_lr=0.02"].algorithm.local_lr == 0.02
    assert list(expand_variants(cfg)) == list(runs)
    fig3 = expand_runs(validate(presets.load("fig3-cifar10")))
    assert sum(v == "DS-S4" for v, _ in fig3.values()) == 3 * 2 * 3  # 3 η_l × 2 n0 × 3 seeds, not × 4 γ
    assert sum(v == "FSL-S4" for v, _ in fig3.values()) == 4 * 3 * 2 * 3



def test_a_variant_that_sets_a_swept_key_to_a_list_runs_at_those_of_the_sweeps_points():
    """Label flipping at f = 0 is sign flipping at f = 0 (nobody attacks): the label-flipping variant runs only at
    f > 0, in the sweep's order, its runs counted as made; a list that selects no point is one line."""
    sweep = {"attack.fraction": [0.0, 0.1, 0.4], "algorithm.local_lr": [0.01, 0.02]}
    variants = {"sign": {"attack": {"kind": "sign_flip"}},
                "label": {"attack": {"kind": "label_flip", "fraction": [0.4, 0.1]}}}
    cfg = validate(minimal(data={"dataset": "synthetic_chars", "server_size": 20}, sweep=sweep, variants=variants,
                           seeds=[0, 1]))
    runs = expand_runs(cfg)
    label = [r for r, (v, _) in runs.items() if v == "label"]
    assert label == [f"label-fraction={f}-local_lr={lr}-seed{s}" for f in (0.1, 0.4) for lr in (0.01, 0.02)
                     for s in (0, 1)]
    assert [runs[r][1].attack.fraction for r in label] == [0.1] * 4 + [0.4] * 4
    assert sum(v == "sign" for v, _ in runs.values()) == 3 * 2 * 2
    assert count_runs(cfg) == len(runs) == 12 + 8
    variants["label"]["attack"]["fraction"] = [0.2, 0.3]
    with pytest.raises(ConfigError, match=r"variants.label: attack.fraction = \[0.2, 0.3\] selects none of the "
                                          r"sweep's values \[0.0, 0.1, 0.4\]"):
        expand_runs(validate(minimal(data={"dataset": "synthetic_chars", "server_size": 20}, sweep=sweep,
                                     variants=variants)))
    robustness = validate(presets.load("robustness-emnist"))
    assert count_runs(robustness) == len(expand_runs(robustness)) == 9 * 4 * 2 + 7 * 3 * 2  # 98 + bucketing 16

def test_presets_all_validate():
    for name in presets.names():
        expand_variants(validate(presets.load(name)))


def test_unknown_preset_names_the_available_ones():
    with pytest.raises(ConfigError, match="quickstart"):
        presets.load("no-such-preset")


def test_config_without_variants_expands_to_itself():
    cfg = validate(minimal(name="solo"))
    assert expand_variants(cfg) == {"solo": cfg}


def test_load_reads_toml_file_and_applies_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('rounds = 4\n[data]\ndataset = "synthetic_chars"\nserver_size = 10\n'
                 '[algorithm]\nname = "fsl"\n', encoding="utf-8")
    cfg = load(p, ["server.gamma=0.25", "algorithm.weighted=true"])
    assert cfg.rounds == 4 and cfg.algorithm.name == "fsl" and cfg.data.server_size == 10
    assert cfg.server.gamma == 0.25 and cfg.algorithm.weighted is True


def test_load_from_base_dict_does_not_mutate_it():
    base = presets.load("quickstart")
    snapshot = copy.deepcopy(base)
    cfg = load(None, ["rounds=2", "data.num_clients=10"], base=base)
    assert cfg.rounds == 2 and cfg.data.num_clients == 10
    assert base == snapshot


def test_json_config_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"rounds": 2, "data": {"dataset": "synthetic_chars"}, "algorithm": {"name": "fedavg"}}')
    assert load(p).rounds == 2


# ----------------------------------------------------------------------------- --set overrides

@pytest.mark.parametrize("item, key, expected", [
    ("rounds=7", ("rounds",), 7),
    ("server.gamma=0.5", ("server", "gamma"), 0.5),
    ("algorithm.local_lr=1e-3", ("algorithm", "local_lr"), 1e-3),
    ("algorithm.weighted=true", ("algorithm", "weighted"), True),
    ("data.server_overlap=false", ("data", "server_overlap"), False),
    ('name="my run"', ("name",), "my run"),
    ("name='single'", ("name",), "single"),
    ("algorithm.name=fsl", ("algorithm", "name"), "fsl"),            # bare word -> string
    ("data.chars=abc", ("data", "chars"), "abc"),
    ("data.chars=0123", ("data", "chars"), "0123"),                  # leading zero: not TOML -> string
    ("description=two words", ("description",), "two words"),
    ("description=", ("description",), ""),                          # empty value -> empty string
    ("  rounds  =  9  ", ("rounds",), 9),                            # spaces around key and value
    ("data.dataset=synthetic_chars", ("data", "dataset"), "synthetic_chars"),
    ("new.deep.key=[1, 2]", ("new", "deep", "key"), [1, 2]),         # creates tables on the way
    ("server.lr=-3", ("server", "lr"), -3),
    ("x=a=b", ("x",), "a=b"),                                         # split on the first '='
])
def test_set_parses_toml_values_with_dotted_keys(item, key, expected):
    base = copy.deepcopy(MINIMAL)
    out = apply_overrides(base, [item])
    node = out
    for part in key:
        node = node[part]
    assert node == expected and type(node) is type(expected)
    assert base == MINIMAL  # the input is not modified


def test_set_overrides_apply_in_order_and_keep_siblings():
    out = apply_overrides(presets.load("quickstart"), ["rounds=1", "rounds=2", "data.num_clients=8"])
    assert out["rounds"] == 2 and out["data"]["num_clients"] == 8
    assert out["data"]["dataset"] == "synthetic_chars" and out["data"]["server_size"] == 100


def test_set_values_are_validated():
    with pytest.raises(ConfigError, match=r"server\.gamma = -1"):
        load(None, ["server.gamma=-1"], base=copy.deepcopy(MINIMAL))
    with pytest.raises(ConfigError, match="rounds = 'many'"):
        load(None, ["rounds=many"], base=copy.deepcopy(MINIMAL))


@pytest.mark.parametrize("item, fragment", [
    ("rounds", "expected key=value"),
    ("=3", "expected a dotted key"),
    ("  =3", "expected a dotted key"),
    ("server..gamma=1", "expected a dotted key"),
    (".gamma=1", "expected a dotted key"),
    ("server.=1", "expected a dotted key"),
    ("rounds.x=1", "'rounds' is not a table"),
])
def test_malformed_set_arguments(item, fragment):
    with pytest.raises(ConfigError) as info:
        apply_overrides(copy.deepcopy(MINIMAL), [item])
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg


def test_set_unknown_dotted_key_is_reported_by_validation():
    with pytest.raises(ConfigError, match=r"unknown key 'server\.gama'"):
        load(None, ["server.gama=0.5"], base=copy.deepcopy(MINIMAL))


# ----------------------------------------------------------------------------- one-line errors

def test_unknown_top_level_key_names_it_and_lists_allowed_keys():
    msg = error_of(minimal(roundz=3))
    assert msg.startswith("unknown key 'roundz'")
    for allowed in ("name", "seed", "rounds", "data", "model", "algorithm", "server", "variants"):
        assert allowed in msg


def test_unknown_section_key_names_the_dotted_key_and_the_section_fields():
    d = minimal()
    d["algorithm"]["lr"] = 0.1
    msg = error_of(d)
    assert msg.startswith("unknown key 'algorithm.lr'")
    assert "expected one of" in msg
    for allowed in ("name", "clients_per_round", "local_lr", "batch_size", "local_epochs", "local_steps",
                    "global_lr", "weighted"):
        assert allowed in msg
    assert "gamma" not in msg  # only the section's own fields


def test_several_errors_are_counted_on_one_line():
    d = minimal(roundz=3, seedz=1)
    assert "(and 1 more)" in error_of(d)


def test_missing_rounds():
    d = minimal()
    del d["rounds"]
    msg = error_of(d)
    assert msg.startswith("missing key 'rounds'")
    assert "number of rounds" in msg


@pytest.mark.parametrize("section, key", [("data", "dataset"), ("algorithm", "name")])
def test_missing_required_section_key(section, key):
    d = minimal()
    del d[section][key]
    assert error_of(d).startswith(f"missing key '{section}.{key}'")


@pytest.mark.parametrize("section", ["data", "algorithm"])
def test_missing_required_section(section):
    d = minimal()
    del d[section]
    with pytest.raises(ConfigError) as info:
        validate(d)
    msg = str(info.value)
    assert msg.startswith(f"missing key '{section}'") and "\n" not in msg


def test_clients_per_round_above_num_clients_names_both_keys_and_values():
    d = minimal()
    d["data"]["num_clients"] = 4
    d["algorithm"]["clients_per_round"] = 7
    msg = error_of(d)
    assert "algorithm.clients_per_round" in msg and "7" in msg
    assert "data.num_clients" in msg and "4" in msg
    assert "expected at most" in msg


def test_clients_per_round_equal_to_num_clients_is_fine():
    d = minimal()
    d["data"]["num_clients"] = 5
    d["algorithm"]["clients_per_round"] = 5
    validate(d)


def test_negative_gamma():
    msg = error_of(minimal(server={"gamma": -1}))
    assert "server.gamma" in msg and "-1" in msg
    assert "greater than or equal to 0" in msg


def test_zero_gamma_is_allowed():
    assert validate(minimal(server={"gamma": 0})).server.gamma == 0


@pytest.mark.parametrize("section, key, value, expected", [
    (None, "rounds", 0, "greater than or equal to 1"),
    (None, "seed", -1, "greater than or equal to 0"),
    (None, "rounds", "ten", "valid integer"),
    (None, "rounds", 2.5, "valid integer"),
    (None, "rounds", [1], "valid integer"),
    (None, "name", "", "at least 1 character"),
    (None, "device", "tpu", "'auto', 'cpu' or 'cuda'"),
    ("algorithm", "local_lr", 0, "greater than 0"),
    ("algorithm", "local_lr", -0.1, "greater than 0"),
    ("algorithm", "batch_size", 0, "greater than or equal to 1"),
    ("algorithm", "name", "fedfoo", "'fednova', 'moon'"),
    ("algorithm", "weighted", [True], "valid boolean"),
    ("data", "num_clients", -3, "greater than or equal to 1"),
    ("data", "dataset", "svhn", "'synthetic_chars'"),
    ("data", "chars", "x", "at least 2 characters"),
    ("server", "weight", 1.0, "less than 1"),
    ("server", "weight", 0.0, "greater than 0"),
    ("server", "steps", -1, "greater than or equal to 0"),
])
def test_bad_value_names_key_value_and_expectation(section, key, value, expected):
    d = minimal()
    (d.setdefault(section, {}) if section else d)[key] = value
    msg = error_of(d)
    dotted = f"{section}.{key}" if section else key
    assert msg.startswith(f"{dotted} = {value!r}:"), msg
    assert expected in msg, msg


def test_bad_value_message_includes_field_description():
    assert "(T, number of rounds, at most 10^7)" in error_of(minimal(rounds=0))


def test_section_of_wrong_type():
    msg = error_of(minimal(data=5))
    assert msg.startswith("data = 5:")


def test_top_level_not_a_table():
    with pytest.raises(ConfigError, match="expected a table of keys, got list"):
        validate([1, 2])


def test_repeated_chars():
    d = minimal()
    d["data"]["chars"] = "0012"
    assert "data.chars = '0012'" in error_of(d)


def test_classes_per_client_above_number_of_chars():
    d = minimal()
    d["data"].update(chars="abc", classes_per_client=4)
    msg = error_of(d)
    assert "data.classes_per_client = 4" in msg and "data.chars" in msg


@pytest.mark.parametrize("algo", ["fsl", "fsl_p", "ds"])
def test_server_algorithms_need_server_data(algo):
    d = minimal()
    d["algorithm"]["name"] = algo
    msg = error_of(d)
    assert f"algorithm.name = {algo!r}" in msg and "data.server_size > 0" in msg
    d["data"]["server_size"] = 10
    validate(d)


def test_pretrain_needs_server_data():
    msg = error_of(minimal(server={"pretrain": True}))
    assert "server.pretrain" in msg and "data.server_size > 0" in msg


# ----------------------------------------------------------------------------- files

def test_broken_toml_names_the_file(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text('rounds = 3\n[data\ndataset = "synthetic_chars"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_file(p)
    msg = str(info.value)
    assert str(p) in msg and "not valid TOML" in msg and "line 2" in msg
    assert "\n" not in msg


def test_broken_json_names_the_file(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{"rounds": 3,', encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON") as info:
        read_file(p)
    assert str(p) in str(info.value)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist"):
        load(p)


def test_undecodable_file_names_the_file(tmp_path):
    p = tmp_path / "bin.toml"
    p.write_bytes(b"rounds = \xff\xfe\n")
    with pytest.raises(ConfigError) as info:
        read_file(p)
    assert str(p) in str(info.value) and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- variants

def test_variants_expand_and_each_is_validated():
    d = minimal(data={"dataset": "synthetic_chars", "server_size": 20, "num_clients": 10},
                variants={"a": {"algorithm": {"name": "fsl"}, "server": {"gamma": 0.5}},
                          "b": {"rounds": 9, "data": {"num_clients": 6}}})
    runs = expand_variants(validate(d))
    assert list(runs) == ["a", "b"]
    a, b = runs["a"], runs["b"]
    assert a.name == "a" and a.algorithm.name == "fsl" and a.server.gamma == 0.5 and a.rounds == 3
    assert b.name == "b" and b.algorithm.name == "fedavg" and b.rounds == 9
    # deep merge: a variant overrides a key of a section and keeps the others
    assert b.data.num_clients == 6 and b.data.server_size == 20
    assert a.data.num_clients == 10


def test_bad_variant_message_starts_with_its_name():
    d = minimal(variants={"good": {"rounds": 5}, "bad": {"server": {"gamma": -1}}})
    cfg = validate(d)  # variants are free-form tables until expanded
    with pytest.raises(ConfigError) as info:
        expand_variants(cfg)
    msg = str(info.value)
    assert msg.startswith("variants.bad: ") and "server.gamma = -1" in msg
    assert "\n" not in msg


def test_variant_with_unknown_key():
    cfg = validate(minimal(variants={"v": {"algorithm": {"gamma": 0.5}}}))
    with pytest.raises(ConfigError, match=r"^variants\.v: unknown key 'algorithm\.gamma'"):
        expand_variants(cfg)


def test_variant_breaking_a_cross_check():
    cfg = validate(minimal(variants={"small": {"data": {"num_clients": 2}}}))
    with pytest.raises(ConfigError, match=r"^variants\.small: algorithm\.clients_per_round = 5.*data\.num_clients = 2"):
        expand_variants(cfg)


@pytest.mark.parametrize("algorithm, key, readers", [("fedavg", "mu", "'fedprox'"), ("scaffold", "alpha", "'feddyn'"),
                                                     ("fedavgm", "tau", "'fedadam' or 'fedyogi' or 'fedadagrad'")])
def test_a_hyper_parameter_of_another_algorithm_is_refused(algorithm, key, readers):
    """algorithm.mu with FedAvg would change nothing (a sweep of μ would run one config many times): one line
    naming the algorithms that read it. The specs decide (their hyper-parameters), not a list of names here."""
    with pytest.raises(ConfigError, match=rf"^algorithm.{key} = 0.5: read only with algorithm.name = {readers}, "
                                          rf"not '{algorithm}': expected it unset$"):
        validate(minimal(algorithm={"name": algorithm, key: 0.5}))
    saved = validate(minimal(algorithm={"name": algorithm})).model_dump(mode="json")  # every key, at its default
    assert key in saved["algorithm"] and validate(saved).algorithm.name == algorithm


@pytest.mark.parametrize("section, table, key, readers", [
    ("attack", {"kind": "sign_flip", "fraction": 0.2, "noise_std": 2.0}, "noise_std", "attack.kind = 'gaussian'"),
    ("attack", {"kind": "gaussian", "fraction": 0.2, "constant": 3.0}, "constant", "attack.kind = 'constant'"),
    ("attack", {"kind": "none", "fraction": 0.2}, "fraction", "attack.kind = 'sign_flip' or 'scale' or"),
    ("robust", {"aggregator": "median", "trim": 0.2}, "trim", "robust.aggregator = 'trimmed_mean'"),
    ("robust", {"aggregator": "krum", "trust_lr": 0.1}, "trust_lr", "robust.aggregator = 'fltrust'"),
    ("robust", {"aggregator": "mean", "krum_f": 1}, "krum_f", "robust.aggregator = 'krum' or 'multi_krum' or 'bulyan'"),
])
def test_a_key_of_another_attack_or_robust_rule_is_refused(section, table, key, readers):
    """attack.noise_std with sign flipping, robust.trim with the median: one line, as for algorithms and datasets
    (their modules' READS decide), and a variant that switches the rule leaves the other rule's keys behind."""
    with pytest.raises(ConfigError, match=rf"^{section}\.{key} = {table[key]!r}: read only with {readers}"):
        validate(minimal(**{section: table}))
    runs = expand_variants(validate(minimal(robust={"aggregator": "trimmed_mean", "trim": 0.2},
                                            variants={"trimmed": {}, "median": {"robust": {"aggregator": "median"}}})))
    assert (runs["trimmed"].robust.trim, runs["median"].robust.trim) == (0.2, 0.1)


def test_a_variant_that_switches_algorithm_or_dataset_leaves_the_others_keys_behind():
    """A FedAvg variant of a FedProx config does not carry μ, nor a CIFAR-10 variant of an EMNIST one its split;
    a key the variant (or the sweep) sets itself stays, and is refused where its algorithm does not read it."""
    d = minimal(algorithm={"name": "fedprox", "mu": 0.1},
                data={"dataset": "emnist", "emnist_split": "digits", "carve": True, "train_per_class": 30},
                variants={"FedProx": {}, "FedAvg": {"algorithm": {"name": "fedavg"}},
                          "CIFAR": {"data": {"dataset": "cifar10"}}})
    runs = expand_variants(validate(d))
    assert (runs["FedProx"].algorithm.mu, runs["FedProx"].data.emnist_split) == (0.1, "digits")
    assert runs["FedAvg"].algorithm.name == "fedavg" and runs["FedAvg"].algorithm.mu == 0.01  # the default
    cifar = runs["CIFAR"].data
    assert (cifar.emnist_split, cifar.carve, cifar.train_per_class) == ("balanced", False, 200)
    assert runs["CIFAR"].algorithm.mu == 0.1  # still FedProx
    swept = expand_variants(validate(minimal(algorithm={"name": "fedprox", "mu": 0.1},
                                             sweep={"algorithm.name": ["fedprox", "fedavg"]})))
    assert [r.algorithm.mu for r in swept.values()] == [0.1, 0.01]
    with pytest.raises(ConfigError, match=r"^variants\.bad: algorithm\.mu = 0\.2: read only with algorithm.name = "
                                          r"'fedprox', not 'fedavg'"):
        expand_variants(validate(minimal(algorithm={"name": "fedprox", "mu": 0.1},
                                         variants={"bad": {"algorithm": {"name": "fedavg", "mu": 0.2}}})))


def test_a_template_key_goes_to_the_runs_that_read_it_and_must_be_read_by_one():
    """A config with variants is a template: a [distill] table beside FSL and FedDF variants (serverdata-cifar10)
    reaches the FedDF runs only; a key no run reads (μ over FedAvg variants only) is refused in one line. A single
    run's config with [distill] and no FedDF is refused as any key its choice does not read."""
    d = minimal(data={"dataset": "synthetic_chars", "server_size": 20}, distill={"lr": 1e-4},
                algorithm={"name": "fsl"},
                variants={"FSL": {"algorithm": {"name": "fsl"}}, "FedDF": {"algorithm": {"name": "feddf"}}})
    runs = expand_variants(validate(d))
    assert (runs["FSL"].distill.lr, runs["FedDF"].distill.lr) == (1e-3, 1e-4)
    with pytest.raises(ConfigError, match=r"^algorithm\.mu = 0\.1: read only with algorithm.name = 'fedprox', and no "
                                          r"run of the config has one \(theirs: 'fedavg'\): expected it unset, or set "
                                          r"in the variants that read it$"):
        expand_variants(validate(minimal(algorithm={"name": "fedavg", "mu": 0.1},
                                         variants={"a": {"algorithm": {"local_lr": 0.1}}, "b": {}})))
    with pytest.raises(ConfigError, match=r"^distill\.steps = 5: read only with algorithm.name = 'feddf', not "
                                          r"'fedavg': expected it unset$"):
        validate(minimal(distill={"steps": 5}))
    # the unlabelled data U likewise: FedDF's alone (another run would load it and append it to the pool for nothing)
    with pytest.raises(ConfigError, match=r"^data\.unlabelled = 'fslsyn': read only with algorithm.name = 'feddf'"):
        validate(minimal(data={"dataset": "synthetic_chars", "unlabelled": "fslsyn"}))
    u = expand_variants(validate({**d, "data": {**d["data"], "unlabelled": "fslsyn", "unlabelled_size": 30}}))
    assert (u["FSL"].data.unlabelled, u["FedDF"].data.unlabelled, u["FedDF"].data.unlabelled_size) == \
        ("server", "fslsyn", 30)


def test_a_sweep_over_one_algorithms_key_runs_the_others_once():
    """A sweep over μ with FedProx and FedAvg variants: FedAvg does not read μ, so it runs once, not once per μ (two
    copies of one run), as a variant pinned on a swept key does."""
    cfg = validate(minimal(sweep={"algorithm.mu": [0.01, 0.1]},
                           variants={"FedProx": {"algorithm": {"name": "fedprox"}}, "FedAvg": {}}))
    runs = expand_variants(cfg)
    assert list(runs) == ["FedProx-mu=0.01", "FedProx-mu=0.1", "FedAvg"] and count_runs(cfg) == 3
    assert [r.algorithm.mu for r in runs.values()] == [0.01, 0.1, 0.01]
    with pytest.raises(ConfigError, match=r"^sweep over algorithm\.mu: read by no variant of the config"):
        expand_variants(validate(minimal(sweep={"algorithm.mu": [0.01, 0.1]})))  # FedAvg alone


def test_set_that_switches_algorithm_or_dataset_leaves_the_others_keys_behind():
    """`--set algorithm.name=fedavg` on a FedProx config runs FedAvg (without μ) rather than refusing a μ the user
    cannot unset from the command line; a μ set in the same overrides is the user's, and refused."""
    d = minimal(algorithm={"name": "fedprox", "mu": 0.1}, data={"dataset": "emnist", "emnist_split": "digits"})
    fedavg = validate(apply_overrides(d, ["algorithm.name=fedavg"]))
    assert fedavg.algorithm.name == "fedavg" and fedavg.algorithm.mu == 0.01 and fedavg.data.emnist_split == "digits"
    assert validate(apply_overrides(d, ["data.dataset=cifar10"])).data.emnist_split == "balanced"
    assert validate(apply_overrides(d, ["algorithm.mu=0.2"])).algorithm.mu == 0.2
    assert apply_overrides(d, ["algorithm.name=fedprox"]) == d  # not a switch
    with pytest.raises(ConfigError, match=r"^algorithm\.mu = 0\.3: read only with algorithm.name = 'fedprox'"):
        validate(apply_overrides(d, ["algorithm.name=fedavg", "algorithm.mu=0.3"]))


def test_variant_that_is_not_a_table():
    with pytest.raises(ConfigError, match=r"^variants\.v = 3:"):
        validate(minimal(variants={"v": 3}))


# ----------------------------------------------------------------------------- edge cases found by fuzzing

@pytest.mark.parametrize("section, key", [("algorithm", "local_lr"), ("server", "gamma"), ("algorithm", "global_lr"),
                                          ("server", "lr"), ("server", "pretrain_lr")])
def test_infinite_floats_are_rejected(section, key):
    msg = error_of(minimal(**{section: {**MINIMAL.get(section, {}), key: math.inf}}))
    assert f"{section}.{key} = inf" in msg


@pytest.mark.parametrize("section", ["data", "algorithm"])
def test_missing_section_says_what_is_expected(section):
    d = minimal()
    del d[section]
    msg = error_of(d)  # also checks there is no trailing blank
    assert not msg.endswith("expected")


def test_boolean_for_an_integer_is_rejected():
    msg = error_of(minimal(rounds=True))
    assert msg.startswith("rounds = True:")


def test_seeds_expand_every_variant():
    cfg = validate(minimal(seeds=[3, 5], variants={"A": {}, "B": {"algorithm": {"local_lr": 0.5}}}))
    runs = expand_variants(cfg)
    assert list(runs) == ["A-seed3", "A-seed5", "B-seed3", "B-seed5"]
    assert runs["B-seed5"].seed == 5 and runs["B-seed5"].algorithm.local_lr == 0.5 and runs["A-seed3"].name == "A"


@pytest.mark.parametrize("seeds", [[1, 1], [-1], ["a"], 3])
def test_bad_seeds(seeds):
    assert error_of(minimal(seeds=seeds)).startswith("seeds")


def test_model_name_is_known_or_an_import_path(monkeypatch):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")  # imported factories are code: opted in
    assert validate(minimal(model={"name": "mypkg.models:make_net"})).model.name == "mypkg.models:make_net"
    msg = error_of(minimal(model={"name": "resnet"}))
    assert msg.startswith("model.name = 'resnet'") and "package.module:factory" in msg


def test_cuda_graphs_on_the_cpu_and_unknown_eval_precisions_are_refused_in_one_line():
    base = minimal()
    with pytest.raises(ConfigError, match=r"compile = 'cuda-graphs' captures CUDA graphs: expected device = 'cuda' "
                                          r"or 'auto' \(on a machine with a GPU\), not 'cpu'") as e:
        validate({**base, "compile": "cuda-graphs", "device": "cpu"})
    assert "\n" not in str(e.value)
    assert validate({**base, "compile": "cuda-graphs", "device": "auto"}).compile == "cuda-graphs"
    with pytest.raises(ConfigError, match=r"eval_precision = 'fp8'") as e:
        validate({**base, "eval_precision": "fp8"})
    assert "\n" not in str(e.value)
    assert validate({**base, "eval_precision": "bfloat16"}).eval_precision == "bfloat16"
    assert error_of({**base, "compile": "cuda-graphs", "executor": "sequential"}) == (
        "compile = 'cuda-graphs' captures the vectorised step: expected executor = 'vectorised' or 'auto', "
        "not 'sequential'")
    assert error_of({**base, "eval_precision": "bfloat16", "dtype": "float64"}) == (
        "eval_precision = 'bfloat16' evaluates float32 models under bf16 autocast (which leaves float64 as it is): "
        "expected dtype = 'float32', not 'float64'")


def test_tables_take_their_defaults_from_the_dataclasses_they_configure():
    """[robust], [attack], server.gamma_* and participation are written once, in the dataclasses: an unset table
    builds each dataclass as its own defaults do, and the defaults the config shows are those."""
    from fedsl.algorithms import GammaSchedule, Robust
    from fedsl.core.attacks import Attack
    from fedsl.core.participation import Participation

    cfg = validate(copy.deepcopy(MINIMAL))
    assert cfg.byzantine == Attack() and cfg.participation == Participation()
    s, r = cfg.server, cfg.robust
    assert GammaSchedule(s.gamma_schedule, s.gamma_final, s.gamma_every, s.gamma_factor,
                         threshold=s.gamma_threshold, shrink=s.gamma_shrink) == GammaSchedule()
    assert Robust(r.aggregator, r.trim, r.krum_f, r.krum_m, r.norm_bound, bucket=r.bucket) == Robust()
