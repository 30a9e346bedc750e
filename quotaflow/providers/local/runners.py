"""Each local deployment's engine, loaded once per process, and shut down with it.

The model is loaded on first use (and warmed up: warmup.py) and stays loaded for the
life of the process: one engine per deployment per process. A Celery worker is
limited to the deployment it was started for (`serve_only`), so a worker without a
model never loads one by accident. When the process is told to end, its engines are
shut down at once rather than after the work in hand: a request an engine drops then
is handed back (EngineStopped) to run again, and vLLM's processes end with the engine,
so a command ends within seconds of being told, however long its requests would run.
"""

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError, EngineStopped
from quotaflow.providers.local.batcher import DynamicBatcher
from quotaflow.providers.local.requests import Engine
from quotaflow.providers.local.vllm_options import INSTALL_HINT
from quotaflow.providers.local.warmup import warm_up

log = logging.getLogger(__name__)
# How long a closing batcher waits for the model batch in hand: the process is ending,
# and its thread (a daemon) goes with it.
CLOSE_BATCH_S = 5.0
# How often a worker's closer looks whether the worker was told to stop.
TOLD_POLL_S = 0.1


@dataclass
class Runner:
    """A loaded engine and the batcher in front of it."""

    engine: Engine
    batcher: DynamicBatcher | None  # None: the engine schedules itself (vLLM)
    closed: bool = False

    @property
    def stopped(self) -> bool:
        """Shut down, or its engine found dead (vLLM's processes ended)."""
        return self.closed or bool(getattr(self.engine, "stopped", False))

    def close(self) -> None:
        """The engine first: a batch in hand stops at its next step, so the batcher's
        thread is out of the model when the process exits."""
        self.closed = True
        self.engine.close()
        if self.batcher is not None:
            self.batcher.close(timeout_s=CLOSE_BATCH_S)


_runners: dict[str, Runner] = {}
_lock = threading.Lock()
_allowed: frozenset[str] | None = None  # None: any local deployment (embedded runs)
_shutting_down = False  # a plain flag: set from signal handlers, where no lock may be taken
_closing = threading.Lock()  # held while engines close: a second closer waits for the first


def shutting_down() -> None:
    """Say the process is ending (a worker told to stop): a request its engine drops from
    now on is handed back, not retried. Safe in a signal handler: one assignment."""
    global _shutting_down
    _shutting_down = True


def ending() -> bool:
    """Whether the process was told to end (a request dropped now is handed back)."""
    return _shutting_down


def serve_only(names: Iterable[str] | None) -> None:
    """Celery workers call this at start: load only these deployments' models (or none).
    None lifts the restriction (the embedded runner loads whatever it needs)."""
    global _allowed
    _allowed = None if names is None else frozenset(names)


def load_engine(deployment: Deployment) -> Engine:
    if deployment.engine == "transformers":
        try:
            from quotaflow.providers.local.engine import TransformersEngine
        except ImportError as exc:
            raise ConfigError(
                f"deployment {deployment.name!r} runs on transformers, which is not "
                "installed; pip install 'quotaflow[local]'") from exc
        return TransformersEngine(deployment)
    if deployment.engine == "vllm":
        try:
            from quotaflow.providers.local.vllm_engine import VllmEngine
        except ImportError as exc:
            raise ConfigError(f"deployment {deployment.name!r} runs on vLLM, which this "
                              f"interpreter ({sys.executable}) cannot import ({exc}); "
                              f"{INSTALL_HINT}") from exc
        return VllmEngine(deployment)
    raise ConfigError(f"deployment {deployment.name!r}: unknown engine {deployment.engine!r}")


def runner_for(deployment: Deployment) -> Runner:
    """The deployment's engine and batcher, loaded once per process."""
    with _lock:
        if _allowed is not None and deployment.name not in _allowed:
            raise ConfigError(
                f"this worker holds no model for local deployment {deployment.name!r}; its "
                f"requests are run by `quotaflow worker --deployment {deployment.name}`")
        if _shutting_down:
            raise EngineStopped(f"{deployment.name}: this process is shutting down")
        runner = _runners.get(deployment.name)
        if runner is None:
            engine = load_engine(deployment)
            warm_up(engine, deployment.name)  # its first requests' cost, not a job's
            if deployment.engine == "vllm":
                runner = _runners[deployment.name] = Runner(engine, None)
                return runner
            batcher = DynamicBatcher(engine.run_batch, deployment.max_batch_size,
                                     deployment.max_batch_tokens,
                                     deployment.max_wait_ms / 1000,
                                     name=f"quotaflow-batcher-{deployment.name}")
            runner = _runners[deployment.name] = Runner(engine, batcher)
        return runner


def close_engines() -> None:
    """Shut down every engine this process loaded (vLLM's processes end with it); a
    request still in one is handed back. Returns once they are shut down, also when
    another thread began it."""
    shutting_down()
    with _closing:
        with _lock:
            closing = list(_runners.values())
            _runners.clear()
        for runner in closing:
            try:
                runner.close()
            except Exception:  # one engine's failure must not keep the others running
                log.exception("closing a local engine failed")


def close_when_told(told: Callable[[], bool] = lambda: False) -> threading.Thread:
    """A thread that shuts the engines down as soon as `shutting_down()` is called or
    `told()` says so (a worker's stop flag, read here because a signal handler may take
    no lock): a worker's pool would otherwise wait for its batches, however long their
    generations, before its shutdown hook runs."""

    def watch() -> None:
        while not (_shutting_down or told()):
            time.sleep(TOLD_POLL_S)
        close_engines()

    thread = threading.Thread(target=watch, name="quotaflow-engine-closer", daemon=True)
    thread.start()
    return thread
