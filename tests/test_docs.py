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
    install = re.search(r'pip install -q -e "(\.\[[^\]]*\])"', ci).group(1)
    assert install in readme                            # one set-up command, CI's extras
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
