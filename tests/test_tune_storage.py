"""tune.storage: where fedsl tune keeps its Optuna studies. Each kind (the tune folder's SQLite file, Optuna's journal
file, a real PostgreSQL server, ``postgres_url`` in conftest.py) keeps a study across storage objects and across a
process killed with kill -9; a bad value or an unreachable database is one line, its password never shown."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsl.config.schema import ConfigError
from fedsl.config.tune_storage import (
    CONNECT_TIMEOUT_S,
    JOURNAL_FILE,
    SQLITE_FILE,
    check_storage,
    describe_storage,
    mask,
    open_storage,
    study_name,
)


@pytest.mark.parametrize("value", ["sqlite", "journal", "postgresql://user@host/db",
                                   "postgresql+psycopg2://u:pw@db.example:5432/studies", "mysql://u@h/db",
                                   "mysql+pymysql://u@h:3306/db", "sqlite:////abs/path/studies.db",
                                   "postgresql+psycopg2://postgres@/fedsl?host=/tmp/sock&port=5433"])
def test_check_storage_accepts(value):
    assert check_storage(value) == value


@pytest.mark.parametrize("value, words", [
    ("postgres", "expected 'sqlite', 'journal' or a database URL such as 'postgresql://user@host/db'"),
    ("SQLite", "expected 'sqlite', 'journal'"),
    ("", "expected 'sqlite', 'journal'"),
    ("journal\n", "expected 'sqlite', 'journal'"),
    ("http://host/db", "expected 'sqlite', 'journal'"),
    ("postgresql://", "expected 'sqlite', 'journal'"),
    ("postgres://u:secret@h/db", "expected 'postgresql://...'"),
    ("sqlite:///relative.db", "absolute path"),
    ("sqlite://", "expected 'sqlite', 'journal'"),
    (3, "expected 'sqlite', 'journal'"),
])
def test_check_storage_refuses_in_one_line(value, words):
    with pytest.raises(ValueError) as e:
        check_storage(value)
    message = str(e.value)
    assert "\n" not in message and words in message
    assert message.startswith(f"tune.storage = {mask(value) if isinstance(value, str) else value!r}:")
    assert "secret" not in message


def test_mask_hides_the_password():
    assert mask("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    # the password as SQLAlchemy reads it: up to the first @, whatever else it holds
    engine = pytest.importorskip("sqlalchemy.engine")
    for url in ("postgresql+psycopg2://u:s/c:r@h/db", "postgresql://u:se/c?r#t@h:5/db", "mysql://u:p%40ss@h/db",
                "postgresql://:pw@h/db"):
        assert mask(url) == engine.make_url(url).render_as_string(hide_password=True)
    assert mask("postgresql://u@/db?host=/s&password=secret&port=1") == "postgresql://u@/db?host=/s&password=***&port=1"
    for plain in ("postgresql://u@h/db", "sqlite:////a/b.db", "sqlite", "journal", "postgresql://h:5432/db"):
        assert mask(plain) == plain


def test_study_name_and_description(tmp_path):
    assert study_name("sqlite", "ab12", "fsl") == study_name("journal", "ab12", "fsl") == "fsl"
    assert study_name("postgresql://h/db", "ab12", "fsl") == "ab12/fsl"
    assert study_name("sqlite:////x/s.db", "ab12", "fsl") == "ab12/fsl"  # a URL may be shared, even an SQLite one
    assert describe_storage("sqlite", tmp_path) == f"{tmp_path / SQLITE_FILE} (SQLite)"
    assert describe_storage("journal", tmp_path) == f"{tmp_path / JOURNAL_FILE} (Optuna journal)"
    assert describe_storage("postgresql://u:pw@h/db", tmp_path) == "postgresql://u:***@h/db"


optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

KINDS = ["sqlite", "journal", "postgres"]


@pytest.fixture(params=KINDS)
def storage_value(request, tmp_path):
    """Each kind of tune.storage: the tune folder's own files, then a real PostgreSQL server's database."""
    return request.getfixturevalue("postgres_url") if request.param == "postgres" else request.param


def _trials(value: str, out: Path, name: str) -> list[tuple[str, float | None, dict]]:
    """The study's trials as read through a fresh storage object (nothing cached from the writer's)."""
    study = optuna.load_study(study_name=name, storage=open_storage(value, out))
    return [(t.state.name, t.value, t.params) for t in study.trials]


def test_a_study_persists_across_storage_objects(storage_value, tmp_path):
    name = study_name(storage_value, "folder-a", "fsl")
    study = optuna.create_study(study_name=name, storage=open_storage(storage_value, tmp_path),
                                direction="maximize", load_if_exists=True)
    for i in range(3):
        trial = study.ask()
        trial.suggest_float("lr", 1e-3, 1.0, log=True)
        study.tell(trial, 0.1 * i)
    expected = [(t.state.name, t.value, t.params) for t in study.trials]
    assert [state for state, _, _ in expected] == ["COMPLETE"] * 3
    assert _trials(storage_value, tmp_path, name) == expected
    # load_if_exists: a second opening continues the study, it does not start another
    again = optuna.create_study(study_name=name, storage=open_storage(storage_value, tmp_path),
                                direction="maximize", load_if_exists=True)
    assert len(again.trials) == 3
    if storage_value in ("sqlite", "journal"):
        kept = {"sqlite": SQLITE_FILE, "journal": JOURNAL_FILE}[storage_value]
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [kept]
    else:
        # a shared database: another folder's variant of the same name is another study
        other = optuna.create_study(study_name=study_name(storage_value, "folder-b", "fsl"),
                                    storage=open_storage(storage_value, tmp_path / "b"), load_if_exists=True)
        assert other.trials == [] and len(_trials(storage_value, tmp_path, name)) == 3
        assert list(tmp_path.iterdir()) == []  # nothing in the tune folder


# A child that opens the storage, tells 2 trials, asks a third and waits (for kill -9) once it says so
CHILD = """
import pathlib, sys, time
import optuna
from fedsl.config.tune_storage import open_storage, study_name
value, out, ready = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
study = optuna.create_study(study_name=study_name(value, "folder-a", "fsl"), storage=open_storage(value, out),
                            direction="maximize", load_if_exists=True)
for i in range(2):
    trial = study.ask()
    trial.suggest_float("lr", 1e-3, 1.0, log=True)
    study.tell(trial, 0.5 + 0.1 * i)
study.ask().suggest_float("lr", 1e-3, 1.0, log=True)
ready.write_text("asked")
while True:
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_study_killed_with_kill_9_resumes(storage_value, tmp_path):
    out, ready = tmp_path / "tune", tmp_path / "ready"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, storage_value, str(out), str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), proc.communicate(timeout=30)[0].decode()[-3000:] if proc.poll() is not None else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    name = study_name(storage_value, "folder-a", "fsl")
    states = [state for state, _, _ in _trials(storage_value, out, name)]
    assert states == ["COMPLETE", "COMPLETE", "RUNNING"]
    study = optuna.load_study(study_name=name, storage=open_storage(storage_value, out))
    trial = study.ask()
    trial.suggest_float("lr", 1e-3, 1.0, log=True)
    study.tell(trial, 0.9)
    trials = _trials(storage_value, out, name)
    assert [state for state, _, _ in trials] == ["COMPLETE", "COMPLETE", "RUNNING", "COMPLETE"]
    assert [value for _, value, _ in trials] == [0.5, 0.6, None, 0.9]
    assert [t.number for t in study.trials] == [0, 1, 2, 3]


def test_an_unreachable_database_is_one_line_without_its_password(tmp_path):
    pytest.importorskip("psycopg2")
    url = "postgresql+psycopg2://u:secret@127.0.0.1:1/x"
    start = time.monotonic()
    with pytest.raises(ConfigError) as e:
        open_storage(url, tmp_path)
    assert time.monotonic() - start < 15
    message = str(e.value)
    assert message == ("tune.storage = 'postgresql+psycopg2://u:***@127.0.0.1:1/x': cannot connect (connection "
                       "refused): expected a reachable database")


@pytest.mark.slow
def test_a_server_that_never_answers_fails_within_the_connect_timeout(tmp_path):
    """A host that takes the connection and then says nothing (a firewall, a hung server): the study's start fails
    after CONNECT_TIMEOUT_S instead of hanging."""
    pytest.importorskip("psycopg2")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # the kernel completes the handshake; nobody ever reads or writes
        url = f"postgresql+psycopg2://u:secret@127.0.0.1:{silent.getsockname()[1]}/x"
        start = time.monotonic()
        with pytest.raises(ConfigError) as e:
            open_storage(url, tmp_path)
        took = time.monotonic() - start
    assert CONNECT_TIMEOUT_S - 1 < took < CONNECT_TIMEOUT_S + 10
    message = str(e.value)
    assert "\n" not in message and "secret" not in message
    assert f"cannot connect (no answer within {CONNECT_TIMEOUT_S} s)" in message


def test_a_missing_driver_is_one_line_naming_the_extra(tmp_path):
    import importlib.util

    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("mysqlclient is installed: its absence is what this test shows")
    with pytest.raises(ConfigError) as e:
        open_storage("mysql://u:secret@127.0.0.1:1/x", tmp_path)
    message = str(e.value)
    assert "\n" not in message and "secret" not in message
    assert message.startswith("tune.storage = 'mysql://u:***@127.0.0.1:1/x': its database driver is not installed "
                              "(No module named 'MySQLdb')")
