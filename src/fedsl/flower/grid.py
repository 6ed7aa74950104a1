"""The Grid a fedsl ServerApp sends its rounds through: Flower's, polling faster and bounding a straggler's cost.

Both ways a ServerApp runs (``server``: the message-API strategy; ``secagg``: Flower's SecAgg+ workflow) wrap
Flower's Grid in ``RoundGrid``; SecAgg+'s ``AuditGrid`` extends it to record every reply.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid


class RoundGrid:
    """Flower's Grid whose ``send_and_receive`` polls every ``poll`` seconds (Flower's: 3 s) and,
    with ``straggler`` set, stops waiting that many seconds after the first reply arrived.

    A crashed SuperNode never replies, and the SuperLink declares it gone only after two
    missed 30 s heartbeats; ``straggler`` bounds what one such node costs a round without
    a tight ``round-timeout`` that would also cut off slow but healthy clients.
    """

    def __init__(self, grid: Grid, poll: float = 0.5, straggler: float | None = None) -> None:
        self.grid, self.poll, self.straggler = grid, poll, straggler

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        waiting = set(self.grid.push_messages(messages))
        start, first = time.monotonic(), None
        replies: list[Message] = []
        while waiting:
            got = list(self.grid.pull_messages(waiting))
            if got and first is None:
                first = time.monotonic()
            replies.extend(got)
            waiting -= {m.metadata.reply_to_message_id for m in got}
            now = time.monotonic()
            if not waiting or (timeout is not None and now - start >= timeout) or \
                    (first is not None and self.straggler is not None and now - first >= self.straggler):
                break
            time.sleep(self.poll)
        return replies
