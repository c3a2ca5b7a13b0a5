"""Running the gateway: in process on a free port (`Gateway`), or on its own (`serve_forever`).

`Gateway` runs uvicorn inside the caller's event loop (the runner, tests), so sessions can
be opened in process with no HTTP round trip, and the model bundle and engine are built
once per gateway. With `gateway.workers = N > 1` it starts N worker processes instead
(`workers.py`) and opens sessions in the shared store, each pinned to one worker.
`serve_forever` is `openforge serve`; `python -m openforge.gateway.server` is the same with
flags that scripts (and the crash test) use without click, and runs one worker of a pool.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig, RunConfig, load_run_config
from openforge.errors import OpenforgeError
from openforge.gateway.app import create_app
from openforge.gateway.engines.base import Engine
from openforge.gateway.model import ModelBundle, load_model_bundle
from openforge.gateway.sessions import (
    close_in_store,
    create_session,
    serving_url,
    session_url,
    worker_of,
)
from openforge.gateway.state import GatewayState
from openforge.gateway.stats import add_up, summary_line
from openforge.gateway.workers import WORKER_SPEC_ENV, WorkerPool, inherit_socket
from openforge.sandbox.protocol import ADMIN_KEY_ENV
from openforge.store import Store
from openforge.types import SamplingParams, Session

log = logging.getLogger("openforge.gateway")


class GatewayError(OpenforgeError):
    """The gateway cannot start (port taken, engine cannot be built...)."""


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the embedding program owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except socket.gaierror as exc:  # the host is no name or address this machine resolves
        sock.close()
        raise GatewayError(f"cannot bind the gateway to {host}: {exc.strerror}; give an "
                           "address of this machine as --host (default 127.0.0.1)") from None
    except OSError as exc:
        sock.close()
        raise GatewayError(f"cannot bind the gateway to {host}:{port}: {exc.strerror}; "
                           f"choose another --port (0 picks a free one)") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def with_context_override(bundle: ModelBundle, config: GatewayConfig) -> ModelBundle:
    """`bundle` with the context window `gateway.context_tokens` sets, if it sets one."""
    if config.context_tokens is None:
        return bundle
    return dataclasses.replace(bundle, context_length=config.context_tokens)


class Gateway:
    """The recording gateway, served by uvicorn in the current event loop, or by
    `config.workers` worker processes.

    `engine` and `bundle` may be passed in to share one loaded model between gateways
    (tests); otherwise both are built from `engine_config` on `start()` and the engine is
    closed on `stop()`. Worker processes build their own engine: `engine` cannot be passed
    with more than one worker.
    """

    def __init__(self, config: GatewayConfig, engine_config: EngineConfig, store: Store, *,
                 engine: Engine | None = None, bundle: ModelBundle | None = None) -> None:
        self.config = config
        self.engine_config = engine_config
        self.store = store
        self.engine = engine
        self.bundle = bundle
        self._owns_engine = engine is None
        self._state: GatewayState | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._pool: WorkerPool | None = None
        self._served_by_workers: dict[str, Any] | None = None
        self._admin_key = config.admin_key or secrets.token_urlsafe(32)
        self.url = ""

    @property
    def state(self) -> GatewayState:
        if self._state is None:
            raise GatewayError("the gateway is not started in this process; call "
                               "`await gateway.start()` first (with gateway.workers > 1 the "
                               "workers hold the state)")
        return self._state

    @property
    def admin_key(self) -> str:
        return self._admin_key

    @property
    def worker_urls(self) -> list[str]:
        """The base URL of each worker (one URL for a single-process gateway)."""
        return list(self._pool.urls) if self._pool is not None else [self.url]

    async def start(self) -> None:
        """Build the model bundle and engine (once), bind, and serve until `stop()`."""
        if self._task is not None or self._pool is not None:
            return
        bundle: ModelBundle = self.bundle if self.bundle is not None else await asyncio.to_thread(
            load_model_bundle, self.engine_config.model, self.engine_config.renderer)
        bundle = with_context_override(bundle, self.config)
        if self.config.workers > 1:
            await self._start_workers(bundle)
            return
        engine: Engine = self.engine if self.engine is not None else await asyncio.to_thread(
            plugins.create, "engine", self.engine_config.name, model=bundle,
            **self.engine_config.options)
        self.bundle, self.engine = bundle, engine
        self._state = GatewayState(self.config, self.store, engine, bundle,
                                   admin_key=self._admin_key)
        sock = _bind(self.config.host, self.config.port)
        self.url = _url(sock)
        self._state.base_url = self.url
        self._server, self._task = await serve_app(self._state, sock)
        log.info("gateway serving on %s", self.url)

    async def _start_workers(self, bundle: ModelBundle) -> None:
        if self.engine is not None:
            raise GatewayError("gateway.workers > 1 builds an engine in each worker process; "
                               "do not pass an engine object (or use one worker)")
        self.bundle = bundle
        sockets = [_bind(self.config.host, self.config.port + i if self.config.port else 0)
                   for i in range(self.config.workers)]
        urls = [_url(sock) for sock in sockets]
        self._pool = WorkerPool(self.config, self.engine_config, self.store.path,
                                self._admin_key, sockets, urls)
        try:
            await self._pool.start()
        except RuntimeError as exc:
            await self._pool.stop()
            self._pool = None
            raise GatewayError(f"the gateway workers did not start: {exc}") from None
        self.url = urls[0]
        log.info("gateway serving on %s (%d workers)", ", ".join(urls), len(urls))

    def open_session(self, run_id: str = "", rollout_id: str = "", task_id: str = "",
                     sampling: SamplingParams | None = None,
                     metadata: dict[str, Any] | None = None) -> Session:
        """Open a session in process (no HTTP): its token is the harness's credential."""
        if self._pool is not None:
            return create_session(
                self.store, workers=len(self._pool.urls), model=self.config.served_model_name,
                run_id=run_id, rollout_id=rollout_id, task_id=task_id, sampling=sampling,
                metadata=metadata)
        return self.state.sessions.open(run_id=run_id, rollout_id=rollout_id, task_id=task_id,
                                        sampling=sampling, metadata=metadata)

    def close_session(self, session_id: str) -> Session | None:
        """Close a session: its token stops working at once. None when it does not exist."""
        if self._pool is not None:
            session = close_in_store(self.store, session_id)
            if session is not None:
                self._pool.post(worker_of(session_id, len(self._pool.urls)),
                                f"/admin/sessions/{session_id}/forget")
            return session
        return self.state.sessions.close(session_id)

    def url_for(self, session: Session) -> str:
        """The root URL of the gateway (worker) that serves `session`."""
        return serving_url(self.worker_urls, session.id)

    def session_url(self, session: Session) -> str:
        """The OpenAI-style base URL (ending in /v1) for `session`."""
        return session_url(self.url_for(session), session)

    def pause(self, retry_after_s: int = 5) -> None:
        """Answer model calls with 429 + Retry-After (weight sync) until `resume()`."""
        if self._pool is not None:
            for i in range(len(self._pool.urls)):
                self._pool.post(i, "/admin/pause", {"retry_after": retry_after_s})
            return
        self.state.paused, self.state.retry_after_s = True, retry_after_s

    def resume(self) -> None:
        if self._pool is not None:
            for i in range(len(self._pool.urls)):
                self._pool.post(i, "/admin/resume")
            return
        self.state.paused = False

    async def served(self) -> dict[str, Any]:
        """What the gateway has served since it started (`gateway/stats.py`), its workers'
        counters added up; after `stop()`, what it had served by then (workers: when they
        were asked to stop)."""
        if self._pool is not None:
            return add_up(await self._pool.served(), workers=len(self._pool.urls))
        if self._state is None and self._served_by_workers is not None:
            return self._served_by_workers
        return self.state.stats.snapshot()

    def pids(self) -> list[int]:
        """The processes serving calls (worker processes, or this one)."""
        return self._pool.pids() if self._pool is not None else [os.getpid()]

    async def wait(self) -> None:
        """Until the server stops."""
        if self._task is not None:
            await asyncio.shield(self._task)
        elif self._pool is not None:
            await asyncio.Event().wait()

    async def stop(self) -> None:
        """Stop serving (in-flight calls get a few seconds to finish) and close the engine."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
        self._server = self._task = None
        if self._pool is not None:
            # Only a running worker can say what it served.
            self._served_by_workers = await self.served()
            await self._pool.stop()
            self._pool = None
        if self._state is not None:
            self._state.close()
        if self._owns_engine and self.engine is not None:
            await self.engine.close()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


async def serve_app(state: GatewayState, sock: socket.socket
                    ) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """uvicorn serving the gateway app for `state` on `sock`, in this event loop."""
    uv_config = uvicorn.Config(
        create_app(state), log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=5, timeout_keep_alive=30,
        # Nothing reads the client's address, and rewriting it from X-Forwarded-For is a
        # middleware pass on every request.
        proxy_headers=False, server_header=False)
    server = _EmbeddedServer(uv_config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped uvicorn
            raise GatewayError("the gateway's HTTP server stopped during start-up")
        await asyncio.sleep(0.01)
    return server, task


def _banner(gateway: Gateway, engine_config: EngineConfig, key_source: str) -> str:
    url = gateway.url
    workers = gateway.worker_urls
    return "\n".join([
        f"openforge gateway on {url}  (engine {engine_config.name}, model "
        f"'{gateway.config.served_model_name}', store {gateway.store.path}, render policy "
        f"{gateway.config.render_policy})",
        *([f"{len(workers)} workers: {', '.join(workers)} (each session is served by one: "
           "use the base_url its opening returns)"] if len(workers) > 1 else []),
        f"admin key: {key_source}",
        "open a session (printf is a shell builtin: the key stays off every command line):",
        f"  curl -s -X POST -H @<(printf 'Authorization: Bearer %s' \"$OPENFORGE_ADMIN_KEY\") "
        f"{url}/admin/sessions",
        "then point a harness at it with the session token:",
        f"  OpenAI SDKs, Codex:  base_url={url}/s/TOKEN/v1  api_key=TOKEN",
        f"  Claude Code:         ANTHROPIC_BASE_URL={url}/s/TOKEN  ANTHROPIC_API_KEY=TOKEN",
        "Ctrl-C stops.",
    ])


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed: a fraction of asyncio's CPU per request."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def admin_key(config: RunConfig, store_path: Path) -> tuple[RunConfig, str]:
    """The admin key `openforge serve` uses, and a line saying where it comes from.

    From `$OPENFORGE_ADMIN_KEY`, else `gateway.admin_key` in a config file, else a new random
    key written to `<store>.admin-key` (mode 0600). Never from, nor printed into, a command
    line: every process on the machine can read those (`ps`).
    """
    key = os.environ.get(ADMIN_KEY_ENV) or config.gateway.admin_key
    where = f"from ${ADMIN_KEY_ENV}" if os.environ.get(ADMIN_KEY_ENV) else "from the config file"
    if not key:
        key = secrets.token_urlsafe(32)
        path = Path(f"{store_path}.admin-key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        where = (f"a new random key in {path} (mode 0600); "
                 f"export {ADMIN_KEY_ENV}=\"$(cat {path})\"")
    gateway = config.gateway.model_copy(update={"admin_key": key})
    return config.model_copy(update={"gateway": gateway}), where


def refuse_key_on_argv(overrides: list[str]) -> None:
    """`--set gateway.admin_key=...` would put the key where `ps` shows it: refuse."""
    if any(o.split("=", 1)[0].strip() == "gateway.admin_key" for o in overrides):
        raise GatewayError(f"the admin key on the command line is visible to every process "
                           f"(ps): set ${ADMIN_KEY_ENV} (or gateway.admin_key in a config file)")


def serve_forever(config: RunConfig, store_path: Path) -> None:
    """`openforge serve`: run the gateway on its own until Ctrl-C or SIGTERM."""
    config, key_source = admin_key(config, store_path)
    store = Store(store_path)

    async def main() -> None:
        stop = _stop_on_signals()
        async with Gateway(config.gateway, config.engine, store) as gateway:
            print(_banner(gateway, config.engine, key_source), flush=True)
            waiter = asyncio.ensure_future(stop.wait())
            served = asyncio.ensure_future(gateway.wait())
            await asyncio.wait({waiter, served}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        print(f"gateway stopped; {summary_line(await gateway.served())}", flush=True)

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    except KeyboardInterrupt:
        print("gateway stopped", flush=True)
    finally:
        store.close()


def serve_worker(spec: dict[str, Any], store_path: Path, worker: int, peers: list[str],
                 fd: int) -> None:
    """One worker of a `WorkerPool`: serve the sessions `worker_of` maps to `worker` on the
    socket the parent bound, until SIGTERM."""
    config = GatewayConfig.model_validate(spec["gateway"])
    admin_key = str(spec["admin_key"])
    engine_config = EngineConfig.model_validate(spec["engine"])
    store = Store(store_path)

    async def main() -> None:
        stop = _stop_on_signals()
        bundle = with_context_override(await asyncio.to_thread(
            load_model_bundle, engine_config.model, engine_config.renderer), config)
        engine: Engine = await asyncio.to_thread(plugins.create, "engine", engine_config.name,
                                                 model=bundle, **engine_config.options)
        state = GatewayState(config, store, engine, bundle, admin_key=admin_key,
                             base_url=peers[worker], worker=worker, peers=peers)
        server, task = await serve_app(state, inherit_socket(fd))
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        state.close()
        await engine.close()

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        store.close()


def main(argv: list[str] | None = None) -> None:
    """`python -m openforge.gateway.server --store PATH [--engine NAME] [--option K=V]...`
    (the admin key: `$OPENFORGE_ADMIN_KEY`, see `admin_key`)"""
    parser = argparse.ArgumentParser(prog="python -m openforge.gateway.server",
                                     description="Run the openforge recording gateway.")
    parser.add_argument("--store", type=Path, default=Path("gateway.sqlite"))
    parser.add_argument("--engine", help="engine plugin name (default: local)")
    parser.add_argument("--model", help="model directory, or 'tiny'")
    parser.add_argument("--renderer", help="renderer config name (default: auto)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--keepalive", type=float, help="seconds between SSE keep-alives")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="engine option (value parsed as YAML), repeatable")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="any config override, repeatable")
    parser.add_argument("--workers", type=int, help="gateway processes (default 1)")
    # A worker of a pool (started by WorkerPool, not by hand):
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peers", help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        serve_worker(json.loads(os.environ.pop(WORKER_SPEC_ENV)), args.store, args.worker,
                     args.peers.split(","), args.fd)
        return
    overrides = list(args.overrides) + [f"engine.options.{o}" for o in args.option]
    try:
        refuse_key_on_argv(overrides)
        config = load_run_config(None, overrides, {
            "engine.name": args.engine, "engine.model": args.model,
            "engine.renderer": args.renderer, "gateway.host": args.host,
            "gateway.port": args.port, "gateway.keepalive_s": args.keepalive,
            "gateway.workers": args.workers,
        })
        serve_forever(config, args.store)
    except OpenforgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
