"""The linter CI runs: ``ruff check`` with the project's rules (``[tool.ruff]`` in pyproject.toml, line length 120)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTED = ["src", "tests", "benchmarks", "reproduction", "docs", "examples"]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")  # the [test] extra pins it; a bare install skips
    # --no-cache: nothing written into the checkout
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *LINTED],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
