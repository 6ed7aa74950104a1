"""The ServerApp: holds D0 and the test set, runs ``FedslStrategy`` for the config's T rounds
(the rounds left after ``out-dir``'s checkpoint, when it resumes)."""

from __future__ import annotations

from logging import INFO, WARNING
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedsl.flower.config import load_setup
from fedsl.flower.grid import RoundGrid
from fedsl.flower.records import to_record
from fedsl.flower.secagg import run_secagg
from fedsl.flower.strategy import FedslStrategy


class NoClientUpdate(RuntimeError):
    """A run in which no client update was aggregated at all: the ServerApp fails (exits non-zero)."""


def run_server(grid: Grid, context: Context, app_dir: str | Path | None = None) -> FedslStrategy:
    """Run the configured algorithm on ``grid``; returns the strategy (its ``state.x`` is x_T).

    With ``out-dir`` set, the run continues from ``out-dir/checkpoint.pt`` when there is one (a
    ServerApp or SuperLink that crashed: start the same run again) unless ``resume = false``.
    With ``secagg = true`` the rounds run under Flower's SecAgg+ (``fedsl.flower.secagg``).

    Raises:
        strategy.NoNodes: no node to train within ``node-wait`` at this ServerApp's first round, or at a later one
            after every node was lost (with min-nodes ≥ 1); ``failed.json`` says so, and the rounds done are in the
            checkpoint (when ``checkpoint_every`` > 0) for the run repeated.
        NoClientUpdate: no round (of the whole run, a resumed one's included) aggregated any client
            update; ``final.pt`` and ``done.json`` are not written (a single empty round is a warning, and so
            are a resumed run's rounds when none of them had a client: the rounds before the resume had).
    """
    setup = load_setup(context.run_config, app_dir)
    cfg = setup.cfg
    if setup.options.user_keys:
        log(INFO, "fedsl: run config keys left to your code (not fedsl's): %s", ", ".join(setup.options.user_keys))
    if setup.options.secagg:
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
        n = len(strategy.history)
        rounds = "in the run's only round" if n == 1 else f"in any of the {n} rounds"
        failure = NoClientUpdate(f"fedsl: no client update was aggregated {rounds} "
                                 f"(every sampled client was missing, failed or sent an unusable reply; see "
                                 f"rounds.json and the log): the model is server learning alone, so the run failed")
        strategy.fail(str(failure))  # out-dir/failed.json: `flwr run` itself exits 0 whatever the ServerApp did
        raise failure
    resumed = [h for h in strategy.history if h["round"] > strategy.offset]
    if strategy.offset and resumed and not any(h["trained"] for h in resumed):
        # The rounds before the resume had clients, so the run completes; but nobody trained since, which is what
        # a SuperLink restarted alone on in-memory state looks like (Flower's SuperNodes do not register with it again)
        log(WARNING, "fedsl: no client update was aggregated in the %d rounds since the resume at round %d: x_T is "
            "the checkpoint's model with server learning alone (after a SuperLink restart, restart the SuperNodes "
            "too)", len(resumed), strategy.offset + 1)
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
