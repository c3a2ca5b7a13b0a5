"""The Harness plugin kind: how to run one agent program headlessly on one task."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args

from pydantic import BaseModel, Field

from openforge.errors import OpenforgeError
from openforge.options import Plugin
from openforge.types import Task

WireAPI = Literal["chat", "responses", "messages"]


class HarnessMissingError(OpenforgeError):
    """The harness program is not installed; the message says how to install it."""


class McpServer(BaseModel):
    """A stdio MCP server that offers the task's own tools: `command args...` with `env`.

    An environment names them (`Environment.mcp_servers`); each harness that takes MCP
    servers writes them into its own config, so the agent sees the tools as native tools.
    The harness starts them, inside the agent's sandbox: the program must be on a path the
    sandbox maps (openforge's Python, the harness's `program_paths`, the task's `data_paths`).
    """

    name: str
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class HarnessContext(BaseModel):
    """Where one rollout's harness runs and which endpoint it talks to.

    `home` is an isolated HOME created for this rollout (the harness writes its config
    there, never into the user's real HOME); `workspace` is the task's working directory;
    `base_url` is the session URL ending in `/v1` and `api_key` the session token (good for
    model calls in this session only). Both must reach the program through `Command.env` or
    a file under `home`, never through its argv. `mcp_servers` are the task's tool servers,
    for harnesses that take MCP servers.
    """

    task: Task
    workspace: Path
    home: Path
    base_url: str
    api_key: str
    model: str = "policy"
    timeout_s: float = 300.0
    mcp_servers: list[McpServer] = Field(default_factory=list)


class Command(BaseModel):
    """A process to start: argv, extra environment variables, working directory."""

    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None
    stdin: str | None = None


class ProcessOutput(BaseModel):
    """How a process ended and what it printed.

    `stdout_omitted` counts the bytes of standard output left out of `stdout` (the middle
    of an output longer than the trusted side reads: `openforge.sandbox.bounded`); where
    it is not 0, `stdout` holds a line saying so, and a check that judges the output
    should judge it incomplete.
    """

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0
    stdout_omitted: int = 0


class HarnessOutput(BaseModel):
    """The harness's own account of how it ended.

    `status`: `completed` (ran to its end), `failed` (the program reported an error of its
    own), `crashed` (died without a proper end: an infrastructure failure), `timeout`.
    """

    status: Literal["completed", "failed", "crashed", "timeout"]
    final_answer: str | None = None
    transcript: Any = None
    error: str | None = None


class Harness(Plugin, ABC):
    """Base class of harness plugins. Subclasses set `wire_api` and implement `command`."""

    wire_api: ClassVar[WireAPI] = "chat"
    # True for harnesses that send images (screenshots): `openforge run` then refuses a
    # text-only model up front instead of failing every rollout with a 400.
    sends_images: ClassVar[bool] = False
    kind = "harness"

    def check(self) -> None:
        """Raise `HarnessMissingError` (saying how to install it) when the program is missing."""

    def install(self, log: Callable[[str], None] = print) -> dict[str, Any]:
        """Locate or install the program once per run, before any rollout, outside the sandbox.

        The runner calls this once (on the machine that runs the rollouts) and adds the
        returned options to every rollout's harness options, e.g. `{"bin": "/abs/path"}`,
        so that `check()` in the sandbox finds the program without installing it again.
        `log` prints progress lines. Raise `HarnessMissingError` when it cannot be had (the
        run then stops before its first rollout, with that one message).
        Default: nothing to install, nothing to add (`check()` still runs in each sandbox).
        """
        return {}

    def prepare(self, ctx: HarnessContext) -> None:
        """Write the harness's configuration into `ctx.home` (default: nothing to write).

        The session's base URL and token go into files under `ctx.home` or into
        `Command.env`, never into `Command.argv`: a command line is readable by every
        process on the machine (`ps`).
        """

    def program_paths(self) -> list[Path]:
        """Files and folders the harness's program needs besides the system directories and
        the Python that runs openforge (an npm package, a Node, a binary), e.g. its folder
        in the openforge cache. The isolating sandboxes map exactly these read-only (and
        nothing else of the user's HOME). Called in the supervisor, after `check()`.
        Default: none.
        """
        return []

    @abstractmethod
    def command(self, ctx: HarnessContext) -> Command:
        """The command line and environment that run the harness on `ctx.task`."""

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        """Turn the finished process into a `HarnessOutput` (default: by exit code)."""
        if proc.timed_out:
            return HarnessOutput(status="timeout", error="harness timed out")
        if proc.returncode == 0:
            lines = proc.stdout.strip().splitlines()
            return HarnessOutput(status="completed", final_answer=lines[-1] if lines else None)
        if proc.returncode is not None and proc.returncode < 0:
            return HarnessOutput(status="crashed", error=f"killed by signal {-proc.returncode}")
        return HarnessOutput(status="failed", error=(proc.stderr or proc.stdout)[-2000:])


# --- helpers shared by harness plugins -----------------------------------------------------

HarnessT = TypeVar("HarnessT", bound=Harness)


def merge_config(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, recursively for nested dicts (a harness's extra config keys)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def provider_base_url(session_url: str, api: WireAPI) -> str:
    """The URL a harness's provider config points at: the session URL, without its trailing
    `/v1` for Messages, whose clients append `/v1/messages` themselves."""
    url = session_url.rstrip("/")
    if api == "messages" and url.endswith("/v1"):
        return url[: -len("/v1")]
    return url


def drop_none(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without its None values, recursively in nested dicts: "unset" in a config file
    (TOML has no null)."""
    return {key: drop_none(value) if isinstance(value, dict) else value
            for key, value in data.items() if value is not None}


def wire_api_variants(base: type[HarnessT]) -> dict[WireAPI, type[HarnessT]]:
    """One subclass of `base` per wire API, for a harness whose API is a run option.

    `wire_api` is a class attribute, so a harness that can speak any of them is created as
    the subclass for the API its options choose.
    """
    return {api: type(f"{base.__name__}_{api}", (base,),
                      {"wire_api": api, "__module__": base.__module__, "__doc__": base.__doc__})
            for api in get_args(WireAPI)}
