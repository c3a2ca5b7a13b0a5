"""The `claude-code` harness: `claude -p` against the session URL over the Messages API.

Per rollout: `ANTHROPIC_BASE_URL` is the session URL without its trailing `/v1` (Claude
Code appends `/v1/messages?beta=true` itself), `ANTHROPIC_API_KEY` the session token,
`CLAUDE_CONFIG_DIR` a folder in the rollout's isolated HOME holding a `settings.json`
(no auto-updates, no telemetry); `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` keeps every
request but model calls away. The user's `~/.claude` is never read or written.

Permissions: a rollout is unattended, so `permissions = "skip"` (the default) passes
`--dangerously-skip-permissions`; Claude Code refuses that as root unless `IS_SANDBOX=1`,
which the harness sets (openforge's executor is the sandbox). `permissions = "allowed"`
instead passes `--allowedTools` with `allowed_tools`.

The task's MCP servers (`ctx.mcp_servers`) go into `<config dir>/mcp.json`, passed with
`--mcp-config` and `--strict-mcp-config` (no other MCP config is read); their tools reach
the model as `mcp__<server>__<tool>`, and `permissions = "allowed"` allows them too.

The task goes in on stdin. Output is `--output-format stream-json --verbose`: one line
per assistant content block (blocks of one model response share a message id, which
counts the model requests of the main loop) and a final `result` object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from openforge.harness import (
    Command,
    HarnessContext,
    HarnessOutput,
    ProcessOutput,
    WireAPI,
    provider_base_url,
    validate_options,
)
from openforge.npm import NpmHarness, NpmPackage
from openforge_claude_code.stream import parse_stream

CLAUDE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_VERSION = "2.1.332"
BIN_ENV = "OPENFORGE_CLAUDE_CODE_BIN"
DEFAULT_TOOLS = ["Bash", "Edit", "Write", "Read", "Glob", "Grep", "MultiEdit", "NotebookEdit",
                 "TodoWrite"]


class ClaudeCodeOptions(BaseModel):
    """Options of the `claude-code` harness (`harness_options` in the run config)."""

    model_config = ConfigDict(extra="forbid")

    version: str = CLAUDE_VERSION  # the @anthropic-ai/claude-code version installed from npm
    bin: str | None = None  # a claude program to use instead (set by `install` for rollouts)
    permissions: Literal["skip", "allowed"] = "skip"
    allowed_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    disallowed_tools: list[str] = Field(default_factory=lambda: ["WebFetch", "WebSearch"])
    max_turns: int | None = Field(default=None, ge=1)
    # Claude Code asks for max_tokens=32000 per call, and a request's max_tokens overrides
    # the run's sampling.max_tokens; this caps it (CLAUDE_CODE_MAX_OUTPUT_TOKENS).
    max_output_tokens: int | None = Field(default=None, ge=1)
    # The model Claude Code uses for its small side calls; default: the policy itself.
    small_fast_model: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)  # extra settings.json keys


def anthropic_base_url(session_url: str) -> str:
    """The session URL without its trailing `/v1`: Claude Code appends `/v1/messages`."""
    return provider_base_url(session_url, "messages")


class ClaudeCodeHarness(NpmHarness):
    """Claude Code (`claude -p`, npm @anthropic-ai/claude-code), Anthropic Messages API."""

    harness_name: ClassVar[str] = "claude-code"
    wire_api: ClassVar[WireAPI] = "messages"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = validate_options(ClaudeCodeOptions, options, "claude-code")

    @property
    def package(self) -> NpmPackage:
        return NpmPackage(name=CLAUDE_PACKAGE, version=self.config.version, bin="claude",
                          env_var=BIN_ENV)

    # -- one rollout -----------------------------------------------------------------------

    @staticmethod
    def config_dir(ctx: HarnessContext) -> Path:
        return ctx.home / ".claude"

    def settings(self) -> dict[str, Any]:
        """The content of `$CLAUDE_CONFIG_DIR/settings.json` for this rollout."""
        base: dict[str, Any] = {
            "autoUpdates": False,
            "includeCoAuthoredBy": False,
            "permissions": {"deny": list(self.config.disallowed_tools)},
            "env": {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_ERROR_REPORTING": "1"},
        }
        return {**base, **self.config.settings}

    @classmethod
    def mcp_config_path(cls, ctx: HarnessContext) -> Path:
        return cls.config_dir(ctx) / "mcp.json"

    def prepare(self, ctx: HarnessContext) -> None:
        folder = self.config_dir(ctx)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "settings.json").write_text(json.dumps(self.settings(), indent=2) + "\n")
        if ctx.mcp_servers:
            servers = {s.name: {"type": "stdio", "command": s.command, "args": s.args,
                                "env": s.env} for s in ctx.mcp_servers}
            self.mcp_config_path(ctx).write_text(json.dumps({"mcpServers": servers}, indent=2))

    def environment(self, ctx: HarnessContext) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": anthropic_base_url(ctx.base_url),
            "ANTHROPIC_API_KEY": ctx.api_key,
            "ANTHROPIC_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": self.config.small_fast_model or ctx.model,
            "CLAUDE_CONFIG_DIR": str(self.config_dir(ctx)),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
            "NO_COLOR": "1",
        }
        if self.config.max_output_tokens is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.config.max_output_tokens)
        return env

    def command(self, ctx: HarnessContext) -> Command:
        argv = [str(self.program()), "-p", "--output-format", "stream-json", "--verbose",
                "--model", ctx.model]
        if self.config.permissions == "skip":
            argv.append("--dangerously-skip-permissions")
        else:
            mcp = [f"mcp__{s.name}" for s in ctx.mcp_servers]
            argv += ["--allowedTools", ",".join([*self.config.allowed_tools, *mcp])]
        if self.config.disallowed_tools:
            argv += ["--disallowedTools", ",".join(self.config.disallowed_tools)]
        if self.config.max_turns is not None:
            argv += ["--max-turns", str(self.config.max_turns)]
        if ctx.mcp_servers:
            argv += ["--mcp-config", str(self.mcp_config_path(ctx)), "--strict-mcp-config"]
        return Command(argv=argv, env=self.environment(ctx), cwd=ctx.workspace,
                       stdin=ctx.task.prompt)

    # -- the end ---------------------------------------------------------------------------

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        run = parse_stream(proc.stdout)
        transcript = {"lines": run.lines, "result": run.result, "tool_uses": run.tool_uses,
                      "model_requests": run.model_requests}
        final = run.final_answer
        if proc.timed_out:
            return HarnessOutput(status="timeout", final_answer=final, transcript=transcript,
                                 error="claude-code timed out")
        if proc.returncode is not None and proc.returncode < 0:
            return HarnessOutput(status="crashed", final_answer=final, transcript=transcript,
                                 error=f"claude killed by signal {-proc.returncode}")
        if run.result is not None and run.succeeded:
            return HarnessOutput(status="completed", final_answer=final, transcript=transcript)
        if run.result is not None:
            # Claude Code ended its own way: an API error, max turns, ...
            return HarnessOutput(status="failed", final_answer=final, transcript=transcript,
                                 error=run.error or f"claude exited with code {proc.returncode}")
        tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        return HarnessOutput(status="crashed", final_answer=final, transcript=transcript,
                             error=f"claude exited with code {proc.returncode} without a result"
                                   + (f": {tail}" if tail else ""))
