"""A sweep's runs as Ray tasks: ``fedsl run ... --ray ADDRESS`` (and ``fedsl resume``), the ``[ray]`` extra.

Design:

- **One task per unit** of the group: one run (a stack of runs where the driver sees a GPU),
  with declared resources: ``num_cpus`` = the config's ``threads`` (1 when automatic; the
  run then uses that many torch threads, as Ray sets ``OMP_NUM_THREADS``), ``num_gpus`` = 1
  for runs on CUDA (``device = "cuda"``, or ``"auto"`` when the cluster has GPUs), and
  ``memory`` when given (``--ray-resources``).
- **Results on a shared filesystem.** Each task writes its runs' files into the group
  folder itself, so the group folder must be visible under the same path on every node
  (NFS, a cluster filesystem; on one machine it is). The driver checks this: it leaves a
  token file in the group folder, and a task that cannot see it stops the sweep with one
  line naming the folder and the node. Everything else is unchanged: the same run folders,
  ``group.json`` and files as a serial run, so ``fedsl resume`` (with or without ``--ray``)
  and ``fedsl sweep status`` work on it as on any group.
- **Lost nodes.** A task whose node dies is retried by Ray (``max_retries``) on another node;
  the retry resumes its runs from their last checkpoints in the group folder (every
  ``checkpoint_every`` rounds), so no finished round is lost and the files equal an
  uninterrupted run's, bit for bit.
- **Progress** of the whole sweep shows in the driver: a line per finished run (status,
  accuracy, the node it ran on), and the runs' own log lines, which Ray forwards.

Ray is imported only here, and only when ``--ray`` is given.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
import warnings
from pathlib import Path
from typing import Callable

from fedsl.config.schema import ConfigError

Log = Callable[[str], None]
TOKEN = ".fedsl-ray-{}"  # the driver's token file in the group folder (visibility check)
MAX_RETRIES = 3
PASS_ENV = ("FEDSL_ALLOW_IMPORT", "FEDSL_CACHE", "FEDSL_DATA_DIR")  # the driver's settings that tasks need


class NotShared(RuntimeError):
    """The group folder is not visible on a task's node."""


def parse_resources(text: str | None) -> dict:
    """``--ray-resources 'cpus=2,gpus=0.5,memory=4GB'`` -> {"num_cpus": 2, "num_gpus": 0.5, "memory": bytes}."""
    if not text:
        return {}
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
    out: dict = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        try:
            v = float(value) if key in ("cpus", "gpus") else None
        except ValueError:
            v = None
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)?", value) if key == "memory" else None
        if key == "cpus" and v is not None and 0 < v <= 1024 or key == "gpus" and v is not None and 0 <= v <= 1024:
            out["num_" + key] = int(v) if v.is_integer() else v
        elif m and float(m.group(1)) > 0:
            out["memory"] = int(float(m.group(1)) * units[m.group(2) or ""])
        else:
            raise ConfigError(f"--ray-resources {text!r}: {part.strip()!r} is not understood: expected comma-separated "
                              "cpus=N (> 0), gpus=N (>= 0, fractions allowed), memory=SIZE (e.g. 4GB, 512MiB)")
    return out


def _check_address(address: str) -> None:
    """A reachable ``host:port`` (the head's GCS port, 6379 by default), else a one-line ConfigError."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray {address!r}: expected HOST:PORT of a Ray head node (e.g. 127.0.0.1:6379), "
                          "'auto' (the cluster this machine belongs to) or 'local' (start Ray on this machine)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise ConfigError(f"--ray {address!r}: no Ray head answers there ({e.strerror or e}): expected the "
                          "address printed by `ray start --head` (HOST:PORT)") from None


def _task(out: str, names: list[str], cfgs: list[dict], token: str, quiet: bool) -> tuple[str, dict[str, dict]]:
    """In a Ray worker: run one unit into the shared group folder ``out``."""

    from fedsl.config.schema import validate
    from fedsl.sweeps.compare import run_unit
    node = _seen(out, token, "group folder")

    def log(s: str) -> None:
        if not quiet:
            print(s, flush=True)

    return node, run_unit(Path(out), names, [validate(c) for c in cfgs], resume=True, log=log, progress=False)


def _seen(folder: str, token: str, what: str) -> str:
    """In a Ray worker: its node's id, once the driver's token file is seen in ``folder`` (NotShared otherwise)."""
    import ray
    node = ray.get_runtime_context().get_node_id()
    if not (Path(folder) / TOKEN.format(token)).is_file():
        raise NotShared(f"the {what} {folder!r} is not visible on node {node[:12]} ({socket.gethostname()}): --ray "
                        "needs the results folder on a filesystem shared by all nodes under the same path (--out)")
    return node


def _worker(fn: Callable, args: tuple, folder: str, token: str) -> None:
    """In a Ray worker: ``fn(*args)``, once the shared folder is seen to be the driver's."""
    _seen(folder, token, "folder")
    fn(*args)


def _token(folder: Path) -> tuple[str, Path]:
    """A new token and its file in ``folder``, which the tasks look for (is the folder shared?)."""
    token = secrets.token_hex(8)
    token_file = Path(folder) / TOKEN.format(token)
    token_file.write_text("fedsl --ray: this folder is visible to the tasks\n")
    return token, token_file


def _cancel(refs) -> None:
    """Cancel the tasks ``refs`` (Ctrl-C, SIGTERM, a failure): those running get a KeyboardInterrupt."""
    import ray
    for ref in refs:
        try:
            ray.cancel(ref)
        except Exception:  # noqa: BLE001 — finished or lost already
            pass


class RayBackend:
    """Run a group's units as tasks on a Ray cluster (``address``: HOST:PORT, 'auto' or 'local')."""

    def __init__(self, address: str, resources: dict | None = None, quiet: bool = False,
                 max_retries: int = MAX_RETRIES) -> None:
        self.address, self.resources, self.quiet, self.max_retries = address, dict(resources or {}), quiet, max_retries
        self.nodes: dict[str, str] = {}  # run -> node id it finished on (the last attempt's)

    def check(self) -> None:
        """Ray is installed and the address answers (a one-line ConfigError otherwise); joins nothing."""
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("--ray needs Ray: install fedsl with the ray extra (pip install -e '.[ray]')") from None
        if self.address not in ("auto", "local"):
            _check_address(self.address)

    def connect(self) -> None:
        """Connect to the cluster (a one-line ConfigError when Ray is missing or nothing answers)."""
        self.check()
        import ray
        if ray.is_initialized():
            return
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        kwargs = dict(logging_level="ERROR", log_to_driver=not self.quiet, configure_logging=True,
                      runtime_env={"env_vars": env} if env else None)
        # Ray's notice that a future version will leave CUDA_VISIBLE_DEVICES alone for tasks without
        # GPUs: today's behaviour (such tasks see no GPU) is the one fedsl wants
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
        try:
            if self.address == "local":
                ray.init(include_dashboard=False, **kwargs)
            else:
                ray.init(address=self.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"--ray {self.address!r}: could not join the Ray cluster ({first}): expected the "
                              "address printed by `ray start --head` (HOST:PORT)") from None

    def _options(self, cfgs: list) -> dict:
        import ray
        cfg = cfgs[0]
        opts = {"num_cpus": max(1, cfg.threads), "num_gpus": 0, "max_retries": self.max_retries,
                "retry_exceptions": False}
        if cfg.device == "cuda" or (cfg.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0):
            opts["num_gpus"] = 1
        opts.update(self.resources)
        return opts

    def run_units(self, out: Path, units: list[tuple[list[str], list]], *, resume: bool, log: Log = print
                  ) -> dict[str, dict]:
        """Run ``units`` ((run names, their configs) each) as Ray tasks; run name -> summary."""
        if not units:
            return {}
        import ray
        self.connect()
        from fedsl.runs.results import RunDir
        from fedsl.sweeps.parallel import describe
        out = Path(out).resolve()
        token, token_file = _token(out)
        remote = ray.remote(_task)
        total = sum(len(n) for n, _ in units)
        res = ray.cluster_resources()
        alive = len([n for n in ray.nodes() if n.get("Alive")])
        log(f"running {total} run{'s' if total != 1 else ''} as {len(units)} Ray task{'s' if len(units) != 1 else ''} "
            f"on {alive} node{'s' if alive != 1 else ''} ({res.get('CPU', 0):g} CPUs, "
            f"{res.get('GPU', 0):g} GPUs)")
        summaries: dict[str, dict] = {}
        refs = {}
        t0 = time.monotonic()
        try:
            for names, cfgs in units:
                ref = remote.options(**self._options(cfgs)).remote(str(out), names, [c.model_dump() for c in cfgs],
                                                                   token, self.quiet)
                refs[ref] = names
            left = list(refs)
            while left:
                done, left = ray.wait(left, num_returns=1)
                for ref in done:
                    names = refs[ref]
                    node = "?"
                    try:
                        node, got = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        if isinstance(e.cause, NotShared):
                            raise ConfigError(str(e.cause)) from None
                        log(f"{', '.join(names)}: task failed ({type(e.cause).__name__}: {e.cause}); recorded")
                        got = {}
                    except ray.exceptions.RayError as e:  # lost more often than max_retries allows
                        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                        log(f"{', '.join(names)}: task lost after {self.max_retries} retries ({type(e).__name__}: "
                            f"{first}); `fedsl resume` continues from the last checkpoint")
                        got = {}
                    for n in names:
                        summaries[n] = got.get(n) or RunDir(out / n).read_summary()
                        self.nodes[n] = node
                        log(f"[{len(summaries)}/{total} runs, {time.monotonic() - t0:.0f} s] {n}: "
                            f"{describe(summaries[n])} (node {node[:8]})")
        except BaseException:
            # Ctrl-C / SIGTERM / a folder the nodes cannot see: the tasks get a KeyboardInterrupt,
            # their runs checkpoint (status 'interrupted'), and `fedsl resume` continues the group
            _cancel(refs)
            ray.wait(list(refs), num_returns=len(refs), timeout=60)
            raise
        finally:
            token_file.unlink(missing_ok=True)
        return summaries

    def run_workers(self, fn: Callable, args: tuple, count: int, folder: Path, log: Log = print) -> None:
        """``count`` tasks each calling ``fn(*args)`` (one CPU each, or ``--ray-resources``), which share ``folder``
        (the shared-filesystem check as for runs); a lost task is retried by Ray. For ``fedsl tune --ray``: the
        workers of one study, asking for trials under the study folder's lock."""
        import ray
        self.connect()
        token, token_file = _token(folder)
        opts = {"num_cpus": 1, "num_gpus": 0, "max_retries": self.max_retries, "retry_exceptions": False,
                **self.resources}
        remote = ray.remote(_worker)
        refs = [remote.options(**opts).remote(fn, args, str(folder), token) for _ in range(count)]
        log(f"{count} worker task{'s' if count != 1 else ''} on the Ray cluster")
        try:
            for ref in refs:
                try:
                    ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    if isinstance(e.cause, NotShared):
                        raise ConfigError(str(e.cause)) from None
                    raise ConfigError(f"a worker task failed ({type(e.cause).__name__}: {e.cause}): continue with "
                                      f"`fedsl resume {folder}`") from None
        except BaseException:
            _cancel(refs)
            raise
        finally:
            token_file.unlink(missing_ok=True)

    def close(self) -> None:
        import ray
        if ray.is_initialized():
            ray.shutdown()
