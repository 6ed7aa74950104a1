"""The documentation site builds strictly (a broken link, a bad reference or a docstring warning fails),
the README stays a newcomer's first page, every config and Python block of the README and docs/ runs as copied,
and no page starts or ends mid-sentence."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # as the README writes the command: no warning at all (a griffe warning about a docstring, a dead anchor)
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    # generated from the schema: a plain key, a nested one and a rule's own hyper-parameter (from its spec)
    for key in ("eval_final_window", "server.gamma", "algorithm.mu"):
        assert f"<code>{key}</code>" in config, key
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "fedsl resume" in cli and "--parallel" in cli


def test_the_readme_is_short_and_gives_the_three_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"^\.venv/bin/(python -m pytest.*)$", ci, re.M).group(1)
    assert test_command in readme                       # the README's test command is exactly what CI runs
    assert "fedsl run --preset quickstart" in readme    # the main job
    extras = re.search(r'^EXTRAS="(\.\[[^\]]*\])"$', ci, re.M).group(1)
    assert f'pip install -e "{extras}"' in readme       # one set-up command, CI's extras
    assert ci.count('-e "$EXTRAS"') == 2                # uv and pip's fallback install the same
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link


def _python_of(page: Path) -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))


def test_the_python_api_tutorial_runs_as_written_twice_alike_on_a_busy_machine(tmp_path, monkeypatch):
    """python-api.md's code, pasted twice into one session on a busy machine, with torch's default threads: the
    simulator takes the command line's thread rule (one thread here, where torch's default two spin on each other
    many times slower), and the model it builds is drawn from the seed, so both pastes print the same numbers (an
    unseeded module drew a new x_0 from the global generator each time). The model learns (0.832 measured)."""
    import os

    import torch

    from fedsl.core import threads

    cores = os.cpu_count() or 1
    monkeypatch.setattr(threads, "_chosen", None)  # the rule decides afresh, seeing a machine whose cores are busy
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cores), float(cores), float(cores)))
    monkeypatch.chdir(tmp_path)
    code = compile(_python_of(ROOT / "docs" / "tutorials" / "python-api.md"), "python-api.md", "exec")
    before, numbers = torch.get_num_threads(), []
    try:
        for _ in range(2):
            torch.set_num_threads(cores)  # torch's default in a fresh session: one thread per core
            namespace: dict = {}
            exec(code, namespace)  # noqa: S102 - the repository's own documentation
            assert torch.get_num_threads() == 1  # the busy machine's automatic number, not torch's default
            numbers.append(namespace["sim"].evaluate(namespace["state"].x))
    finally:
        torch.set_num_threads(before)
    assert numbers[0] == numbers[1], numbers
    accuracy, loss = numbers[0]
    assert accuracy > 0.6 and loss == loss, (accuracy, loss)


def _code_segments(text: str):
    """(line number, code) of a Markdown text's fenced block lines, `inline code` spans, and indented lines that
    start a command (an indented code block; other indented lines are a list's prose); a command continued with
    a trailing backslash is one segment, at its first line."""
    fenced, held = False, None  # held: (first line number, text so far) of a command continued with "\\"
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        line = line.rstrip()
        if held or fenced or (line.startswith("    ") and
                              re.match(r"(\$ )?(nohup )?(\w+=\S+ )*(\S*/)?fedsl ", line.strip())):
            start, line = (held[0], held[1] + " " + line.strip()) if held else (i, line.strip())
            held = (start, line[:-1]) if line.endswith("\\") else None
            if held is None:
                yield start, line
        else:
            yield from ((i, span) for span in re.findall(r"`([^`]+)`", line))


def _preset_problem(command: str) -> str | None:
    """What is wrong with a documented command's preset, --set values and --variants (None: nothing, or not
    checkable: no preset, or placeholders such as $EM or V)."""
    import shlex

    from fedsl.config import loading, presets

    try:
        words = shlex.split(command)
    except ValueError:
        return None
    preset = variants = None
    sets, quick = [], "--quick" in words
    for k, w in enumerate(words[:-1]):
        if w in ("--preset", "-p"):
            preset = words[k + 1]
        elif w in ("--set", "-s"):
            sets.append(words[k + 1])
        elif w == "--variants":
            variants = words[k + 1]
    if preset not in presets.names() or any("$" in v or "<" in v for v in sets):
        return None
    raw = presets.load(preset)
    try:
        loading.load(base=raw, overrides=sets, quick=quick)
    except Exception as e:  # noqa: BLE001 - any refusal is the finding
        return f"--preset {preset} {' '.join(sets)}: {str(e).splitlines()[0]}"
    if variants and not variants.startswith("$") and variants != "V":
        unknown = [v for v in variants.split(",") if v not in raw.get("variants", {})]
        if unknown:
            return f"--preset {preset} has no variants {unknown}"
    return None


def test_the_documented_commands_exist():
    """Every `fedsl ...` command in the README, REPRODUCTION.md, docs/, benchmarks/ and examples/ names a command
    the CLI has, options that command takes, and presets that exist; a preset's --set values validate and its
    --variants exist. A renamed option, key or variant fails here, not in a reader's hands."""
    import click
    import typer

    from fedsl.cli import app
    from fedsl.config import presets

    def walk(c, path=()):
        if isinstance(c, click.Group):
            for n, sub in c.commands.items():
                yield from walk(sub, (*path, n))
        else:
            yield path, {o for p in c.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}

    commands = dict(walk(typer.main.get_command(app)))
    groups = {k[0] for k in commands if len(k) == 2}
    files = [ROOT / "README.md", ROOT / "REPRODUCTION.md", *ROOT.glob("reproduction/pages/*.md"),
             *ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/*.md"), *ROOT.glob("examples/**/*.md")]
    bad, checked = [], 0
    for f in files:
        for i, code in _code_segments(f.read_text()):
            code = code.split("#")[0]  # a shell or TOML comment's words are prose
            if code.lstrip().startswith(("from ", "import ")):  # Python
                continue
            for m in re.finditer(r"(?:^|[\s(;&|])(?:\S*/)?fedsl ([a-z][a-z-]*(?: [^;&|#]*)?)", code):
                words = m.group(1).split()
                key = tuple(words[:2]) if words[0] in groups and len(words) > 1 else (words[0],)
                where = f"{f.relative_to(ROOT)}:{i}"
                if key not in commands:
                    bad.append(f"{where}: no command 'fedsl {' '.join(key)}'")
                    continue
                checked += 1
                for w in words[len(key):]:
                    opt = w.split("=")[0]
                    if re.fullmatch(r"--?[a-z][a-z-]*", opt) and opt not in commands[key]:
                        bad.append(f"{where}: 'fedsl {' '.join(key)}' has no option {opt}")
                bad += [f"{where}: no preset {p!r}" for p in re.findall(r"--preset[ =]([\w.-]+)", code)
                        if p not in presets.names()]
                if problem := _preset_problem(m.group(1)):
                    bad.append(f"{where}: {problem}")
    assert not bad, "\n".join(bad)
    assert checked >= 40, checked  # the scan finds the commands (138 on 2026-11-28)


# ----------------------------------------------------------------------------- the docs' code blocks, run

DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
# A block that cannot run by itself (an element of a table in a source file) says so in the line above it:
# <!-- fragment: the entry of DATASETS in src/fedsl/data/registry.py --> ; its lines must then be that file's.
FRAGMENT = re.compile(r"<!-- fragment: (.*?) -->")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page: its language, first line number, code (the fence's indent removed) and
    the fragment marker above it (None: the block runs as copied)."""

    page: Path
    line: int
    lang: str
    code: str
    fragment: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(lang: str | None = None) -> list[Block]:
    """The fenced blocks of the README and docs/ (of language ``lang``; None: every one), in page order."""
    out = []
    for page in DOC_PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if m := re.fullmatch(r"( *)```(\w*)\s*", lines[i]):
                indent, end = len(m.group(1)), i + 1
                while not re.fullmatch(r" *```\s*", lines[end]):
                    end += 1
                above = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
                marker = FRAGMENT.fullmatch(above)
                if lang is None or m.group(2) == lang:
                    out.append(Block(page, i + 1, m.group(2), "".join(s[indent:] + "\n" for s in lines[i + 1:end]),
                                     marker.group(1) if marker else None))
                i = end
            i += 1
    return out


def _readme_config(rounds: int) -> str:
    """The README's config (*A run is a TOML file*: the `my.toml` the docs' Python runs) at ``rounds`` rounds."""
    block = next(b.code for b in _blocks("toml") if b.page.name == "README.md")
    text, n = re.subn(r"^rounds = \d+", f"rounds = {rounds}", block, flags=re.M)
    assert n == 1, block
    return text


def _tiny(data: dict, part: dict) -> dict:
    """A documented config at a tiny size: one round, its first seed and the first value of each swept key; the
    quickstart's synthetic characters cut to 100 training and 10 test images a class where the block does not
    set them (n_i = 50, K = 3 steps). Every other key is the block's (e.g. its 100,000 clients)."""
    data = {**data, "rounds": 1}
    data.pop("quick", None)
    if isinstance(data.get("seeds"), list):
        data["seeds"] = data["seeds"][:1]
    if isinstance(data.get("sweep"), dict):
        data["sweep"] = {k: v[:1] for k, v in data["sweep"].items()}
    given = part.get("data", {})
    if data["data"]["dataset"] == "synthetic_chars" and not {"train_per_class", "test_per_class"} & set(given):
        data["data"] = {**data["data"], "train_per_class": 100, "test_per_class": 10}
    return data


TOML_BLOCKS = _blocks("toml")


def test_the_docs_have_config_blocks():
    assert len(TOML_BLOCKS) >= 15, [b.where for b in TOML_BLOCKS]  # 17 on 2026-11-28


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in TOML_BLOCKS])
def test_a_documented_config_runs(block, tmp_path, one_thread):
    """Every ```toml block of the README and docs/ runs as copied: a fedsl config, or a part of one merged into
    the quickstart preset, through `fedsl run`'s own steps (validation, every run's build and data checks, the
    group's runs) at a tiny size (``_tiny``), each run completed. A Flower App's run config (Flower's keys, e.g.
    ``federation``) goes through ``parse_run_config`` over the example app's; the flwr CLI's [superlink.*] is
    Flower's own. A block that names a placeholder folder (``/path/to/...``) stops at its data, and only there; one
    whose placeholder is the data root (``/path/to/data``) runs on the offline data where it holds the dataset."""
    import tomllib

    from fedsl.config import loading, presets
    from fedsl.config.expand import expand_variants
    from fedsl.config.schema import ConfigError
    from fedsl.runs.build import check_all
    from fedsl.sources import hf_files
    from fedsl.sweeps.compare import run_group

    part = tomllib.loads(block.code)
    if "superlink" in part:
        pytest.skip("the flwr CLI's connection to a SuperLink ([superlink.*]), not a fedsl or Flower App config")
    if {"federation", "secagg"} & set(part):
        pytest.importorskip("flwr")
        from flwr.common.config import flatten_dict

        from fedsl.flower import parse_run_config
        app = ROOT / "examples" / "flower-app"
        app_config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
        parse_run_config({**flatten_dict(app_config), **flatten_dict(part)}, app)
        return
    data = _tiny(loading.deep_merge(presets.load("quickstart"), part), part)
    folder = str(part.get("data", {}).get("data_dir", ""))
    shipped = shared_data_dir()
    if folder == "/path/to/data" and (shipped / part["data"]["dataset"]).is_dir():
        # the offline data root stands for the reader's: the block runs at its written sizes on the shipped data
        data["data"] = {**data["data"], "data_dir": str(shipped)}
        folder = str(shipped)
    if folder.startswith("/path/to/"):  # the reader's files: absent here, and the one thing missing
        from fedsl.core.errors import DataError
        with pytest.raises((ConfigError, DataError)) as e:
            check_all(expand_variants(loading.load(base=data)))
        why = str(e.value)
        missing = ("pip install 'fedsl[natural]'" if part["data"]["dataset"] == "hf_files" and hf_files.missing()
                   else folder)
        assert missing in why and "\n" not in why, why
        return
    cfg = loading.load(base=data)
    runs = expand_variants(cfg)
    said: list[str] = []
    summaries = run_group(cfg, tmp_path / "runs", log=said.append, progress=False, built=check_all(runs))
    assert [(s["status"], s["rounds_done"]) for s in summaries] == [("completed", 1)] * len(runs), said
    assert all(0 <= s["final_accuracy"] <= 1 for s in summaries), summaries


# python-api.md runs in its own test, twice and on a busy machine
PYTHON_PAGES = sorted({b.page for b in _blocks("python")} - {ROOT / "docs" / "tutorials" / "python-api.md"})
# What a page's Python reads that the reader brings: the README's config as `my.toml`, at a tiny size.
READERS_FILES = {"my.toml": lambda: _readme_config(rounds=2)}


def test_the_docs_have_python_pages():
    """The pages whose ```python blocks ``test_a_pages_python_runs_as_copied`` runs: every page's but the Python
    API tutorial's, which its own test runs."""
    names = {p.name for p in PYTHON_PAGES}
    assert {"add-a-dataset.md", "privacy.md", "tracking.md", "add-an-algorithm.md"} <= names, names


@pytest.mark.parametrize("page", [pytest.param(p, id=str(p.relative_to(ROOT))) for p in PYTHON_PAGES])
def test_a_pages_python_runs_as_copied(page, tmp_path, monkeypatch, one_thread):
    """A page's ```python blocks, run in order in one namespace as a reader pastes them, in a fresh folder that
    holds the files the docs say the reader has (``READERS_FILES``: the README's `my.toml`). A block marked
    ``<!-- fragment: ... in PATH -->`` is a part of a source file instead: its lines must be that file's, in
    order; an unmarked block that does not run fails here."""
    monkeypatch.chdir(tmp_path)
    for name, text in READERS_FILES.items():
        (tmp_path / name).write_text(text())
    import types
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")  # a reader's file is a module (dataclasses)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for block in (b for b in _blocks("python") if b.page == page):
        if block.fragment is not None:
            source = re.search(r"\S+\.py\b", block.fragment)
            assert source, f"{block.where}: a fragment names the file it is a part of"
            lines_of_file = "\n" + (ROOT / source.group(0)).read_text()
            assert "\n" + block.code in lines_of_file, f"{block.where}: not lines of {source.group(0)}"
            continue
        exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102 - the repository's own documentation
    if page.name == "add-a-dataset.md":  # the module shown is the example's: the same images
        from fedsl.sources import toy
        shown, real = namespace["load"](None, None), toy.load(None, None)
        assert (shown.train.x == real.train.x).all() and (shown.test.y == real.test.y).all()


def test_no_python_hides_in_an_indented_block():
    """Python shown as an indented code block would not run in ``test_a_pages_python_runs_as_copied``: it is
    fenced as ```python instead."""
    bad = []
    for page in DOC_PAGES:
        fenced = False
        for i, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r" {4}(from \S+ import |import \S+$|class \w+\(|def \w+\()", line):
                bad.append(f"{page.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- whole sentences

SENTENCE_END = re.compile(r"[.:?!)][*_`\"')\]]*$")


def _paragraphs(text: str) -> list[tuple[int, list[str], str]]:
    """(first line, lines, what follows) of each paragraph of prose or of a list: lines between blank lines,
    headings, table rows, HTML comments and code; not indented code blocks, nor mkdocstrings' ``:::`` directives.
    What follows: "code" (a fenced or indented code block), "table", or "" (anything else, or the page's end)."""
    out, current, start, fenced = [], [], 0, False
    lines = text.splitlines()

    def close(i: int) -> None:
        nonlocal current
        if current and not current[0].startswith(("    ", ":::")):
            nxt = next((s for s in lines[i:] if s.strip()), "")
            follows = ""
            if nxt.lstrip().startswith("```") or nxt.startswith("    "):
                follows = "code"
            elif nxt.startswith("|"):
                follows = "table"
            out.append((start, current, follows))
        current = []

    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("```"):
            close(i - 1)
            fenced = not fenced
        elif fenced:
            continue
        elif not s or s.startswith(("#", "|", "<!--")):
            close(i - 1)
        else:
            if not current:
                start = i
            current.append(line)
    close(len(lines))
    return out


@pytest.mark.parametrize("page", [pytest.param(p, id=str(p.relative_to(ROOT))) for p in DOC_PAGES])
def test_no_page_starts_or_ends_mid_sentence(page):
    """A page opens with its `# ` title, and each paragraph (prose or a list) ends a sentence: with . : ? ! or )
    (closing quotes, backquotes, brackets and emphasis after it allowed), unless a code block follows that the
    sentence runs into ("Each file is" + a JSON example). The page's last paragraph ends one whatever follows.
    A prose paragraph that starts with a word in lower case continues a sentence: only after a code block or a
    table ("or `--set client_state.store=sparse`"), or with the project's name (fedsl); a formula may start one
    ("x_{t+1} = ..."). A page cut in two leaves one of these behind."""
    text = page.read_text()
    first = next(s for s in text.splitlines() if s.strip())
    assert first.startswith("# "), f"{page.relative_to(ROOT)} starts with {first!r}, not its title"
    lines, bad = text.splitlines(), []
    paragraphs = _paragraphs(text)
    for k, (start, par, follows) in enumerate(paragraphs):
        where = f"{page.relative_to(ROOT)}:{start}"
        last = k == len(paragraphs) - 1
        if not SENTENCE_END.search(par[-1].rstrip()) and (follows != "code" or last):
            bad.append(f"{where}: ends mid-sentence: ...{par[-1].strip()[-60:]!r}")
        before = next((s for s in reversed(lines[:start - 1]) if s.strip()), "")
        after_code = before.strip().startswith(("```", "|")) or before.startswith("    ")
        if re.match(r"[a-z]+('s)?[ ,;]", par[0]) and not par[0].startswith("fedsl ") and not after_code:
            bad.append(f"{where}: starts mid-sentence: {par[0].strip()[:60]!r}...")
    assert not bad, "\n".join(bad)
