"""The documentation site builds strictly (a broken link, a bad reference or a docstring warning fails),
and the README stays a newcomer's first page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
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


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs" / "tutorials").glob("*.md")
                                        if "```python" in p.read_text()))
def test_a_tutorials_python_runs_as_written(page, tmp_path, monkeypatch, one_thread):
    """A tutorial's ```python blocks, run in order as a reader pastes them (in a fresh folder): a renamed import
    or a changed signature fails here, not in a reader's hands. python-api.md's model learns (0.844 measured)."""
    text = (ROOT / "docs" / "tutorials" / page).read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, page, "exec"), namespace)  # noqa: S102 - the repository's own documentation
    if page == "python-api.md":
        accuracy, loss = namespace["sim"].evaluate(namespace["state"].x)
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

    from fedsl.experiments import loading, presets

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
    from fedsl.experiments import presets

    def walk(c, path=()):
        if isinstance(c, click.Group):
            for n, sub in c.commands.items():
                yield from walk(sub, (*path, n))
        else:
            yield path, {o for p in c.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}

    commands = dict(walk(typer.main.get_command(app)))
    groups = {k[0] for k in commands if len(k) == 2}
    files = [ROOT / "README.md", ROOT / "REPRODUCTION.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/*.md"),
             *ROOT.glob("examples/**/*.md")]
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


def test_the_documented_configs_validate():
    """Every ```toml block of the README and docs/ validates: a fedsl config, or a part of one (merged into the
    quickstart preset), through the config's own checks; a Flower App's run config (it has Flower's keys, e.g.
    ``federation``) through ``parse_run_config`` over the example app's. The flwr CLI's [superlink.*] is Flower's."""
    import tomllib

    from fedsl.data import hf_files
    from fedsl.experiments import loading, presets

    base = presets.load("quickstart")
    checked, bad = 0, []
    for f in [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))]:
        for block in re.findall(r"```toml\n(.*?)```", f.read_text(), re.S):
            part = tomllib.loads(block)
            if "superlink" in part:
                continue
            try:
                if {"federation", "secagg"} & set(part):
                    pytest.importorskip("flwr")
                    from flwr.common.config import flatten_dict

                    from fedsl.flower import parse_run_config
                    app = ROOT / "examples" / "flower-app"
                    app_config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
                    parse_run_config({**flatten_dict(app_config), **flatten_dict(part)}, app)
                else:
                    if part.get("data", {}).get("dataset") == "hf_files" and hf_files.missing():
                        continue  # the [natural] extra, not installed here
                    loading.load(base=loading.deep_merge(base, part))
                checked += 1
            except Exception as e:  # noqa: BLE001 - any refusal is the finding
                bad.append(f"{f.relative_to(ROOT)}: {str(e).splitlines()[0][:300]}\n{block}")
    assert not bad, "\n".join(bad)
    assert checked >= 10, checked  # 13 blocks on 2026-11-28
