"""The ServerApp: holds D0 and the test set, runs ``FedslStrategy`` for the config's T rounds
(the rounds left after ``out-dir``'s checkpoint, when it resumes)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedsl.flower.config import load_setup
from fedsl.flower.records import to_record
from fedsl.flower.strategy import FedslStrategy


class NoClientUpdate(RuntimeError):
    """A run in which no client update was aggregated at all: the ServerApp fails (exits non-zero)."""


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


def run_server(grid: Grid, context: Context, app_dir: str | Path | None = None) -> FedslStrategy:
    """Run the configured algorithm on ``grid``; returns the strategy (its ``state.x`` is x_T).

    With ``out-dir`` set, the run continues from ``out-dir/checkpoint.pt`` when there is one (a
    ServerApp or SuperLink that crashed: start the same run again) unless ``resume = false``.
    With ``secagg = true`` the rounds run under Flower's SecAgg+ (``fedsl.flower.secagg``).

    Raises:
        NoClientUpdate: no round (of the whole run, a resumed one's included) aggregated any client
            update; ``final.pt`` and ``done.json`` are not written (a single empty round is a warning).
    """
    setup = load_setup(context.run_config, app_dir)
    cfg = setup.cfg
    if setup.options.user_keys:
        log(INFO, "fedsl: run config keys left to your code (not fedsl's): %s", ", ".join(setup.options.user_keys))
    if setup.options.secagg:
        from fedsl.flower.secagg import run_secagg  # here: secagg builds on this module's RoundGrid

        strategy = run_secagg(grid, context, setup)
        return _finish(strategy)
    strategy = FedslStrategy(setup)
    done = strategy.resume()  # the checkpoint's round in out-dir (0: none, or resume = false)
    if setup.options.open:
        log(INFO, "fedsl: %s, T=%d rounds, S=%d of the connected nodes per round, n0=%d on the server (an open "
            "federation: the clients own their data)", setup.algorithm.name, cfg.rounds,
            cfg.algorithm.clients_per_round, setup.fed.n0)
    else:
        log(INFO, "fedsl: %s, T=%d rounds, N=%d clients (partition ids 0..%d), S=%d per round, n0=%d on the server "
            "(federation = replay)", setup.algorithm.name, cfg.rounds, setup.num_clients, setup.num_clients - 1,
            cfg.algorithm.clients_per_round, setup.fed.n0)
        log(INFO, "fedsl: replay requires every SuperNode to run fedsl's ClientApp (or the replay protocol) with "
            "--node-config 'partition-id=I' and the config's data: the server checks each reply against the "
            "federation it rebuilt from the config")
    straggler = setup.options.straggler_timeout or None
    strategy.start(RoundGrid(grid, straggler=straggler), initial_arrays=to_record(strategy.state.x),
                   num_rounds=cfg.rounds - done, timeout=setup.options.round_timeout, evaluate_fn=strategy.evaluate)
    return _finish(strategy)


def _finish(strategy: FedslStrategy) -> FedslStrategy:
    """The run's end: it failed when no round aggregated a client update, else ``final.pt`` and ``done.json``."""
    if not any(h["trained"] for h in strategy.history):
        failure = NoClientUpdate(f"fedsl: no client update was aggregated in any of the {len(strategy.history)} "
                                 f"rounds (every sampled client was missing, failed or sent an unusable reply; see "
                                 f"rounds.json and the log): the model is server learning alone, so the run failed")
        strategy.fail(str(failure))  # out-dir/failed.json: `flwr run` itself exits 0 whatever the ServerApp did
        raise failure
    strategy.finish()
    if strategy.evaluations:
        last = strategy.evaluations[-1]
        log(INFO, "fedsl: final test accuracy %.4f (loss %.4f) after %d rounds", last["accuracy"], last["loss"],
            last["round"])
    return strategy


def make_server_app(app_dir: str | Path | None = None) -> ServerApp:
    """A Flower ServerApp running fedsl (``app_dir``: where a relative ``config-file`` is found)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, context, app_dir)

    return app
