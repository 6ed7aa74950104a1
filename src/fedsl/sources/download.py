"""Downloads with checksums, a progress bar and resumable partial files.

``fetch(url, dest, checksum)`` returns ``dest`` if it exists with the right checksum;
otherwise it downloads to ``dest.part`` (continuing a previous partial download with an
HTTP Range request), verifies the checksum and renames. Nothing is downloaded when the
file is already there, so an offline machine with the files in place never touches
the network.

Two limits keep a download from hanging: each read waits at most ``timeout`` seconds, and
the whole download at most ``deadline`` seconds (default ``$FEDSL_DOWNLOAD_DEADLINE``, else
30 minutes), so a server that trickles a byte now and then cannot hold a run forever. The
deadline is checked after every read, so it is overshot by at most one read's ``timeout``;
what arrived by then stays in ``dest.part`` and the next call resumes from it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from fedsl.core.errors import DataError

CHUNK = 1 << 20
DEFAULT_DEADLINE = 30 * 60.0  # seconds for one download, unless $FEDSL_DOWNLOAD_DEADLINE or deadline= says
DEADLINE_ENV = "FEDSL_DOWNLOAD_DEADLINE"


def download_deadline(deadline: float | None = None) -> float:
    """``deadline`` if given, else ``$FEDSL_DOWNLOAD_DEADLINE``, else 30 minutes (seconds, > 0)."""
    if deadline is None:
        raw = os.environ.get(DEADLINE_ENV)
        if raw is None or not raw.strip():
            return DEFAULT_DEADLINE
        try:
            deadline = float(raw)
        except ValueError:
            raise DataError(f"{DEADLINE_ENV} = {raw!r}: expected a number of seconds > 0") from None
        if not deadline > 0 or deadline == float("inf"):
            raise DataError(f"{DEADLINE_ENV} = {raw!r}: expected a number of seconds > 0")
        return deadline
    if not deadline > 0:
        raise DataError(f"deadline = {deadline!r}: expected a number of seconds > 0")
    return float(deadline)


def _kept(part: Path) -> str:
    """What a failure message says about the partial file: only when there is one to resume."""
    try:
        size = part.stat().st_size
    except OSError:
        return ""
    if not size:
        part.unlink(missing_ok=True)
        return ""
    return f"; the partial file {part} ({size:,} bytes) is kept and the next try resumes it"


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: str | Path, checksum: str | None) -> bool:
    """``checksum`` is 'md5:<hex>' or 'sha256:<hex>' (None: nothing to check)."""
    if checksum is None:
        return True
    algorithm, _, expected = checksum.partition(":")
    return file_digest(path, algorithm) == expected.lower()


def _progress(name: str, done: int, total: int | None) -> None:
    if not sys.stderr.isatty():
        return
    if total:
        bar = int(30 * done / total)
        sys.stderr.write(f"\r{name}: [{'#' * bar}{'.' * (30 - bar)}] {done / 2**20:.1f}/{total / 2**20:.1f} MiB")
    else:
        sys.stderr.write(f"\r{name}: {done / 2**20:.1f} MiB")
    sys.stderr.flush()


class _DeadlinePassed(Exception):
    def __init__(self, done: int):
        super().__init__(done)
        self.done = done


def fetch(url: str, dest: str | Path, checksum: str | None = None, *, timeout: float = 60.0,
          deadline: float | None = None) -> Path:
    """Make sure ``dest`` holds the file at ``url`` with ``checksum``; download it if needed.

    ``timeout``: seconds one read may wait; ``deadline``: seconds the whole download may take
    (see ``download_deadline``).
    """
    dest = Path(dest)
    if dest.is_file():
        if verify(dest, checksum):
            return dest
        raise DataError(f"{dest} has the wrong checksum (expected {checksum}): delete it to download it again, "
                        "or replace it with the publisher's file")
    limit = download_deadline(deadline)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    end = time.monotonic() + limit
    total = None
    try:
        with urllib.request.urlopen(request, timeout=min(timeout, limit)) as resp:
            if have and resp.status != 206:  # server ignored the Range: start over
                have = 0
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length is not None else None
            with open(part, "ab" if have else "wb") as f:
                done = have
                # read1: whatever has arrived (read(CHUNK) would wait for a whole MiB of a trickle)
                while block := resp.read1(CHUNK):
                    f.write(block)
                    done += len(block)
                    _progress(dest.name, done, total)
                    if time.monotonic() > end and (total is None or done < total):
                        raise _DeadlinePassed(done)
        if sys.stderr.isatty():
            sys.stderr.write("\n")
    except _DeadlinePassed as e:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        of = f" of {total:,}" if total is not None else ""
        raise DataError(f"download of {url} did not finish within its deadline of {limit:g} s (at {e.done:,}{of} "
                        f"bytes; expected it to finish in time, set {DEADLINE_ENV} to allow longer){_kept(part)}") \
            from None
    except urllib.error.HTTPError as e:
        if not (have and e.code == 416):  # 416: the partial file already holds every byte (or more)
            raise DataError(f"cannot download {url} (HTTP {e.code}); offline, put the file at {dest}") from None
        if verify(part, checksum):
            os.replace(part, dest)
            return dest
        part.unlink()
        raise DataError(f"{part} did not match {url} and the server refused to resume it: it was removed; "
                        "run again to download from the start") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as e:
        raise DataError(f"cannot download {url} ({e}){_kept(part)}; offline, put the file at {dest}") from None
    if total is not None and part.stat().st_size < total:
        raise DataError(f"download of {url} stopped at {part.stat().st_size} of {total} bytes; "
                        "run again to resume it")
    if not verify(part, checksum):
        part.unlink()
        raise DataError(f"downloaded {url} but its checksum is not {checksum}: the file was removed; "
                        "try again, or download it by hand to " + str(dest))
    os.replace(part, dest)
    return dest
