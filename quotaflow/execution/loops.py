"""Where batches run: one event loop per worker thread, kept for the thread's life, and
one provider per deployment and loop.

A Celery task is synchronous; running each batch under a fresh `asyncio.run`
meant a fresh loop, so a fresh HTTP client, TLS context and TCP connection
for every batch. Keeping the loop lets a provider keep its connections
alive from one batch to the next. Each thread (the prefork child's main
thread, or each thread of a `--pool threads` worker) gets its own loop, since
a loop and the connections opened in it belong to one thread.
"""

import asyncio
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from quotaflow.deployments.deployment import Deployment
from quotaflow.providers import Provider, make_provider

T = TypeVar("T")

_local = threading.local()


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end on this thread's long-lived event loop."""
    runner: asyncio.Runner | None = getattr(_local, "runner", None)
    if runner is None:
        runner = _local.runner = asyncio.Runner()
    return runner.run(coroutine)


class ProviderPool:
    """One provider per deployment and event loop, made on first use and kept for the
    loop's life, so its connection pool outlives the batch (and the executor) that
    opened it. Keyed by what a provider is built from, not by name alone: two
    deployments files may give one name two endpoints."""

    def __init__(self, factory: Callable[[Deployment], Provider] = make_provider) -> None:
        self._factory = factory
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 dict[tuple[object, ...], Provider]] = (
            weakref.WeakKeyDictionary())
        self._last = threading.local()

    def get(self, deployment: Deployment) -> Provider:
        """The deployment's provider in the running loop; ConfigError where it cannot be
        made (its key's environment variable is not set, say).

        Asked once per request: the thread's last answer is kept for the same loop and
        deployment object, since the weak mapping and the key cost more than the call's
        own HTTP parsing."""
        loop = asyncio.get_running_loop()
        last = self._last
        if getattr(last, "loop", None) is loop and last.deployment is deployment:
            kept: Provider = last.provider
            return kept
        providers = self._by_loop.setdefault(loop, {})
        key = (deployment.name, deployment.provider, deployment.base_url,
               deployment.api_key_env, deployment.timeout_s, deployment.anthropic_version,
               deployment.model, deployment.api_version, repr(deployment.headers),
               repr(deployment.query))
        provider = providers.get(key)
        if provider is None:
            provider = providers[key] = self._factory(deployment)
        last.loop, last.deployment, last.provider = loop, deployment, provider
        return provider

    async def aclose(self) -> None:
        """Close the running loop's providers (a loop about to end, as the embedded
        runner's does)."""
        loop = asyncio.get_running_loop()
        if getattr(self._last, "loop", None) is loop:
            self._last.loop = None
        providers = self._by_loop.pop(loop, {})
        for provider in providers.values():
            await provider.aclose()


# The process's providers: every executor on a loop shares that loop's connections.
PROVIDERS = ProviderPool()
