"""The command line's rough edges (issue 17): what a newcomer tripped over, each pinned by a test."""

from __future__ import annotations

import os
import subprocess
import sys


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
