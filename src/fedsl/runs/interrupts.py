"""SIGTERM handled like Ctrl-C: batch schedulers, ``timeout`` and ``docker stop`` send SIGTERM.

Inside ``terminate_as_interrupt()`` a SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``),
so the runner's Ctrl-C path runs: a final checkpoint, summary.json with status
``interrupted``, and the run resumes with ``fedsl resume``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (exit status 143 = 128 + 15)."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into ``Terminated`` while the block runs (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        # a second SIGTERM while the first one's checkpoint is being written is ignored, so the
        # checkpoint completes; kill -9 still stops the process
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
