"""Downloads with checksums, a progress bar and resumable partial files.

``fetch(url, dest, checksum)`` returns ``dest`` if it exists with the right checksum;
otherwise it downloads to ``dest.part`` (continuing a previous partial download with an
HTTP Range request), verifies the checksum and renames. Nothing is downloaded when the
file is already there, so an offline machine with the files in place never touches
the network.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from fedsl.data.errors import DataError

CHUNK = 1 << 20


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


def fetch(url: str, dest: str | Path, checksum: str | None = None, *, timeout: float = 60.0) -> Path:
    """Make sure ``dest`` holds the file at ``url`` with ``checksum``; download it if needed."""
    dest = Path(dest)
    if dest.is_file():
        if verify(dest, checksum):
            return dest
        raise DataError(f"{dest} has the wrong checksum (expected {checksum}): delete it to download it again, "
                        "or replace it with the publisher's file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            if have and resp.status != 206:  # server ignored the Range: start over
                have = 0
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length is not None else None
            with open(part, "ab" if have else "wb") as f:
                done = have
                while block := resp.read(CHUNK):
                    f.write(block)
                    done += len(block)
                    _progress(dest.name, done, total)
        if sys.stderr.isatty():
            sys.stderr.write("\n")
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
        raise DataError(f"cannot download {url} ({e}); the partial file {part} is kept and the next try resumes it. "
                        f"Offline, put the file at {dest}") from None
    if total is not None and part.stat().st_size < total:
        raise DataError(f"download of {url} stopped at {part.stat().st_size} of {total} bytes; "
                        "run again to resume it")
    if not verify(part, checksum):
        part.unlink()
        raise DataError(f"downloaded {url} but its checksum is not {checksum}: the file was removed; "
                        "try again, or download it by hand to " + str(dest))
    os.replace(part, dest)
    return dest
