"""The computer API: how a GUI harness sees a screen and acts on it, over local HTTP.

An environment that offers a screen starts a `ComputerServer` in `Environment.prepare`
(on 127.0.0.1, a free port) and writes `workspace/.openforge/computer.json` =
`{"url": "http://127.0.0.1:PORT", "token": "<random>"}`. Every request carries
`Authorization: Bearer <token>`; `Environment.close()` stops the server and the screen
behind it. Endpoints:

    GET  /observation  -> Observation (screenshot as base64 PNG, size, url, title, step, done, answer)
    POST /action       one Action as JSON -> ActionResult {ok, error, done, step}

A wrong or missing token is a 401, a body that is not one action a 400 (one-line JSON
`{"error": ...}` each). An action the screen could not perform (no such element, a
navigation error) is `ok: false` with the error and still counts as a step. After
`answer` / `fail`, the step limit, or when the task itself ends (`Computer.finished`, e.g.
a MiniWoB page that has scored), `done` is true and further actions are refused.

A screen backend implements `Computer` (`observe`, `act`, `close`); `ComputerEnvironment`
is the `Environment` base class that serves one per rollout. `ComputerClient` is what a
harness uses to talk to the server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
from pydantic import BaseModel, Field, ValidationError

from openforge.environment import Environment
from openforge.options import PluginOptions
from openforge.sandbox.leftovers import make_folder
from openforge.sandbox.scrub import fresh_path
from openforge.types import Task
from openforge_gui.actions import ACTION_ADAPTER, FINAL_TYPES, Action, format_action

T = TypeVar("T")
D = TypeVar("D")
CONFIG_RELPATH = Path(".openforge") / "computer.json"
SCREENS_RELPATH = Path(".openforge") / "screens"
MAX_BODY_BYTES = 1 << 20


class Observation(BaseModel):
    """What the screen shows now. `screenshot` is a base64-encoded PNG of width x height."""

    screenshot: str
    width: int
    height: int
    url: str | None = None
    title: str | None = None
    step: int = 0
    done: bool = False
    answer: str | None = None


class ActionResult(BaseModel):
    """What became of one action. `ok` is False when the screen could not perform it."""

    ok: bool
    error: str | None = None
    done: bool = False
    step: int = 0


class ComputerConfig(BaseModel):
    """Where a harness finds the computer API: the content of `.openforge/computer.json`."""

    url: str
    token: str

    @classmethod
    def read(cls, workspace: Path) -> ComputerConfig:
        return cls.model_validate_json((workspace / CONFIG_RELPATH).read_text())

    def write(self, workspace: Path) -> Path:
        path = workspace / CONFIG_RELPATH
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json())
        path.chmod(0o600)
        return path


class HistoryEntry(BaseModel):
    """One performed step, as the environment recorded it (final state, judges, reports)."""

    step: int
    action: dict[str, Any]
    action_text: str
    ok: bool
    error: str | None = None
    url: str | None = None
    screenshot: str | None = None  # path of the screenshot taken after the action, if kept
    screenshot_sha256: str | None = None  # of those bytes, as captured
    screenshot_error: str | None = None  # why none was kept: the screen refused every capture


class Computer(ABC):
    """A screen one agent drives: a browser page, a VM. Methods are called one at a time.

    `perform` does one action or raises `ActionFailed`; step counting, the step limit,
    answer/fail and the history are the `Episode`'s job around it.
    """

    @abstractmethod
    def screenshot(self) -> tuple[bytes, int, int]:
        """The current screen as PNG bytes, with its width and height in pixels; raise
        `ActionFailed` when the screen cannot be captured now."""

    def location(self) -> tuple[str | None, str | None]:
        """The (url, title) shown, where the screen has such a thing."""
        return None, None

    @abstractmethod
    def perform(self, action: Action) -> None:
        """Perform one non-final action; raise `ActionFailed` when it cannot be done."""

    def finished(self) -> bool:
        """Whether the task itself says the episode is over (a MiniWoB page that scored)."""
        return False

    def close(self) -> None:
        """Release the screen (browser, VM)."""


class ActionFailed(Exception):
    """The screen could not perform an action (no such element, navigation error...)."""


class ScreenGone(ActionFailed):
    """The screen itself is gone: its browser crashed, or hung and was stopped. The computer
    API answers it as an error (a harness that stops on it is judged by the usual rule,
    `openforge.attribution`); the final state records it and keeps what was captured."""


class Episode:
    """A `Computer` plus the rules of an episode: step count, step limit, answer, history.

    Thread-safe: the HTTP server's handler threads take one lock around every call.
    `keep_screens` (a directory) keeps the screenshot after each step as `step-N.png`, for
    judges and reports.
    """

    def __init__(self, computer: Computer, max_steps: int = 30,
                 keep_screens: Path | None = None) -> None:
        self.computer = computer
        self.max_steps = max_steps
        self.keep_screens = keep_screens
        self.step = 0
        self.done = False
        self.answer: str | None = None
        self.failed: str | None = None
        # What ended the episode: "answer", "fail", "task" (the screen says so), "step_limit",
        # "screen_gone" (the browser crashed, or hung and was stopped).
        self.ended_by: str | None = None
        self.history: list[HistoryEntry] = []
        self._lock = threading.Lock()

    def observe(self) -> Observation:
        with self._lock:
            png, width, height = self.computer.screenshot()
            url, title = self.computer.location()
            return Observation(screenshot=base64.b64encode(png).decode(), width=width,
                               height=height, url=url, title=title, step=self.step,
                               done=self.done, answer=self.answer)

    def act(self, action: Action) -> ActionResult:
        with self._lock:
            if self.done:
                return ActionResult(ok=False, error="the episode is over", done=True,
                                    step=self.step)
            self.step += 1
            error: str | None = None
            if action.type == "answer":
                self.answer = action.text
            elif action.type == "fail":
                self.failed = action.reason or "gave up"
            else:
                try:
                    self.computer.perform(action)
                except ActionFailed as exc:
                    error = str(exc).splitlines()[0][:500] if str(exc) else "action failed"
            entry = HistoryEntry(step=self.step, action=action.model_dump(),
                                 action_text=format_action(action), ok=error is None, error=error)
            try:
                self.ended_by = self._end(action)
                self._record_screen(entry)
            except ScreenGone as exc:  # a screen that is gone ends the episode; the step stays
                entry.ok, entry.error = False, str(exc)[:500]
                self.ended_by = "screen_gone"
            except ActionFailed as exc:  # the step was done; only its picture is missing
                entry.screenshot_error = str(exc)[:500]
            self.done = self.ended_by is not None
            self.history.append(entry)
            return ActionResult(ok=entry.ok, error=entry.error, done=self.done, step=self.step)

    def _end(self, action: Action) -> str | None:
        """What ends the episode after `action`, if anything."""
        if action.type in FINAL_TYPES:
            return action.type
        if self.computer.finished():
            return "task"
        if self.step >= self.max_steps:
            return "step_limit"
        return None

    def _record_screen(self, entry: HistoryEntry) -> None:
        """The screen after the step: its URL and, when kept, its screenshot."""
        entry.url, _ = self.computer.location()
        if self.keep_screens is not None:
            self.keep_screens.mkdir(parents=True, exist_ok=True)
            path = self.keep_screens / f"step-{self.step}.png"
            png = self.computer.screenshot()[0]
            path.write_bytes(png)
            entry.screenshot = str(path)
            entry.screenshot_sha256 = hashlib.sha256(png).hexdigest()

    def summary(self) -> dict[str, Any]:
        """The episode for `final_state`: steps, answer, failure, history."""
        return {"steps": self.step, "max_steps": self.max_steps, "done": self.done,
                "answer": self.answer, "failed": self.failed, "ended_by": self.ended_by,
                "history": [h.model_dump() for h in self.history]}


# --- the HTTP server ---------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # a harness polls; access logs would drown the rollout's stderr

    def _send(self, status: int, body: BaseModel | dict[str, Any]) -> None:
        data = (body.model_dump_json() if isinstance(body, BaseModel) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        given = header[len("Bearer "):] if header.startswith("Bearer ") else ""
        if secrets.compare_digest(given.encode(), self.server.token.encode()):
            return True
        self._send(401, {"error": "missing or wrong token: send Authorization: Bearer <token> "
                                  "from .openforge/computer.json"})
        return False

    def _guarded(self, handler: Any) -> None:
        try:
            handler()
        except Exception as exc:  # the screen broke: a 500 with one line, never a traceback
            self._send(500, {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                                      if str(exc) else type(exc).__name__})

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if not self._authorized():
            return
        if self.path.split("?")[0] != "/observation":
            self._send(404, {"error": f"no such endpoint {self.path}; use GET /observation "
                                      "or POST /action"})
            return
        self._guarded(lambda: self._send(200, self.server.episode.observe()))

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if not self._authorized():
            return
        if self.path.split("?")[0] != "/action":
            self._send(404, {"error": f"no such endpoint {self.path}; use GET /observation "
                                      "or POST /action"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, {"error": f"the body is over {MAX_BODY_BYTES} bytes"})
            return
        raw = self.rfile.read(length)
        try:
            action = ACTION_ADAPTER.validate_json(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(body)"
            self._send(400, {"error": f"not an action: {where}: {err['msg']}"})
            return
        self._guarded(lambda: self._send(200, self.server.episode.act(action)))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, episode: Episode, token: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.episode = episode
        self.token = token


class ComputerServer:
    """Serves one `Episode` on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, episode: Episode, token: str | None = None) -> None:
        self.episode = episode
        self.token = token or secrets.token_urlsafe(24)
        self._server = _Server(episode, self.token)
        self._thread = threading.Thread(target=self._server.serve_forever, name="computer-api",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def config(self) -> ComputerConfig:
        return ComputerConfig(url=self.url, token=self.token)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# --- the client a harness uses -------------------------------------------------------------

class ComputerAPIError(Exception):
    """The computer API refused a request (bad token, bad action) or is unreachable."""


class ComputerClient:
    """A harness's handle on the computer API."""

    def __init__(self, url: str, token: str, timeout_s: float = 60.0) -> None:
        self._http = httpx.Client(base_url=url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def from_workspace(cls, workspace: Path, timeout_s: float = 60.0) -> ComputerClient:
        config = ComputerConfig.read(workspace)
        return cls(config.url, config.token, timeout_s)

    def _check(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 200:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise ComputerAPIError(f"computer API {response.status_code}: {message}")
        data: dict[str, Any] = response.json()
        return data

    def observation(self) -> Observation:
        try:
            return Observation.model_validate(self._check(self._http.get("/observation")))
        except httpx.HTTPError as exc:
            raise ComputerAPIError(f"computer API unreachable: {exc}") from None

    def act(self, action: Action | dict[str, Any]) -> ActionResult:
        body = action if isinstance(action, dict) else action.model_dump()
        try:
            return ActionResult.model_validate(self._check(self._http.post("/action", json=body)))
        except httpx.HTTPError as exc:
            raise ComputerAPIError(f"computer API unreachable: {exc}") from None

    def close(self) -> None:
        self._http.close()


# --- the environment base class -----------------------------------------------------------

class ComputerOptions(PluginOptions):
    """Options every computer environment takes (a subclass adds its own and its defaults)."""

    max_steps: int = Field(default=30, ge=1)
    """Actions per episode at most (a task's own `max_steps` wins)."""
    keep_screens: bool = True
    """Keep a screenshot after each step (judges read them): outside the workspace while the
    agent runs, under `.openforge/screens/` in the final state."""


class ComputerEnvironment(Environment):
    """An environment whose rollouts drive a screen through the computer API.

    Subclasses implement `tasks` and `open_computer(task, workspace)`; this class serves the
    computer per rollout, writes `.openforge/computer.json`, records the episode into the
    final state (`episode`: steps, answer, history with screenshot paths) and closes it all.
    """

    options_model: ClassVar[type[ComputerOptions]] = ComputerOptions
    options: ComputerOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.max_steps = self.options.max_steps
        self.keep_screens = self.options.keep_screens
        self.episode: Episode | None = None
        self.server: ComputerServer | None = None
        self._screens: Path | None = None  # the episode's screenshots while the agent runs

    @abstractmethod
    def open_computer(self, task: Task, workspace: Path) -> Computer:
        """Start the screen for `task` (launch a browser, reset a VM) and return it."""

    def prepare(self, task: Task, workspace: Path) -> None:
        computer = self.open_computer(task, workspace)
        # Judges score these screenshots: while the agent runs they are kept outside its
        # workspace (the sandbox's view has no such folder), and `final_state` shows them
        # there once its processes are gone. Named for this process: if it is killed, the
        # next local executor removes the folder (`openforge.sandbox.leftovers`).
        self._screens = make_folder("screens") if self.keep_screens else None
        max_steps = int(task.data.get("max_steps", self.max_steps))
        self.episode = Episode(computer, max_steps=max_steps, keep_screens=self._screens)
        self.server = ComputerServer(self.episode)
        self.server.config.write(workspace)

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        if self.episode is None:
            return {}
        summary = self.episode.summary()
        if self._screens is not None:
            summary["history"] = _show_screens(summary["history"], workspace)
        return {"episode": summary}

    def read_screen(self, state: dict[str, Any], read: Callable[[], T], default: D) -> T | D:
        """`read()` of the screen for the final state, or `default` when the screen is gone
        (`screen_gone` in `state` says why): an attempt that broke its screen is scored on
        what was captured, never turned into an error of the environment."""
        try:
            return read()
        except ScreenGone as exc:
            state["screen_gone"] = str(exc)
            return default

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.episode is not None:
            self.episode.computer.close()
            self.episode = None
        if self._screens is not None:
            shutil.rmtree(self._screens, ignore_errors=True)
            self._screens = None


def _show_screens(history: list[dict[str, Any]], workspace: Path) -> list[dict[str, Any]]:
    """`history` with each kept screenshot copied into the workspace's `.openforge/screens/`.
    A screenshot whose bytes are no longer those captured (without isolation the agent could
    reach the private folder) is not shown to anyone: its entry keeps no path, and says so
    in `screenshot_changed`."""
    folder = fresh_path(workspace, SCREENS_RELPATH)
    folder.mkdir()
    shown = []
    for entry in history:
        entry = dict(entry)
        source = entry.get("screenshot")
        if source:
            png = Path(source).read_bytes() if Path(source).is_file() else b""
            if hashlib.sha256(png).hexdigest() == entry.get("screenshot_sha256"):
                target = folder / Path(source).name
                target.write_bytes(png)
                entry["screenshot"] = str(target)
            else:
                entry["screenshot"], entry["screenshot_changed"] = None, True
        shown.append(entry)
    return shown


__all__ = ["ActionFailed", "ActionResult", "Computer", "ComputerAPIError", "ComputerClient",
           "ComputerConfig", "ComputerEnvironment", "ComputerServer", "Episode", "HistoryEntry",
           "Observation", "ScreenGone", "CONFIG_RELPATH"]
