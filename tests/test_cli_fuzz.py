"""Property test: malformed configs never start a run and always end in one line `error: ...`.

Hypothesis generates configs from the quickstart preset with one or more guaranteed-invalid
mutations (wrong types, unknown keys, missing keys and sections, out-of-range numbers,
cross-field violations, bad variants), broken TOML text, and malformed ``--set`` arguments.
Each goes through the real command line entry point ``fedsl.cli.main`` in-process; every
example must exit with status 2 and print exactly one line on stderr that starts with
``error:``, names the offending key (or the broken file), and contains no traceback.
The examples of the four property tests sum to 800.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import re
import tempfile
import tomllib
import typing
from pathlib import Path
from types import UnionType
from unittest import mock

import annotated_types as at
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from fedsl.cli import main
from fedsl.config import presets
from fedsl.config.schema import RunConfig

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

QUICKSTART = presets.load("quickstart")
QUICKSTART_TEXT = (Path(presets.__file__).parent / "presets" / "quickstart.toml").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- the schema

class Leaf(typing.NamedTuple):
    path: tuple[str, ...]
    kind: str                      # int, float, bool, str, literal
    choices: tuple = ()            # literal values
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    min_len: int | None = None


def _leaf(path: tuple[str, ...], field) -> Leaf | None:
    """A scalar field's strategy description; None for lists, tables of keys and mixed unions (test_config.py
    and test_tune.py cover them)."""
    ann = field.annotation
    if typing.get_origin(ann) in (typing.Union, UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) > 1:
            return None
        ann = args[0]
    if typing.get_origin(ann) in (list, dict):
        return None
    if typing.get_origin(ann) is typing.Literal:
        kind, choices = "literal", typing.get_args(ann)
    else:
        kind, choices = {int: "int", float: "float", bool: "bool", str: "str"}[ann], ()
    c: dict = {}
    for m in field.metadata:
        if isinstance(m, at.Ge):
            c["ge"] = m.ge
        elif isinstance(m, at.Gt):
            c["gt"] = m.gt
        elif isinstance(m, at.Lt):
            c["lt"] = m.lt
        elif isinstance(m, at.MinLen):
            c["min_len"] = m.min_length
    return Leaf(path, kind, choices, **c)


SECTIONS: dict[str, type[BaseModel]] = {}
LEAVES: list[Leaf] = []
for _name, _field in RunConfig.model_fields.items():
    _ann = _field.annotation
    if isinstance(_ann, type) and issubclass(_ann, BaseModel):
        SECTIONS[_name] = _ann
        LEAVES += [leaf for sub, f in _ann.model_fields.items() if (leaf := _leaf((_name, sub), f)) is not None]
    elif _name not in ("variants", "seeds", "sweep", "paper", "paper_claims", "quick"):  # tables/lists: test_config.py
        if (leaf := _leaf((_name,), _field)) is not None:  # mixed unions (stack: int | "auto") are skipped
            LEAVES.append(leaf)

FIELDS = {(): set(RunConfig.model_fields), **{(s,): set(m.model_fields) for s, m in SECTIONS.items()}}
RANGED = [leaf for leaf in LEAVES
          if leaf.ge is not None or leaf.gt is not None or leaf.lt is not None or leaf.min_len is not None]
REQUIRED_KEYS = [("rounds",), ("data", "dataset"), ("algorithm", "name"), ("data",), ("algorithm",)]


def test_schema_is_understood():
    """The strategies below cover every field, and the required keys are the documented ones."""
    assert {"data", "model", "algorithm", "server"} <= set(SECTIONS)
    assert len(LEAVES) > 40
    by_path = {leaf.path: leaf for leaf in LEAVES}
    assert by_path[("server", "gamma")].ge == 0
    assert by_path[("algorithm", "local_lr")].gt == 0
    assert (by_path[("server", "weight")].gt, by_path[("server", "weight")].lt) == (0, 1)
    assert by_path[("rounds",)].ge == 1
    required = {(n,) for n, f in RunConfig.model_fields.items() if f.is_required()}
    required |= {(s, n) for s, m in SECTIONS.items() for n, f in m.model_fields.items() if f.is_required()}
    assert required == set(REQUIRED_KEYS)


# ----------------------------------------------------------------------------- TOML writer

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(k: str) -> str:
    return k if _BARE.fullmatch(k) else toml_str(k)


def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(data: dict, prefix: tuple[str, ...] = ()) -> str:
    """A nested dict of str/int/float/bool/list/dict as TOML: scalars first, then [tables]."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in data.items():
        if isinstance(v, dict):
            path = (*prefix, k)
            text += f"\n[{'.'.join(toml_key(p) for p in path)}]\n" + to_toml(v, path)
    return text


def same(a, b) -> bool:
    """Equality that treats nan as equal to nan (for the writer's round trip)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_toml_writer_round_trips_the_preset():
    assert tomllib.loads(to_toml(QUICKSTART)) == QUICKSTART


# ----------------------------------------------------------------------------- running the CLI

class RunStarted(AssertionError):
    pass


@pytest.fixture(autouse=True, scope="module")
def _command_built_once():
    """``main`` has typer build the click command from the app at every call, three quarters of an example's
    time; here it is built once and each example runs it (``main`` is still the entry point, and the command
    is the one typer builds)."""
    import typer.main

    from fedsl.cli import app
    real = typer.main.get_command
    built = real(app)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.main, "get_command", lambda typer_app: built if typer_app is app else real(typer_app))
        yield


def run_cli(config_text: str | bytes, extra: list[str] = (), suffix: str = ".toml"):
    """``fedsl run FILE --out DIR --quiet [extra]`` in-process.

    Returns (status, stdout, stderr, config file path, whether the out folder was created);
    the temporary folder is removed afterwards.
    """
    with tempfile.TemporaryDirectory(prefix="fedsl-fuzz-") as tmp:
        path = Path(tmp) / f"config{suffix}"
        if isinstance(config_text, bytes):
            path.write_bytes(config_text)
        else:
            path.write_text(config_text, encoding="utf-8")
        out_dir = Path(tmp) / "out"
        out, err = io.StringIO(), io.StringIO()
        # a config that slipped through validation must not start a (minutes long) run
        with mock.patch("fedsl.sweeps.compare.run_group", side_effect=RunStarted("a run started")), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["run", str(path), "--out", str(out_dir), "--quiet", *extra])
        started = out_dir.exists() or (out_dir / "metrics.csv").exists()
    return status, out.getvalue(), err.getvalue(), path, started


def assert_one_line_error(status, out, err, started, tokens, prefix="error: ") -> str:
    assert "Traceback" not in out + err
    assert status == 2, (status, err)
    lines = [line for line in err.split("\n") if line.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert err == line + "\n", err
    assert line.startswith(prefix), line
    assert out == "", out
    assert any(t in line for t in tokens), (tokens, line)
    assert not started, "the out folder was created: work started"
    return line


# ----------------------------------------------------------------------------- values

_BOOL_WORDS = {"0", "1", "f", "t", "n", "y", "no", "yes", "on", "off", "true", "false"}
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ _-:/é"


def _not_coercible(s: str) -> bool:
    """Not read as a number or a boolean by pydantic's lax mode."""
    try:
        float(s)
        return False
    except ValueError:
        pass
    return s.strip().lower() not in _BOOL_WORDS and s.strip() != ""


words = st.text(_LETTERS, min_size=1, max_size=12).filter(_not_coercible)
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,14}", fullmatch=True)
scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                    st.booleans(), st.text(_LETTERS, max_size=8))
lists = st.lists(scalars, max_size=3)
tables = st.dictionaries(identifiers, scalars, max_size=2)
fractional = st.one_of(st.integers(-10**6, 10**6).map(lambda i: i + 0.5),
                       st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9).filter(
                           lambda x: x != int(x)))
non_finite = st.sampled_from([math.inf, -math.inf, math.nan])


def wrong_type(leaf: Leaf) -> st.SearchStrategy:
    """Values of a type the field never accepts, even in pydantic's lax mode."""
    containers = [lists, tables]
    if leaf.kind == "int":
        return st.one_of(words, fractional, non_finite, *containers)
    if leaf.kind == "float":
        return st.one_of(words, *containers)
    if leaf.kind == "bool":
        return st.one_of(words, st.integers(-10**6, 10**6).filter(lambda i: i not in (0, 1)),
                         fractional, *containers)
    # str and literal
    others = [st.integers(-10**6, 10**6), st.floats(allow_nan=False), st.booleans(), *containers]
    if leaf.kind == "literal":
        others.append(st.text(_LETTERS, max_size=12).filter(lambda s: s not in leaf.choices))
    return st.one_of(*others)


def out_of_range(leaf: Leaf) -> st.SearchStrategy:
    if leaf.min_len is not None:
        return st.text(_LETTERS, max_size=leaf.min_len - 1)
    if leaf.kind == "int":
        if leaf.ge is not None:
            return st.integers(min_value=-10**9, max_value=int(leaf.ge) - 1)
        return st.integers(min_value=-10**9, max_value=int(leaf.gt))
    parts = [st.just(math.nan)]
    if leaf.ge is not None:
        parts.append(st.floats(max_value=leaf.ge, exclude_max=True, allow_nan=False))
    if leaf.gt is not None:
        parts.append(st.floats(max_value=leaf.gt, allow_nan=False))
    if leaf.lt is not None:
        parts.append(st.floats(min_value=leaf.lt, allow_nan=False))
    return st.one_of(*parts)


# ----------------------------------------------------------------------------- mutations
# A mutation is (kind, where, changes, tokens): ``changes`` are (path, value) pairs set in
# order (value DELETE removes the key); ``where`` is () for the config or ("variants", name);
# the error line must contain one of ``tokens`` of the mutations that were applied.

DELETE = object()


@st.composite
def set_wrong_type(draw):
    leaf = draw(st.sampled_from(LEAVES))
    return "wrong type", [(leaf.path, draw(wrong_type(leaf)))], [".".join(leaf.path)]


@st.composite
def section_wrong_type(draw):
    section = draw(st.sampled_from(sorted(SECTIONS)))
    value = draw(st.one_of(scalars, lists))
    return "section wrong type", [((section,), value)], [section]


@st.composite
def unknown_key(draw):
    level = draw(st.sampled_from(sorted(FIELDS)))
    name = draw(identifiers.filter(lambda n: n not in FIELDS[level]))
    value = draw(st.one_of(scalars, lists, tables))
    return "unknown key", [((*level, name), value)], [".".join((*level, name))]


@st.composite
def missing_key(draw):
    path = draw(st.sampled_from(REQUIRED_KEYS))
    return "missing key", [(path, DELETE)], [".".join(path)]


# the values the issue names are drawn half of the time, any constrained field otherwise
NAMED_IN_ISSUE = [leaf for leaf in RANGED if leaf.path in {
    ("server", "gamma"), ("algorithm", "local_lr"), ("server", "weight"), ("rounds",), ("data", "num_clients"),
    ("algorithm", "clients_per_round"), ("algorithm", "batch_size"), ("data", "server_size")}]


@st.composite
def out_of_range_value(draw):
    leaf = draw(st.one_of(st.sampled_from(NAMED_IN_ISSUE), st.sampled_from(RANGED)))
    return "out of range", [(leaf.path, draw(out_of_range(leaf)))], [".".join(leaf.path)]


@st.composite
def cross_field(draw):
    which = draw(st.sampled_from(["S>N", "C>L", "repeated chars", "server data"]))
    if which == "S>N":
        n = draw(st.integers(1, 50))
        s = n + draw(st.integers(1, 1000))
        return which, [(("data", "num_clients"), n), (("algorithm", "clients_per_round"), s)], \
            ["algorithm.clients_per_round"]
    if which == "C>L":
        chars = "".join(draw(st.lists(st.sampled_from("abcdefghij0123456789"), min_size=2, max_size=8, unique=True)))
        c = len(chars) + draw(st.integers(1, 20))
        return which, [(("data", "chars"), chars), (("data", "classes_per_client"), c)], ["data.classes_per_client"]
    if which == "repeated chars":
        chars = draw(st.text("abc0123", min_size=1, max_size=6))
        return which, [(("data", "chars"), chars + chars[0])], ["data.chars"]
    algo = draw(st.sampled_from(["fsl", "fsl_p", "ds"]))
    return which, [(("algorithm", "name"), algo), (("data", "server_size"), 0)], ["data.server_size"]


base_mutations = st.one_of(set_wrong_type(), section_wrong_type(), unknown_key(), missing_key(),
                           out_of_range_value(), cross_field())
# inside a variant only keys that are set make sense (a variant has no required keys); a
# variant's run name is its table's name, so a `name` key inside it is overridden
variant_mutations = st.one_of(set_wrong_type(), unknown_key(), out_of_range_value(), cross_field(),
                              section_wrong_type()).filter(lambda m: m[1][0][0] != ("name",))


def apply_change(root: dict, path: tuple[str, ...], value) -> bool:
    """Set (or delete) ``path``; False where a parent is not a table (or the key to delete is absent)."""
    node = root
    for part in path[:-1]:
        nxt = node.get(part) if value is DELETE else node.setdefault(part, {})
        if not isinstance(nxt, dict):
            return False
        node = nxt
    if value is DELETE:
        return node.pop(path[-1], DELETE) is not DELETE
    node[path[-1]] = copy.deepcopy(value)
    return True


@st.composite
def malformed_configs(draw):
    data = copy.deepcopy(QUICKSTART)
    keep_variants = draw(st.booleans())
    if not keep_variants:
        del data["variants"]
    tokens: list[str] = []
    kinds: list[str] = []
    in_variant_only = True
    for kind, changes, toks in draw(st.lists(base_mutations, min_size=0 if keep_variants else 1, max_size=3)):
        if all(apply_change(data, path, value) for path, value in changes):
            tokens += toks
            kinds.append(kind)
            in_variant_only = False
    if keep_variants:
        for _ in range(draw(st.integers(0 if tokens else 1, 2))):
            vname = draw(st.sampled_from(sorted(data["variants"])))
            kind, changes, toks = draw(variant_mutations)
            if all(apply_change(data["variants"][vname], path, value) for path, value in changes):
                tokens += toks
                kinds.append(f"variant: {kind}")
    assume(tokens)
    for kind in kinds:
        event(kind)
    return data, tokens, in_variant_only and keep_variants


# ----------------------------------------------------------------------------- the properties

@settings(FUZZ, max_examples=400)
@given(malformed_configs())
def test_malformed_config_fails_with_one_line(case):
    data, tokens, only_variants = case
    text = to_toml(data)
    assert same(tomllib.loads(text), data)  # the writer is exact: the config is what we meant
    status, out, err, _, started = run_cli(text)
    line = assert_one_line_error(status, out, err, started, tokens)
    event("error: " + re.sub(r"[^a-z ]", "", line.split("'")[0].split("=")[0].split(":")[1]).strip()[:20])
    if only_variants:
        assert line.startswith("error: variants."), line


@st.composite
def issue_named_violation(draw):
    """Exactly one of the violations the issue names, on the preset without variants."""
    which = draw(st.sampled_from(["gamma", "local_lr", "weight", "S>N", "ge1", "missing", "unknown"]))
    if which == "gamma":
        value = draw(st.one_of(st.floats(max_value=0, exclude_max=True), st.integers(-10**6, -1)))
        return [(("server", "gamma"), value)], "server.gamma"
    if which == "local_lr":
        return [(("algorithm", "local_lr"), draw(st.floats(max_value=0)))], "algorithm.local_lr"
    if which == "weight":
        value = draw(st.one_of(st.floats(max_value=0), st.floats(min_value=1), st.integers(-5, 0),
                               st.integers(1, 10**6)))
        return [(("server", "weight"), value)], "server.weight"
    if which == "S>N":
        n = draw(st.integers(1, 10**4))
        return [(("data", "num_clients"), n), (("algorithm", "clients_per_round"), n + draw(st.integers(1, 10**4)))], \
            "algorithm.clients_per_round"
    if which == "ge1":
        leaf = draw(st.sampled_from([leaf for leaf in RANGED if leaf.kind == "int" and leaf.ge == 1]))
        return [(leaf.path, draw(st.integers(-10**9, 0)))], ".".join(leaf.path)
    if which == "missing":
        path = draw(st.sampled_from(REQUIRED_KEYS))
        return [(path, DELETE)], ".".join(path)
    level = draw(st.sampled_from(sorted(FIELDS)))
    name = draw(identifiers.filter(lambda n: n not in FIELDS[level]))
    return [((*level, name), draw(scalars))], ".".join((*level, name))


@settings(FUZZ, max_examples=100)
@given(issue_named_violation())
def test_single_violation_names_its_key(case):
    changes, key = case
    data = copy.deepcopy(QUICKSTART)
    del data["variants"]
    for path, value in changes:
        assert apply_change(data, path, value)
    status, out, err, _, started = run_cli(to_toml(data))
    line = assert_one_line_error(status, out, err, started, [key])
    value = changes[-1][1]
    if value is not DELETE and not line.startswith("error: unknown key"):  # the line names the value too
        assert toml_value(value) in line or repr(value) in line, line


def _key_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.split("\n")) if re.match(r"\s*[A-Za-z_]\w*\s*=", line)]


def _header_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.split("\n")) if line.startswith("[")]


@st.composite
def broken_toml(draw):
    text = draw(st.sampled_from([QUICKSTART_TEXT, to_toml(QUICKSTART)]))
    lines = text.split("\n")
    how = draw(st.sampled_from(["drop ]", "extra [", "drop =", "duplicate key", "duplicate table",
                                "unterminated string", "random bytes", "truncate", "garbage line"]))
    if how == "drop ]":
        i = draw(st.sampled_from(_header_lines(text)))
        lines[i] = lines[i].replace("]", "", draw(st.integers(1, 2)))
    elif how == "extra [":
        i = draw(st.sampled_from(_header_lines(text) + _key_lines(text)))
        lines[i] = "[" + lines[i]
    elif how == "drop =":
        i = draw(st.sampled_from(_key_lines(text)))
        lines[i] = lines[i].replace("=", " ", 1)
    elif how == "duplicate key":
        i = draw(st.sampled_from(_key_lines(text)))
        lines.insert(i + 1, lines[i])
    elif how == "duplicate table":
        i = draw(st.sampled_from(_header_lines(text)))
        lines.append(lines[i])
    elif how == "unterminated string":
        i = draw(st.sampled_from([i for i in _key_lines(text) if lines[i].count('"') >= 2]))
        j = lines[i].rindex('"')
        lines[i] = lines[i][:j] + lines[i][j + 1:]
    elif how == "truncate":
        cut = draw(st.integers(1, len(text) - 1))
        lines = text[:cut].split("\n")
    elif how == "garbage line":
        i = draw(st.integers(0, len(lines)))
        lines.insert(i, draw(st.text(min_size=1, max_size=20).filter(lambda s: "\n" not in s)))
    broken = "\n".join(lines).encode("utf-8")
    if how == "random bytes":
        pos = draw(st.integers(0, len(broken)))
        broken = broken[:pos] + draw(st.binary(min_size=1, max_size=8)) + broken[pos:]
    try:
        tomllib.loads(broken.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    else:
        assume(False)  # still valid (e.g. the damage fell in a comment): not a broken file
    return how, broken


@settings(FUZZ, max_examples=150)
@given(broken_toml())
def test_broken_toml_fails_with_one_line(case):
    how, text = case
    status, out, err, path, started = run_cli(text)
    line = assert_one_line_error(status, out, err, started, ["TOML", "cannot be read"])
    event(how)
    assert repr(str(path)) in line  # names the file
    assert any(w in line for w in ("line", "end of document", "codec"))  # and where it breaks


def _inline(v) -> str:
    """A --set value text that parses back to ``v``: TOML, or a bare word for plain strings."""
    return toml_value(v)


@st.composite
def bad_set_items(draw):
    """One malformed --set argument and the tokens its error line must contain."""
    how = draw(st.sampled_from(["no =", "empty key", "unknown key", "wrong type", "out of range", "not a table"]))
    if how == "no =":
        item = draw(st.text(max_size=20).filter(lambda s: "=" not in s))
        return how, item, ["key=value"]
    if how == "empty key":
        key = draw(st.sampled_from(["", " ", ".", "..", "data.", ".rounds", "data..num_clients", "a.b..c", " .x"]))
        return how, f"{key}={draw(st.sampled_from(['1', 'x', 'true', '']))}", ["dotted key"]
    if how == "unknown key":
        level = draw(st.sampled_from(sorted(FIELDS)))
        name = draw(identifiers.filter(lambda n: n not in FIELDS[level]))
        deeper = draw(st.lists(identifiers, max_size=2))
        value = draw(st.one_of(scalars, lists, tables))
        return how, ".".join((*level, name, *deeper)) + "=" + _inline(value), [".".join((*level, name))]
    if how == "wrong type":
        leaf = draw(st.sampled_from(LEAVES))
        value = draw(wrong_type(leaf))
        text = _inline(value)
        if isinstance(value, str) and draw(st.booleans()) and value == value.strip():
            text = value  # as a bare word, when it is not a TOML value itself
            try:
                tomllib.loads(f"v = {value}")
                text = _inline(value)
            except tomllib.TOMLDecodeError:
                pass
        return how, ".".join(leaf.path) + "=" + text, [".".join(leaf.path)]
    if how == "out of range":
        leaf = draw(st.sampled_from(RANGED))
        return how, ".".join(leaf.path) + "=" + _inline(draw(out_of_range(leaf))), [".".join(leaf.path)]
    leaf = draw(st.sampled_from([leaf for leaf in LEAVES if leaf.path in
                                 {("rounds",), ("name",), ("seed",), ("data", "dataset"), ("data", "num_clients"),
                                  ("algorithm", "name"), ("algorithm", "local_lr"), ("server", "gamma")}]))
    sub = draw(st.lists(identifiers, min_size=1, max_size=2))
    return how, ".".join((*leaf.path, *sub)) + "=1", [f"'{leaf.path[-1]}' is not a table"]


@settings(FUZZ, max_examples=150)
@given(st.lists(bad_set_items(), min_size=1, max_size=3), st.booleans())
def test_malformed_set_arguments_fail_with_one_line(items, with_variants):
    data = copy.deepcopy(QUICKSTART)
    if not with_variants:
        del data["variants"]
    args, tokens = [], []
    for how, item, toks in items:
        event(how)
        args += ["--set", item]
        tokens += toks
    status, out, err, _, started = run_cli(to_toml(data), args)
    assert_one_line_error(status, out, err, started, tokens)


# ----------------------------------------------------------------------------- fixed cases

def test_valid_config_reaches_the_run_and_only_then():
    """Sanity check of the harness: the unmodified preset passes validation and would run."""
    with pytest.raises(RunStarted):
        run_cli(to_toml(QUICKSTART))
    with pytest.raises(RunStarted):
        run_cli(QUICKSTART_TEXT, ["--set", "rounds=2", "--set", "server.gamma=0.5"])


@pytest.mark.parametrize("extra, tokens", [
    (["--set", "rounds=0"], ["rounds = 0"]),
    (["--set", "server.gamma=-1"], ["server.gamma = -1"]),
    (["--set", "server.gamma=-0.001"], ["server.gamma = -0.001"]),
    (["--set", "algorithm.local_lr=0"], ["algorithm.local_lr = 0"]),
    (["--set", "server.weight=1.5"], ["server.weight = 1.5"]),
    (["--set", "server.weight=0"], ["server.weight = 0"]),
    (["--set", "algorithm.batch_size=0"], ["algorithm.batch_size = 0"]),
    (["--set", "rounds=2.5"], ["rounds = 2.5"]),
    (["--set", "rounds=ten"], ["rounds = 'ten'"]),
    (["--set", "data.dataset=svhn"], ["data.dataset = 'svhn'"]),
    (["--set", "algorithm.clients_per_round=21"], ["algorithm.clients_per_round = 21"]),
    (["--set", "data.num_clients=4"], ["data.num_clients = 4"]),
    (["--set", "variants.FSL.server.gamma=-2"], ["variants.FSL: server.gamma = -2"]),
    (["--set", "serverr.gamma=1"], ["unknown key 'serverr'"]),
    (["--set", "gamma"], ["--set 'gamma': expected key=value"]),
])
def test_known_bad_arguments(extra, tokens):
    status, out, err, _, started = run_cli(QUICKSTART_TEXT, extra)
    assert_one_line_error(status, out, err, started, tokens)


def test_missing_config_file():
    err = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="fedsl-fuzz-") as tmp, \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["run", str(Path(tmp) / "nope.toml"), "--out", str(Path(tmp) / "out"), "--quiet"])
    assert status == 2 and err.getvalue().startswith("error: config file") and err.getvalue().count("\n") == 1


def test_broken_json_config():
    status, out, err, path, started = run_cli('{"rounds": 3', suffix=".json")
    assert_one_line_error(status, out, err, started, ["not valid JSON"])


# ----------------------------------------------------------------------------- edge cases found by fuzzing

@pytest.mark.parametrize("text, extra", [
    (QUICKSTART_TEXT.split("[variants")[0] + '"a\\nb" = 1\n', []),
    (QUICKSTART_TEXT, ["--set", "a\nb=1"]),
    (QUICKSTART_TEXT + '\n[variants."x\\ny"]\nrounds = -1\n', []),
])
def test_newline_in_key_stays_on_one_line(text, extra):
    status, out, err, _, started = run_cli(text, extra)
    assert_one_line_error(status, out, err, started, ["a", "x"])


@pytest.mark.parametrize("text, extra, suffix", [
    ("v = " + "[" * 3000 + "]" * 3000 + "\n", [], ".toml"),
    ("[" * 3000 + "]" * 3000, [], ".json"),
    (QUICKSTART_TEXT, ["--set", "rounds=" + "[" * 3000 + "]" * 3000], ".toml"),
])
def test_deeply_nested_values(text, extra, suffix):
    status, out, err, _, started = run_cli(text, extra, suffix=suffix)
    assert_one_line_error(status, out, err, started, ["TOML", "JSON", "rounds"])


def test_error_line_is_printed_verbatim():
    status, out, err, _, started = run_cli(QUICKSTART_TEXT, ["--set", 'rounds=":cat:"'])
    assert_one_line_error(status, out, err, started, ["rounds = ':cat:'"])
