"""Shakespeare by speaking role (``fedsl.sources.shakespeare``), LEAF's Shakespeare JSON, and the character LSTMs in
every executor. Texts are written by the tests; the shared corpus is used where present (skipped cleanly when not)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_text_federation, run_rounds, stacked_and_alone
from torch import nn
from torch.func import functional_call, vmap

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.cli import main
from fedsl.config.schema import ConfigError, validate
from fedsl.core.errors import DataError
from fedsl.data.datasets import build_federation, load_arrays
from fedsl.data.partition import PartitionError
from fedsl.engine.executors import SequentialExecutor, VectorisedExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model
from fedsl.models.flops import forward_flops
from fedsl.models.lstm import lstm
from fedsl.runs.build import prepare
from fedsl.sources import shakespeare

pytestmark = pytest.mark.usefixtures("one_thread")

SHARED = Path(os.environ.get("FEDSL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))

# The etext's layout: a header, plays headed "by William Shakespeare", speeches "  ROLE. text" continued by lines
# indented by four spaces, The Comedy of Errors without indentation
WORKS = """Project Gutenberg's header, ignored.

  PROLOGUE. Not a play's line: before any play.


1609

THE SONNETS

by William Shakespeare

  From fairest creatures we desire increase,
  When your sweet issue your sweet form should bear.{TRAILING}
    (a poem's lines: no role)


1603

THE FIRST PLAY

by William Shakespeare

  Dramatis Personae

  HAMLET. To be, or not to be:
    that is the question.
  Ophelia. Good my lord,
    how does your honour?
  Hamlet. Well,   well, well.
  SIR Toby. A third.

THE END


1590

THE COMEDY OF ERRORS

by William Shakespeare

ACT I. Scene one.
DROMIO. I am a slave.
to my master.
<<copyright notice>>
ADRIANA. Neither my husband
""".replace("{TRAILING}", "  ")  # the etext's trailing spaces: without them no sonnet line reads as a speech

TINY = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?
Next line.

"""


def test_the_etext_is_read_as_leaf_reads_it():
    roles = shakespeare.roles_of_works(WORKS)
    assert roles == {
        "THE_FIRST_PLAY_HAMLET": ["To be, or not to be:", "that is the question.", "Well,   well, well."],
        "THE_FIRST_PLAY_OPHELIA": ["Good my lord,", "how does your honour?"],
        "THE_FIRST_PLAY_SIR_TOBY": ["A third."],
        "THE_COMEDY_OF_ERRORS_DROMIO": ["I am a slave.", "to my master."],
        "THE_COMEDY_OF_ERRORS_ADRIANA": ["Neither my husband"],
    }


def test_the_tiny_corpus_gives_one_client_per_speaker():
    assert shakespeare.roles_of_tiny(TINY) == {
        "FIRST_CITIZEN": ["Before we proceed any further, hear me speak.",
                         "You are all resolved rather to die than to famish?", "Next line."],
        "ALL": ["Speak, speak."]}


def _leaf_windows(lines: list[str], length: int) -> tuple[list[str], list[str]]:
    """LEAF's ``__txt_to_data``, written out: each line padded with ``length`` spaces, runs of spaces made one."""
    xs, ys = [], []
    for line in lines:
        line = " " * length + re.sub(r"   *", " ", line + "\n")
        for i in range(len(line) - length):
            xs.append(line[i:i + length])
            ys.append(line[i + length])
    return xs, ys


@pytest.mark.parametrize("stride", [1, 3])
def test_windows_are_leafs_every_stride_th(stride):
    lines = ["To be, or not to be:", "Well,   well, well.", "A|b"]  # '|' is outside the vocabulary: a space
    x, y = shakespeare.windows(lines, 6, stride)
    xs, ys = _leaf_windows([line.replace("|", " ") for line in lines], 6)
    keep = [i for line, start in zip(lines, np.cumsum([0] + [len(_leaf_windows([ln], 6)[1]) for ln in lines]))
            for i in range(start, start + len(_leaf_windows([line], 6)[1]))
            if (i - start) % stride == 0]
    assert x.dtype == np.uint8 and x.shape == (len(keep), 6)
    assert ["".join(shakespeare.VOCABULARY[c] for c in row) for row in x] == [xs[i] for i in keep]
    assert "".join(shakespeare.VOCABULARY[c] for c in y) == "".join(ys[i] for i in keep)


def test_vocabulary_is_leafs_80_characters():
    assert len(shakespeare.VOCABULARY) == 80 and len(set(shakespeare.VOCABULARY)) == 80
    assert shakespeare.encode("a}\n|").tolist() == [shakespeare.VOCABULARY.index(c) for c in "a}\n "]


def test_each_role_is_split_by_position_with_leafs_gap():
    train, test = shakespeare.split_role(100, 0.2, 79)
    assert (train, test) == (slice(0, 80), slice(100, 100))  # the gap swallows a short test part
    train, test = shakespeare.split_role(1000, 0.2, 79)
    assert (train, test) == (slice(0, 800), slice(879, 1000))


def _text_dir(root: Path, text: str = WORKS, name: str = "complete-works-part.txt") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
    return root


def _data(root: Path, **kw) -> dict:
    return {"dataset": "shakespeare", "data_dir": str(root), "partition": "natural", "num_clients": 2,
            "seq_length": 8, "min_samples": 20, "test_fraction": 0.25, **kw}


def test_roles_become_clients_in_a_fixed_shuffled_order(tmp_path):
    d = validate({"rounds": 1, "data": _data(tmp_path / "d"), "model": {"name": "char_lstm_small"},
                  "algorithm": {"name": "fedavg", "clients_per_round": 1}}).data
    _text_dir(tmp_path / "d")
    ds = load_arrays(d)
    kept = {u: lines for u, lines in shakespeare.roles_of_works(WORKS).items()
            if len(shakespeare.windows(lines, 8, 1)[1]) >= 20}
    assert ds.train.owner_names == shakespeare.role_order(list(kept))
    assert ds.train.class_names == list(shakespeare.VOCABULARY)
    for i, name in enumerate(ds.train.owner_names):  # each client: its role's windows, the first ⌈0.75·n⌉ train
        x, y = shakespeare.windows(kept[name], 8, 1)
        tr, te = shakespeare.split_role(len(y), 0.25, 7)
        assert np.array_equal(ds.train.x[ds.train.owners == i], x[tr])
        assert np.array_equal(ds.test.y[ds.test.owners == i], y[te])
    assert "THE_FIRST_PLAY_SIR_TOBY" not in ds.train.owner_names  # 9 windows < data.min_samples


def test_text_and_window_keys_change_what_is_loaded(tmp_path):
    """The loader's memo is keyed on the text keys: 'tiny' after 'works' in one process is the tiny corpus."""
    root = _text_dir(tmp_path / "d")
    _text_dir(root, TINY, "tinyshakespeare.txt")
    cfg = lambda **kw: validate({"rounds": 1, "data": _data(root, min_samples=1, **kw),
                                 "model": {"name": "char_lstm_small"},
                                 "algorithm": {"name": "fedavg", "clients_per_round": 1}}).data
    works, tiny = load_arrays(cfg()), load_arrays(cfg(text="tiny"))
    assert "FIRST_CITIZEN" in tiny.train.owner_names and "FIRST_CITIZEN" not in works.train.owner_names
    assert load_arrays(cfg(stride=2)).train.x.shape[0] < works.train.x.shape[0]
    assert load_arrays(cfg(seq_length=5)).train.x.shape[1] == 5


def test_bad_text_is_one_line(tmp_path):
    empty = _text_dir(tmp_path / "e", "no plays here\n")
    with pytest.raises(DataError, match="no role's lines found") as e:
        load_arrays(validate({"rounds": 1, "data": _data(empty), "model": {"name": "char_lstm_small"},
                              "algorithm": {"name": "fedavg", "clients_per_round": 1}}).data)
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="none of tinyshakespeare.txt"):
        load_arrays(validate({"rounds": 1, "data": _data(empty, text="tiny"), "model": {"name": "char_lstm_small"},
                              "algorithm": {"name": "fedavg", "clients_per_round": 1}}).data)


# ----------------------------------------------------------------------------------------- server data for text

def _fed_cfg(root: Path, **data):
    return validate({"rounds": 1, "data": _data(root, min_samples=1, num_clients=2, **data),
                     "model": {"name": "char_lstm_small"}, "algorithm": {"name": "fsl", "clients_per_round": 2,
                                                                         "batch_size": 4}})


def test_d0_from_roles_that_are_not_clients(tmp_path):
    root = _text_dir(tmp_path / "d")
    cfg = _fed_cfg(root, server_source="other_ids", server_clients=2)
    fed = build_federation(cfg.data, 0)
    ds = load_arrays(cfg.data)
    owners = ds.train.owners
    assert np.array_equal(fed.server, np.flatnonzero((owners == 2) | (owners == 3)))
    assert not set(fed.server) & set(np.concatenate([fed.clients[i] for i in range(2)]))
    capped = build_federation(_fed_cfg(root, server_source="other_ids", server_clients=2, server_size=10).data, 0)
    assert len(capped.server) == 10 and set(capped.server) <= set(fed.server)
    with pytest.raises(PartitionError, match="data.server_clients = 4: .*expected N \\+ c at most 5"):
        build_federation(_fed_cfg(root, server_source="other_ids", server_clients=4).data, 0)


@pytest.mark.parametrize("data, needle", [
    ({"server_source": "dataset", "server_dataset": "fslsyn"}, "data.server_source = 'dataset' reads images "
                                                               "('fslsyn'), but data.dataset = 'shakespeare' is text"),
    ({"server_size": 4, "unlabelled": "stl10"}, "data.unlabelled = 'stl10' reads images, but data.dataset = "
                                                "'shakespeare' is text"),
])
def test_image_sources_for_text_are_refused_in_one_line(tmp_path, data, needle):
    root = _text_dir(tmp_path / "d")
    d = validate({"rounds": 1, "data": _data(root, min_samples=1, **data), "model": {"name": "char_lstm_small"},
                  "algorithm": {"name": "feddf", "clients_per_round": 2, "batch_size": 4}}).data
    with pytest.raises(DataError, match=re.escape(needle)) as e:
        build_federation(d, 0)
    assert "\n" not in str(e.value)


def test_other_ids_needs_a_natural_partition():
    with pytest.raises(ConfigError, match="data.server_source = 'other_ids' .* expected data.partition = "
                                          "'natural', not 'iid'") as e:
        validate({"rounds": 1, "data": {"dataset": "toy", "partition": "iid", "server_source": "other_ids"},
                  "model": {"name": "mlp"}, "algorithm": {"name": "fsl"}})
    assert "\n" not in str(e.value)


def test_an_iid_d0_and_a_test_subset_of_windows_are_uniform_draws(tmp_path):
    """Per class (next character) a draw would ask for every character equally: the space and 'z' alike."""
    root = _text_dir(tmp_path / "d")
    fed = build_federation(_fed_cfg(root, server_size=30, test_size=5).data, 0)
    assert len(fed.server) == 30 and len(fed.y_test) == 5
    fed_again = build_federation(_fed_cfg(root, server_size=30, test_size=5).data, 0)
    assert np.array_equal(fed.server, fed_again.server)
    ds = load_arrays(_fed_cfg(root, server_size=30).data)
    counts = np.bincount(ds.train.y[fed.server], minlength=80)
    assert counts.max() > 30 // len(np.unique(ds.train.y)) + 1  # not per-class balanced: the space dominates


def test_the_validation_windows_are_each_clients_last(tmp_path):
    """Windows overlap: a uniform draw would validate on windows whose targets the clients train on."""
    root = _text_dir(tmp_path / "d")
    whole = build_federation(_fed_cfg(root, server_size=4).data, 0)
    held = build_federation(_fed_cfg(root, server_size=4, validation=0.25).data, 0)
    expected = []
    for i in range(2):
        mine = [j for j in whole.clients[i] if j not in set(whole.server)]
        k = int(0.25 * len(whole.clients[i]))
        expected += mine[len(mine) - k:]
        assert list(held.clients[i]) == [j for j in whole.clients[i] if j not in set(mine[len(mine) - k:])]
    assert list(held.validation) == sorted(expected) and len(expected) > 0


# --------------------------------------------------------------------------------------------------- the models

def test_the_plain_lstm_equals_nn_lstm():
    torch.manual_seed(0)
    ref = nn.LSTM(8, 16, 2, batch_first=True)
    x = torch.randn(5, 12, 8, requires_grad=True)
    layers = [tuple(getattr(ref, f"{w}_l{k}") for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
              for k in range(2)]
    ours, theirs = lstm(x, layers), ref(x)[0]
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
    g_ours = torch.autograd.grad(ours.square().sum(), [x, *ref.parameters()])
    g_theirs = torch.autograd.grad(theirs.square().sum(), [x, *ref.parameters()])
    assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(g_ours, g_theirs))


def test_a_vmapped_char_lstm_equals_one_model_at_a_time():
    """Under vmap (the vectorised executor) the plain LSTM runs: equal to nn.LSTM's kernel per client."""
    model = build_model("char_lstm_small", 80, (10,), seed=0)
    stacked = {n: torch.stack([p.detach() + 0.01 * k for k in range(3)]) for n, p in model.named_parameters()}
    x = torch.randint(0, 80, (3, 4, 10), dtype=torch.uint8)
    batched = vmap(lambda p, xb: functional_call(model, p, (xb,)))(stacked, x)
    for k in range(3):
        one = functional_call(model, {n: v[k] for n, v in stacked.items()}, (x[k],))
        assert torch.allclose(batched[k], one, atol=1e-5, rtol=0)


def test_char_lstm_is_leafs_model():
    m = build_model("char_lstm", 80, (80,), seed=0)
    assert (m.embed.embedding_dim, m.lstm.hidden_size, m.lstm.num_layers, m.out.out_features) == (8, 256, 2, 80)
    # embedding 80·8, LSTM 4·256·(8 + 256 + 2) + 4·256·(256 + 256 + 2), dense 256·80 + 80
    assert sum(p.numel() for p in m.parameters()) == 640 + 4 * 256 * 266 + 4 * 256 * 514 + 256 * 80 + 80
    # per window: 80 steps × 2·4H·(in + H) per layer, and the dense layer
    assert forward_flops(m, (80,)) == 80 * 2 * 4 * 256 * (8 + 256) + 80 * 2 * 4 * 256 * 512 + 2 * 256 * 80
    assert m(torch.zeros(3, 80, dtype=torch.uint8)).shape == (3, 80)


@pytest.mark.parametrize("model, dataset, needle", [
    ("mlp", "shakespeare", "model.name = 'mlp' reads images or features, but data.dataset = 'shakespeare' gives "
                           "text: expected one of char_lstm, char_lstm_small"),
    ("char_lstm_small", "toy", "model.name = 'char_lstm_small' reads text, but data.dataset = 'toy' gives images"),
])
def test_a_model_for_the_other_kind_of_data_is_refused_in_one_line(tmp_path, model, dataset, needle):
    data = _data(_text_dir(tmp_path / "d"), min_samples=1) if dataset == "shakespeare" else {"dataset": "toy"}
    cfg = validate({"rounds": 1, "data": data, "model": {"name": model},
                    "algorithm": {"name": "fedavg", "clients_per_round": 1, "batch_size": 4}})
    with pytest.raises(ConfigError, match=re.escape(needle)) as e:
        prepare(cfg)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------- executors

def _run(root: Path, executor: str, algorithm: str = "fsl", rounds: int = 2):
    cfg = validate({"rounds": rounds, "seed": 3, "executor": executor, "eval_every": 1,
                    "data": _data(root, min_samples=1, num_clients=3, server_size=12),
                    "model": {"name": "char_lstm_small"},
                    "algorithm": {"name": algorithm, "clients_per_round": 2, "batch_size": 3, "local_steps": 2,
                                  "local_lr": 0.5}, "server": {"steps": 2} if algorithm == "fsl" else {}})
    b = prepare(cfg)
    st = b.sim.initial_state()
    for t in range(rounds):
        st, _ = b.sim.round(st, t)
    return st.x


@pytest.mark.parametrize("algorithm", ["fsl", "scaffold"])
def test_the_vectorised_executor_equals_the_sequential_on_text(tmp_path, algorithm):
    root = _text_dir(tmp_path / "d")
    seq, vec = _run(root, "sequential", algorithm), _run(root, "vectorised", algorithm)
    assert max((seq[n] - vec[n]).abs().max().item() for n in seq) < 1e-5
    assert max((seq[n] - build_model("char_lstm_small", 80, (8,), 3).state_dict()[n]).abs().max().item()
               for n in seq) > 1e-3  # it trained


def _text_sim(name, fed, executor, seed=11):
    fm = FunctionalModel(build_model("char_lstm_small", 80, (10,), seed=3).to(dtype=torch.float64))
    alg = make_algorithm(name, LocalTraining(0.5, 4), 1.0, ServerLearning(gamma=1.0, lr=0.5, batch_size=4, epochs=1))
    return Simulator(fm, fed, alg, executor(fm), 3, seed=seed)


@pytest.mark.parametrize("name", ["fsl", "scaffold"])
def test_in_float64_the_vmapped_lstm_equals_nn_lstm_to_1e9(name):
    fed = random_text_federation([9, 14, 11, 8])
    a, _ = run_rounds(_text_sim(name, fed, SequentialExecutor), 3)
    b, _ = run_rounds(_text_sim(name, fed, VectorisedExecutor), 3)
    assert max((a.x[n] - b.x[n]).abs().max().item() for n in a.x) < 1e-9


def test_stacked_text_runs_equal_the_runs_one_by_one():
    fed = random_text_federation([9, 14, 11, 8])
    other = random_text_federation([12, 7, 10, 9], seed=1)
    sims = lambda: [_text_sim("fsl", fed, VectorisedExecutor, seed=1), _text_sim("fsl", fed, VectorisedExecutor,
                                                                                 seed=2),
                    _text_sim("fsl", other, VectorisedExecutor, seed=3)]
    for state, (s_acc, s_loss), alone, sim in stacked_and_alone(sims, 3):
        assert max((alone.x[n] - state.x[n]).abs().max().item() for n in alone.x) < 1e-10
        acc, loss = sim.evaluate(alone.x)
        assert s_acc == pytest.approx(acc, abs=1e-12) and s_loss == pytest.approx(loss, rel=1e-9)


def test_the_process_pool_equals_the_sequential_on_text(tmp_path):
    root = _text_dir(tmp_path / "d")
    seq, pool = _run(root, "sequential"), _run(root, "processes")
    assert max((seq[n] - pool[n]).abs().max().item() for n in seq) == 0.0


# ------------------------------------------------------------------------------------------- LEAF's JSON layout

def write_leaf_text(root: Path, users: dict[str, str], length: int = 10, test_share: float = 0.25) -> Path:
    """LEAF's Shakespeare layout: x strings of ``length`` characters, y the next one, per user."""
    for split in ("train", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
        doc = {"users": [], "num_samples": [], "user_data": {}}
        for user, text in users.items():
            xs, ys = _leaf_windows([text], length)
            cut = math.ceil((1 - test_share) * len(ys))
            part = slice(0, cut) if split == "train" else slice(cut, None)
            doc["users"].append(user)
            doc["num_samples"].append(len(ys[part]))
            doc["user_data"][user] = {"x": xs[part], "y": ys[part]}
        (root / split / f"all_data_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return root


LEAF_USERS = {"THE_TEMPEST_PROSPERO": "Now does my project gather to a head: my charms crack not.",
              "HAMLET_HORATIO": "So have I heard and do in part believe it.",
              "MACBETH_WITCH": "Fair is foul, and foul is fair: hover through the fog and filthy air."}


def test_leafs_shakespeare_json_is_read_as_windows(tmp_path):
    root = write_leaf_text(tmp_path / "leaf", LEAF_USERS)
    d = validate({"rounds": 1, "data": {"dataset": "leaf", "data_dir": str(root), "partition": "natural",
                                        "num_clients": 3}, "model": {"name": "char_lstm_small"},
                  "algorithm": {"name": "fedavg", "clients_per_round": 1}}).data
    ds = load_arrays(d)
    assert ds.train.x.shape[1:] == (10,) and ds.train.class_names == list(shakespeare.VOCABULARY)
    i = ds.train.owner_names.index("HAMLET_HORATIO")
    xs, ys = _leaf_windows([LEAF_USERS["HAMLET_HORATIO"]], 10)
    cut = math.ceil(0.75 * len(ys))
    assert ["".join(shakespeare.VOCABULARY[c] for c in row) for row in ds.train.x[ds.train.owners == i]] == xs[:cut]
    assert "".join(shakespeare.VOCABULARY[c] for c in ds.test.y[ds.test.owners == i]) == "".join(ys[cut:])


@pytest.mark.parametrize("change, needle", [
    (lambda u: u.update(y=[7] * len(u["y"])), "samples mix text and other values"),
    (lambda u: u["x"].__setitem__(0, "short"), "windows have lengths \\[5, 10\\]"),
])
def test_bad_leaf_text_is_one_line(tmp_path, change, needle):
    root = write_leaf_text(tmp_path / "leaf", LEAF_USERS)
    path = root / "train" / "all_data_niid_0_keep_0_train_9.json"
    doc = json.loads(path.read_text())
    change(doc["user_data"]["HAMLET_HORATIO"])
    path.write_text(json.dumps(doc))
    d = validate({"rounds": 1, "data": {"dataset": "leaf", "data_dir": str(root), "partition": "natural",
                                        "num_clients": 3}, "model": {"name": "char_lstm_small"},
                  "algorithm": {"name": "fedavg", "clients_per_round": 1}}).data
    with pytest.raises(DataError, match=needle) as e:
        load_arrays(d)
    assert "\n" not in str(e.value)


def test_fedsl_run_trains_on_leafs_shakespeare_json(tmp_path):
    root = write_leaf_text(tmp_path / "leaf", LEAF_USERS)
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""name = "leaf-text"
rounds = 3
threads = 1
[data]
dataset = "leaf"
data_dir = "{root}"
partition = "natural"
num_clients = 3
[model]
name = "char_lstm_small"
[algorithm]
name = "fedavg"
clients_per_round = 2
batch_size = 5
local_lr = 1.0
""")
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "leaf-text" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_done"] == 3
    assert math.isfinite(summary["final_accuracy"])


# ----------------------------------------------------------------------------------------- the shared corpus

@pytest.mark.skipif(not (SHARED / "shakespeare" / "complete-works-part.txt").is_file(),
                    reason="the shared Shakespeare texts are not on this machine (../shared/data/shakespeare)")
@pytest.mark.parametrize("executor", ["sequential", "vectorised"])
def test_the_preset_runs_quick_on_the_shared_corpus(tmp_path, executor):
    out = tmp_path / "out"
    assert main(["run", "--preset", "shakespeare", "--quick", "--data-dir", str(SHARED), "--set",
                 f"executor={executor}", "--variants", "FSL,FedAvg", "--out", str(out), "--quiet"]) == 0
    fsl = json.loads((out / "FSL-seed0" / "summary.json").read_text())
    assert fsl["status"] == "completed" and fsl["rounds_done"] == 2
    assert (fsl["server_data"]["size"], fsl["server_data"]["source"]) == (200, "other_ids")
    assert fsl["executor"] == executor and fsl["test_data"]["size"] == 500


LSTM_MEMORY = """
import torch
from torch.func import functional_call, grad, vmap
from fedsl.models.lstm import char_lstm_small
torch.set_num_threads(1)
m = char_lstm_small(80)
rows = {n: p.detach().expand(10, *p.shape).contiguous() for n, p in m.named_parameters()}
x, y = torch.randint(0, 80, (10, 10, 80)), torch.randint(0, 80, (10, 10))
step = vmap(grad(lambda p, xb, yb: torch.nn.functional.cross_entropy(functional_call(m, p, (xb,)), yb)))
step(rows, x, y)
# the peak of this process's own memory (VmHWM): ru_maxrss would carry over the forking test worker's
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def test_a_vmapped_lstm_step_does_not_keep_a_copy_of_every_step_for_every_step():
    """One vmapped gradient step of 10 clients' char-LSTMs on 80-character windows (the vectorised and stacked
    executors' step) peaks well under 1.2 GB: slicing the input projections one step at a time gave each slice's
    backward a zero tensor of all 80 steps, alive together under vmap (2.3 GB here, growing as T²)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", LSTM_MEMORY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 1.2 * 2**30, f"{int(done.stdout.split()[-1]) / 2**30:.2f} GiB"
