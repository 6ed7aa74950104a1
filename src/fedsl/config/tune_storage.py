"""Where ``fedsl tune`` keeps its Optuna studies (``tune.storage``).

Three kinds, one value each:

    'sqlite'    OUT/study.db, Optuna's embedded SQLite storage: nothing to start, one machine (the default, and what
                every existing tune folder holds)
    'journal'   OUT/study.journal, Optuna's journal file: one file, appended under its own lock; what Optuna
                advises for a folder shared over NFS (e.g. a Ray cluster's shared folder), where SQLite's locks fail
    a URL       a database server (PostgreSQL, MySQL) or an SQLite file at an absolute path: one database that
                workers on many machines, and many tune folders, share

A folder's studies are named after its variants; in a shared database each name is prefixed with a string unique to
the tune folder (``study_name``), so two folders' variants of the same name stay two studies.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedsl.config.base import ConfigError

STORAGE_KINDS = ("sqlite", "journal")  # besides a database URL
SQLITE_FILE = "study.db"
JOURNAL_FILE = "study.journal"

# Seconds a database server may take to answer a connection: an unreachable host fails the study's start in this
# time instead of hanging on the operating system's TCP timeout (minutes)
CONNECT_TIMEOUT_S = 10
# Each driver's name for that timeout (a driver not named here keeps its own default)
_TIMEOUT_ARG = {"psycopg2": "connect_timeout", "psycopg": "connect_timeout", "pg8000": "timeout",
                "mysqldb": "connect_timeout", "pymysql": "connect_timeout"}

# dialect[+driver]://rest: the databases Optuna's RDB storage supports (SQLAlchemy names them so)
_URL = re.compile(r"(?P<dialect>postgresql|mysql|mariadb|sqlite)(\+(?P<driver>\w+))?://(?P<rest>.*)", re.DOTALL)
_EXPECTED = "expected 'sqlite', 'journal' or a database URL such as 'postgresql://user@host/db'"
# user:password@ as SQLAlchemy reads it (the password runs to the next @), and password=... in the query (libpq
# reads both)
_USERINFO = re.compile(r"^(?P<head>[\w+]+://[^:/]*:)[^@]*(?=@)")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#]*", re.IGNORECASE)


def mask(url: str) -> str:
    """``url`` with its password shown as ``***``: a URL is printed in progress lines, errors and tune.json,
    which are shared; the password is not."""
    return _QUERY_PASSWORD.sub(r"\g<head>***", _USERINFO.sub(r"\g<head>***", url))


def check_storage(value: str) -> str:
    """``value`` if it is a ``tune.storage`` value: 'sqlite', 'journal', or a database URL ('postgresql://...',
    'postgresql+psycopg2://...', 'mysql://...', 'sqlite:////ABS/PATH'). Otherwise a ValueError of one line naming
    the value (its password masked) and what is expected: checked with the config, before any trial runs.
    Only the form is checked here; whether the database answers is ``open_storage``'s question."""
    if not isinstance(value, str):
        raise ValueError(f"tune.storage = {value!r}: {_EXPECTED}")
    if value in STORAGE_KINDS:
        return value
    shown = mask(value)
    if value.startswith("postgres://"):  # Heroku's and libpq's spelling, which SQLAlchemy refuses
        raise ValueError(f"tune.storage = {shown!r}: expected 'postgresql://...' (SQLAlchemy's name for "
                         "PostgreSQL), not 'postgres://...'")
    match = _URL.fullmatch(value)
    if match is None or not match["rest"].strip():
        raise ValueError(f"tune.storage = {shown!r}: {_EXPECTED}")
    if match["dialect"] == "sqlite" and not match["rest"].startswith("//"):
        # sqlite:///rel/path is relative to the working folder (the driver's and each worker's may differ) and
        # sqlite:// is a database in memory (gone with the process): neither keeps a study
        raise ValueError(f"tune.storage = {shown!r}: an SQLite URL names an absolute path, e.g. "
                         "'sqlite:////data/studies.db' (or 'sqlite' for the tune folder's own study.db)")
    return value


def open_storage(value: str, out: Path):
    """The Optuna storage for ``value`` (checked by ``check_storage``) and the tune folder ``out`` (which exists):

    'sqlite'   RDBStorage of OUT/study.db (embedded; the default)
    'journal'  JournalStorage of OUT/study.journal, appended under Optuna's symlink lock (safe on NFS; a lock left
               by a process killed while appending is taken over after Optuna's grace period, 30 s)
    a URL      RDBStorage of the URL: connections checked before use (``pool_pre_ping``: a server restarted
               under a long study costs no trial) and a connect timeout of CONNECT_TIMEOUT_S

    A database that cannot be reached, or whose driver is not installed, is a ConfigError of one line naming the
    URL (password masked) and the cause: raised here, when the study opens, within about CONNECT_TIMEOUT_S."""
    check_storage(value)
    try:
        import optuna
        import sqlalchemy.exc
    except ImportError:
        raise ConfigError("fedsl tune needs Optuna: pip install 'fedsl[tune]'") from None
    if value == "journal":
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(Path(out, JOURNAL_FILE).resolve())))
    if value == "sqlite":
        return optuna.storages.RDBStorage(f"sqlite:///{Path(out, SQLITE_FILE).resolve()}")
    where = f"tune.storage = {mask(value)!r}"
    try:
        # a URL without +driver has SQLAlchemy's default driver of its dialect (PostgreSQL's is psycopg from
        # SQLAlchemy 2.1, psycopg2 before: the [tune-postgres] extra's URLs name psycopg2)
        driver = sqlalchemy.engine.make_url(value).get_dialect().driver
        engine_kwargs: dict = {"pool_pre_ping": True}
        timeout_arg = _TIMEOUT_ARG.get(driver)
        if timeout_arg and f"{timeout_arg}=" not in value:  # a URL's own timeout stands
            engine_kwargs["connect_args"] = {timeout_arg: CONNECT_TIMEOUT_S}
        return optuna.storages.RDBStorage(value, engine_kwargs=engine_kwargs)
    except ImportError as e:  # Optuna's wrapper of the driver's ImportError
        cause = _first_line(e.__cause__ or e)
        raise ConfigError(f"{where}: its database driver is not installed ({cause}): expected the driver "
                          "installed, e.g. pip install 'fedsl[tune-postgres]' for "
                          "'postgresql+psycopg2://...'") from None
    except sqlalchemy.exc.ArgumentError as e:  # an unknown dialect or driver, a malformed URL
        raise ConfigError(f"{where}: not a URL SQLAlchemy can open ({_first_line(e)}): {_EXPECTED}") from None
    except sqlalchemy.exc.DBAPIError as e:  # OperationalError and kin: refused, timed out, no such database, ...
        cause = _connect_cause(e.orig if e.orig is not None else e)
        raise ConfigError(f"{where}: cannot connect ({cause}): expected a reachable database") from None


# The drivers' words for the common causes -> a short cause; any other keeps the driver's first line
_CAUSES = (
    ("connection refused", "connection refused"),
    ("timeout expired", f"no answer within {CONNECT_TIMEOUT_S} s"),
    ("timed out", f"no answer within {CONNECT_TIMEOUT_S} s"),
    ("could not translate host name", "unknown host"),
    ("name or service not known", "unknown host"),
)


def _connect_cause(error: BaseException) -> str:
    text = str(error).lower()
    for needle, cause in _CAUSES:
        if needle in text:
            return cause
    return _first_line(error)


def _first_line(error: BaseException) -> str:
    """The error's first non-empty line, masked and at most 200 characters: the message stays one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    line = mask(lines[0]) if lines else type(error).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def study_name(value: str, prefix: str, variant: str) -> str:
    """The name of ``variant``'s study. 'sqlite' and 'journal': the variant itself (the storage is the tune
    folder's own, one study per variant: what existing folders hold). A URL: ``PREFIX/VARIANT``, ``prefix``
    unique to the tune folder, since a shared database holds many folders' studies, their variants often alike."""
    if value in STORAGE_KINDS:
        return variant
    return f"{prefix}/{variant}"


def describe_storage(value: str, out: Path) -> str:
    """Where the studies are, for progress lines and docs: 'OUT/study.db (SQLite)', 'OUT/study.journal (Optuna
    journal)' or the URL with its password masked."""
    if value == "sqlite":
        return f"{Path(out, SQLITE_FILE)} (SQLite)"
    if value == "journal":
        return f"{Path(out, JOURNAL_FILE)} (Optuna journal)"
    return mask(value)
