"""The ServerApp: holds D0 and the test set, runs ``FedslStrategy`` for the config's T rounds."""

from __future__ import annotations

from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedsl.flower.config import load_setup
from fedsl.flower.records import to_record
from fedsl.flower.strategy import FedslStrategy


def run_server(grid: Grid, context: Context, app_dir: str | Path | None = None) -> FedslStrategy:
    """Run the configured algorithm on ``grid``; returns the strategy (its ``state.x`` is x_T)."""
    setup = load_setup(context.run_config, app_dir)
    cfg = setup.cfg
    strategy = FedslStrategy(setup)
    log(INFO, "fedsl: %s, T=%d rounds, N=%d clients (partition ids 0..%d), S=%d per round, n0=%d on the server",
        setup.algorithm.name, cfg.rounds, setup.num_clients, setup.num_clients - 1, cfg.algorithm.clients_per_round,
        setup.fed.n0)
    strategy.start(grid, initial_arrays=to_record(strategy.state.x), num_rounds=cfg.rounds,
                   timeout=setup.options.round_timeout, evaluate_fn=strategy.evaluate)
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
