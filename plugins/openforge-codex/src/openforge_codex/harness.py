"""The `codex` harness: `codex exec --json` against the session URL over the Responses API.

Per rollout the harness writes `$CODEX_HOME/config.toml` into the rollout's isolated HOME
(`<home>/.codex`): a custom model provider `openforge` whose `base_url` is the session
URL, `wire_api = "responses"` (the only wire API Codex 0.171 accepts) and `env_key`
naming the variable that holds the session token. The user's `~/.codex` is never read
or written. The task goes in on stdin (`codex exec ... -`), so a prompt that starts with
`-` cannot be taken for a flag.

Codex runs its shell tool in its own bubblewrap sandbox. Nested inside openforge's
sandbox that would need a second user namespace; `sandbox = "none"` (the default) passes
`--dangerously-bypass-approvals-and-sandbox`, which is what Codex documents for
"environments that are externally sandboxed". The other values are Codex's own modes.

The task's MCP servers (`ctx.mcp_servers`) go into the same file as `[mcp_servers.<name>]`
(`command`, `args`, `env`), `required = true`: `codex exec` then waits for each server's
tools before its first request (otherwise that request goes out without them) and fails
when one cannot start. Codex offers a server's tools as the Responses `namespace`
`mcp__<name>`; the gateway shows them to the policy as `mcp__<name>__<tool>`.

Counting model requests: each Responses request Codex makes is followed in its session
file (`$CODEX_HOME/sessions/**/rollout-*.jsonl`) by one `token_count` event; the harness
returns that file as its transcript together with the `--json` events.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import tomli_w
from pydantic import Field

from openforge.harness import (
    Command,
    HarnessContext,
    HarnessOutput,
    ProcessOutput,
    WireAPI,
    drop_none,
    merge_config,
)
from openforge.npm import NpmHarness, NpmPackage
from openforge.options import PluginOptions
from openforge.sandbox import bounded
from openforge_codex.events import parse_events

CODEX_PACKAGE = "@openai/codex"
CODEX_VERSION = "0.171.0"
BIN_ENV = "OPENFORGE_CODEX_BIN"
KEY_ENV = "OPENFORGE_SESSION_TOKEN"  # the provider's env_key: Codex reads the key from it
PROVIDER = "openforge"
LAST_MESSAGE = "codex-last-message.txt"
SESSION_MAX = 64 << 20  # bytes of Codex's session file (and last message) read
MCP_STARTUP_TIMEOUT_S = 60  # a Python MCP server starts in ~1 s, more on a loaded machine

Sandbox = Literal["none", "read-only", "workspace-write", "danger-full-access"]


class CodexOptions(PluginOptions):
    """Options of the `codex` harness (`harness_options` in the run config)."""

    version: str = CODEX_VERSION  # the @openai/codex version installed from npm
    bin: str | None = None  # a codex program to use instead (set by `install` for rollouts)
    sandbox: Sandbox = "none"
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    # Retries of Codex itself against the gateway. 0: a failed call ends the run, so the
    # recorded calls are exactly the requests the harness made.
    request_max_retries: int = Field(default=0, ge=0)
    stream_max_retries: int = Field(default=0, ge=0)
    stream_idle_timeout_ms: int = Field(default=600_000, ge=1000)
    # Replaces Codex's own base instructions (its system prompt, ~7k tokens) with this text,
    # written into the rollout's CODEX_HOME (`model_instructions_file`): for small models
    # whose context cannot hold Codex's, e.g. the harness-native training recipe.
    instructions: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)  # extra config.toml keys (merged last)


INSTRUCTIONS_FILE = "instructions.md"


class CodexHarness(NpmHarness):
    """OpenAI Codex CLI (`codex exec`, npm @openai/codex), Responses API."""

    harness_name: ClassVar[str] = "codex"
    wire_api: ClassVar[WireAPI] = "responses"

    options_model = CodexOptions
    options: CodexOptions

    @property
    def package(self) -> NpmPackage:
        return NpmPackage(name=CODEX_PACKAGE, version=self.options.version, bin="codex", env_var=BIN_ENV)

    # -- one rollout -----------------------------------------------------------------------

    @staticmethod
    def codex_home(ctx: HarnessContext) -> Path:
        return ctx.home / ".codex"

    def config_dict(self, ctx: HarnessContext) -> dict[str, Any]:
        """The content of `$CODEX_HOME/config.toml` for this rollout."""
        cfg = self.options
        base: dict[str, Any] = {
            "model": ctx.model,
            "model_provider": PROVIDER,
            "approval_policy": "never",
            "sandbox_mode": "workspace-write" if cfg.sandbox == "none" else cfg.sandbox,
            "model_reasoning_effort": cfg.reasoning_effort,
            # Nothing may leave the sandbox but model calls to the gateway.
            "check_for_update_on_startup": False,
            "web_search": "disabled",
            "analytics": {"enabled": False},
            "feedback": {"enabled": False},
            "history": {"persistence": "none"},
            "model_providers": {PROVIDER: {
                "name": PROVIDER,
                "base_url": ctx.base_url,
                "env_key": KEY_ENV,
                "wire_api": "responses",
                "request_max_retries": cfg.request_max_retries,
                "stream_max_retries": cfg.stream_max_retries,
                "stream_idle_timeout_ms": cfg.stream_idle_timeout_ms,
            }},
        }
        if cfg.instructions is not None:
            base["model_instructions_file"] = str(self.codex_home(ctx) / INSTRUCTIONS_FILE)
        if ctx.mcp_servers:
            base["mcp_servers"] = {s.name: {"command": s.command, "args": s.args, "env": s.env,
                                            "required": True,
                                            "startup_timeout_sec": MCP_STARTUP_TIMEOUT_S}
                                   for s in ctx.mcp_servers}
        return merge_config(base, cfg.config)

    def prepare(self, ctx: HarnessContext) -> None:
        home = self.codex_home(ctx)
        home.mkdir(parents=True, exist_ok=True)
        if self.options.instructions is not None:
            (home / INSTRUCTIONS_FILE).write_text(self.options.instructions, encoding="utf-8")
        (home / "config.toml").write_text(tomli_w.dumps(drop_none(self.config_dict(ctx))),
                                          encoding="utf-8")

    def command(self, ctx: HarnessContext) -> Command:
        argv = [str(self.program()), "exec", "--json", "--skip-git-repo-check",
                "-C", str(ctx.workspace), "-m", ctx.model,
                "-o", str(ctx.home / LAST_MESSAGE)]
        if self.options.sandbox == "none":
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        else:
            argv += ["-s", self.options.sandbox]
        argv.append("-")  # the prompt comes on stdin
        env = {"CODEX_HOME": str(self.codex_home(ctx)), KEY_ENV: ctx.api_key,
               # Codex would otherwise try to colour and page its output.
               "NO_COLOR": "1", "RUST_LOG": os.environ.get("RUST_LOG", "error")}
        return Command(argv=argv, env=env, cwd=ctx.workspace, stdin=ctx.task.prompt)

    # -- the end ---------------------------------------------------------------------------

    def session_file(self, ctx: HarnessContext) -> Path | None:
        """Codex's own transcript of the run (`sessions/**/rollout-*.jsonl`), if written."""
        files = sorted((self.codex_home(ctx) / "sessions").glob("**/rollout-*.jsonl"))
        return files[-1] if files else None

    def read_session(self, ctx: HarnessContext) -> list[dict[str, Any]]:
        path = self.session_file(ctx)
        if path is None:
            return []
        items = []
        # In the agent's HOME: as large as the agent makes it, so read bounded (a cut line
        # does not parse, and is skipped).
        for line in bounded.read_text(path, SESSION_MAX).splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                items.append(item)
        return items

    @staticmethod
    def count_requests(session: list[dict[str, Any]]) -> int:
        """Model requests made, from the session file: one `token_count` event per response."""
        return sum(1 for item in session if item.get("type") == "event_msg"
                   and isinstance(item.get("payload"), dict)
                   and item["payload"].get("type") == "token_count"
                   and item["payload"].get("info") is not None)

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        run = parse_events(proc.stdout)
        session = self.read_session(ctx)
        last = ctx.home / LAST_MESSAGE
        final = run.final_message
        if final is None and last.is_file():
            final = bounded.read_text(last, SESSION_MAX).strip() or None
        transcript = {"events": run.events, "session": session, "commands": run.commands,
                      "usage": run.usage, "model_requests": self.count_requests(session)}
        if proc.timed_out:
            return HarnessOutput(status="timeout", final_answer=final, transcript=transcript,
                                 error="codex timed out")
        if proc.returncode is not None and proc.returncode < 0:
            return HarnessOutput(status="crashed", final_answer=final, transcript=transcript,
                                 error=f"codex killed by signal {-proc.returncode}")
        if run.completed and proc.returncode == 0:
            return HarnessOutput(status="completed", final_answer=final, transcript=transcript)
        if run.failed or (run.error and run.events):
            # Codex reported the failure itself (e.g. the model endpoint returned an error).
            return HarnessOutput(status="failed", final_answer=final, transcript=transcript,
                                 error=run.error or f"codex exited with code {proc.returncode}")
        # No events at all, or an exit without a turn end: the program did not run properly.
        tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        return HarnessOutput(status="crashed", final_answer=final, transcript=transcript,
                             error=f"codex exited with code {proc.returncode} without finishing its "
                                   f"turn" + (f": {tail}" if tail else ""))
