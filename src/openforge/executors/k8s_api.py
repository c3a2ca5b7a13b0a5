"""A thin, retrying adapter over the asyncio Kubernetes client (`kubernetes_asyncio`).

Only the calls the executor makes: Pods (create, get, delete, deletecollection, list,
watch, log), the attempts' Secrets (create, deletecollection), the per-run owner ConfigMap,
and Nodes (list, watch). Transient API errors (409 Conflict other than AlreadyExists, 429,
5xx, connection errors) are retried with capped, jittered exponential backoff, and never
sooner than a Retry-After header asks; everything else is raised as `ApiException` for the
caller to judge. Every request is counted (the benchmark reports API calls per rollout).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

T = TypeVar("T")
_RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
# Socket connect and read limits for every call but the watch: a hung API server must not
# hang us. Not aiohttp's `connect`, which also counts the wait for a free pooled connection:
# with thousands of rollouts in flight that wait is ours, not the server's.
_TIMEOUT = aiohttp.ClientTimeout(sock_connect=10.0, sock_read=60.0)


def reason_of(exc: ApiException) -> str:
    """The `reason` of the Status body (e.g. AlreadyExists), or the HTTP reason."""
    try:
        return str(json.loads(exc.body or "{}").get("reason") or exc.reason or "")
    except (ValueError, AttributeError):
        return str(exc.reason or "")


def message_of(exc: ApiException) -> str:
    """The API server's one-line message for a failed call."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason or exc.status)
    except (ValueError, AttributeError):
        return str(exc.reason or exc.status)


def retry_after(exc: BaseException) -> float | None:
    """The seconds a refused call's Retry-After header asks for (None without one)."""
    headers = getattr(exc, "headers", None)
    value = str(headers.get("Retry-After") or "").strip() if headers else ""
    return float(value) if value.isdigit() else None


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        if exc.status == 409 and reason_of(exc) == "AlreadyExists":
            return False
        return exc.status in _RETRY_STATUSES or exc.status == 0
    return isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError)


class RateLimiter:
    """A token bucket: `rate` acquisitions per second with bursts of up to `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.rate, self.burst = rate, burst
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._sleep = sleep or asyncio.sleep
        self._tokens = float(burst)
        self._last: float | None = None
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = self._clock()
                if self._last is not None:
                    self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await self._sleep((1 - self._tokens) / self.rate)


class KubeApi:
    """The executor's view of one cluster namespace."""

    def __init__(self, api_client: client.ApiClient, namespace: str, retries: int = 5,
                 backoff_s: float = 0.5, backoff_max_s: float = 10.0,
                 calls: Counter[str] | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.client = api_client
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.retries, self.backoff_s, self.backoff_max_s = retries, backoff_s, backoff_max_s
        self.calls: Counter[str] = calls if calls is not None else Counter()
        self._sleep = sleep or asyncio.sleep

    @classmethod
    async def connect(cls, kubeconfig: Path | None, context: str | None, namespace: str,
                      **retry: Any) -> KubeApi:
        """From a kubeconfig file, else the in-cluster service account, else $KUBECONFIG."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            api_client = client.ApiClient()
        else:
            api_client = await config.new_client_from_config(
                config_file=str(kubeconfig) if kubeconfig else None, context=context,
                persist_config=False)
        return cls(api_client, namespace, **retry)

    async def close(self) -> None:
        await self.client.close()

    async def call(self, verb: str, fn: Callable[[], Awaitable[T]]) -> T:
        """`fn()` with retries on transient failures; counts each request under `verb`."""
        for attempt in range(self.retries + 1):
            self.calls[verb] += 1
            try:
                return await fn()
            except Exception as exc:
                if not is_transient(exc) or attempt == self.retries:
                    raise
                delay = min(self.backoff_max_s, self.backoff_s * 2 ** attempt)
                # Jittered, so that callers refused together do not come back together...
                wait = delay * (0.5 + random.random() / 2)
                if (after := retry_after(exc)) is not None:
                    # ...but never before the server said: its Retry-After is a floor.
                    wait = after + delay * random.random() / 2
                await self._sleep(wait)
        raise AssertionError("unreachable")

    async def _request(self, verb: str, method: Callable[..., Awaitable[Any]], *args: Any,
                       **kwargs: Any) -> dict[str, Any]:
        """One typed-client call taken raw (plain dicts are cheaper than typed models), with
        the socket limits and the retries of `call`."""
        async def once() -> dict[str, Any]:
            resp = await method(*args, _preload_content=False, _request_timeout=_TIMEOUT,
                                **kwargs)
            return await _json_or_raise(resp)

        return await self.call(verb, once)

    async def _delete(self, method: Callable[..., Awaitable[Any]], *args: Any,
                      **kwargs: Any) -> bool:
        """One delete call; False when the object was already gone (404)."""
        try:
            await self._request("delete", method, *args, **kwargs)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    # -- Pods ----------------------------------------------------------------------------------

    async def create_pod(self, pod: client.V1Pod) -> dict[str, Any]:
        return await self._request("create", self.core.create_namespaced_pod, self.namespace, pod)

    async def read_pod(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("get", self.core.read_namespaced_pod, name,
                                       self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        """Delete gracefully (the Pod's own grace period) unless `grace_s` says otherwise;
        False when it was already gone."""
        grace: dict[str, Any] = {} if grace_s is None else {"grace_period_seconds": grace_s}
        return await self._delete(self.core.delete_namespaced_pod, name, self.namespace, **grace)

    async def delete_pods(self, label_selector: str, grace_s: int | None = None) -> int:
        """deletecollection by label; how many Pods it deleted."""
        grace: dict[str, Any] = {} if grace_s is None else {"grace_period_seconds": grace_s}
        body = await self._request("deletecollection", self.core.delete_collection_namespaced_pod,
                                   self.namespace, label_selector=label_selector, **grace)
        return len(body.get("items") or [])

    # -- the attempts' Secrets -----------------------------------------------------------------

    async def create_secret(self, secret: client.V1Secret) -> dict[str, Any]:
        return await self._request("create", self.core.create_namespaced_secret, self.namespace,
                                   secret)

    async def delete_secret(self, name: str) -> bool:
        return await self._delete(self.core.delete_namespaced_secret, name, self.namespace)

    async def delete_secrets(self, label_selector: str) -> int:
        """deletecollection of Secrets by label (what they own, the garbage collector takes)."""
        body = await self._request("deletecollection",
                                   self.core.delete_collection_namespaced_secret, self.namespace,
                                   label_selector=label_selector)
        return len(body.get("items") or [])

    # -- lists, watches, logs ------------------------------------------------------------------

    def _lister(self, resource: str) -> Callable[..., Awaitable[Any]]:
        if resource == "nodes":
            return self.core.list_node
        return lambda **kw: self.core.list_namespaced_pod(self.namespace, **kw)

    async def list_objects(self, resource: str,
                           label_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """(items, the list's resourceVersion) of "pods" (this namespace) or "nodes", as
        plain dicts (cheaper than typed models)."""
        body = await self._request("list", self._lister(resource), label_selector=label_selector)
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    async def list_pods(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        return await self.list_objects("pods", label_selector)

    async def watch_objects(self, resource: str, label_selector: str, resource_version: str,
                            timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """Raw watch events ({"type", "object"}) until the server ends the window.

        Not retried here: the watcher re-lists on any failure. An ERROR event (410 Gone for a
        version older than the server's history) is yielded like any other.
        """
        self.calls["watch"] += 1
        resp: Any = await self._lister(resource)(
            label_selector=label_selector, watch=True, resource_version=resource_version,
            timeout_seconds=max(1, int(timeout_s)), allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30))
        try:
            if resp.status >= 300:
                exc = ApiException(status=resp.status, reason=resp.reason)
                exc.body = await resp.text()
                raise exc
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()

    async def pod_log(self, name: str, container: str, tail_lines: int) -> str:
        """The last lines of one container's log; '' when there is none to read."""
        async def read() -> str:
            return str(await self.core.read_namespaced_pod_log(
                name, self.namespace, container=container, tail_lines=tail_lines,
                limit_bytes=256 * 1024, _request_timeout=_TIMEOUT))

        try:
            return await self.call("log", read)
        except Exception:  # the tail is a debugging aid: never worth failing a rollout over
            return ""

    # -- the per-run owner ---------------------------------------------------------------------

    async def ensure_configmap(self, name: str, labels: dict[str, str],
                               data: dict[str, str]) -> dict[str, Any]:
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels),
                                  data=data)
        try:
            return await self._request("create", self.core.create_namespaced_config_map,
                                       self.namespace, body)
        except ApiException as exc:
            if exc.status == 409 and reason_of(exc) == "AlreadyExists":
                return await self._request("get", self.core.read_namespaced_config_map, name,
                                           self.namespace)
            raise

    async def delete_configmap(self, name: str) -> None:
        await self._delete(self.core.delete_namespaced_config_map, name, self.namespace)


async def _json_or_raise(resp: Any) -> dict[str, Any]:
    """The JSON body of a raw response, or the ApiException the typed client would raise."""
    try:
        data = await resp.read()
        if not 200 <= resp.status <= 299:
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = data.decode(errors="replace")
            exc.headers = resp.headers
            raise exc
        return json.loads(data) if data else {}
    finally:
        resp.release()
