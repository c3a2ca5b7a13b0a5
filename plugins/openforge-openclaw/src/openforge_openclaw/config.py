"""The `openclaw` harness's options and the OpenClaw config file written per rollout.

OpenClaw reads one JSON5 file (`--config`); plain JSON is valid JSON5, so the file is
written with `json`. It declares one custom provider, `of`, whose endpoint is the
session URL and whose key is the session token, and makes `of/<model>` the primary model.
The task's MCP servers (`ctx.mcp_servers`) go under `mcp.servers` (stdio), with OpenClaw's
Tool Search off (`tools.toolSearch: false`) so their tools reach the model as direct tools,
not behind `tool_search` / `tool_call`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openforge.harness import HarnessContext, WireAPI, merge_config, provider_base_url

OPENCLAW_PACKAGE = "openclaw"
OPENCLAW_VERSION = "2026.9.6"
NODE_MIN = "24.16.0"  # openclaw's engines: ">=24.16.0 <25 || >=26.1.0"
PROVIDER = "of"
CONFIG_FILE = "openforge.json5"

Api = Literal["chat", "responses", "messages"]

# The harness option `api` -> OpenClaw's provider `api` value.
OPENCLAW_API: dict[Api, str] = {"chat": "openai-completions", "responses": "openai-responses",
                                "messages": "anthropic-messages"}
WIRE_API: dict[Api, WireAPI] = {"chat": "chat", "responses": "responses", "messages": "messages"}


class OpenClawOptions(BaseModel):
    """Options of the `openclaw` harness (`harness_options` in the run config)."""

    model_config = ConfigDict(extra="forbid")

    api: Api = "chat"
    version: str = OPENCLAW_VERSION  # the npm `openclaw` version installed
    # The OpenClaw entry script (`openclaw.mjs`) and the node that runs it; `install`
    # resolves both once per run and passes them to the rollouts through these options.
    bin: str | None = None
    node: str | None = None
    context_window: int = Field(default=32_768, ge=1024)
    max_tokens: int = Field(default=4096, ge=1)
    thinking: str | None = None  # OpenClaw's `--thinking` level; None: its default
    # Seconds kept between OpenClaw's own deadline (`--timeout`) and the rollout's hard
    # timeout, so OpenClaw can report a timeout itself. It starts in ~10 s on 2 cores.
    timeout_margin_s: float = Field(default=20.0, ge=0)
    config: dict[str, Any] = Field(default_factory=dict)  # extra config keys, merged last


def build_config(ctx: HarnessContext, options: OpenClawOptions) -> dict[str, Any]:
    """The OpenClaw config for one rollout."""
    model = {"id": ctx.model, "name": ctx.model, "reasoning": False, "input": ["text"],
             "contextWindow": options.context_window, "maxTokens": options.max_tokens}
    base: dict[str, Any] = {
        "models": {
            # Only our provider: nothing may reach a hosted model from a rollout.
            "mode": "replace",
            "providers": {PROVIDER: {
                "baseUrl": provider_base_url(ctx.base_url, options.api),
                "apiKey": ctx.api_key,
                "api": OPENCLAW_API[options.api],
                "models": [model],
            }},
        },
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{ctx.model}"},
                                "workspace": str(ctx.workspace)}},
    }
    if ctx.mcp_servers:
        base["mcp"] = {"servers": {s.name: {"transport": "stdio", "command": s.command,
                                            "args": s.args, "env": s.env, "enabled": True}
                                   for s in ctx.mcp_servers}}
        base["tools"] = {"toolSearch": False}
    return merge_config(base, options.config)


def config_path(ctx: HarnessContext) -> Path:
    return ctx.home / ".openclaw" / CONFIG_FILE


def state_path(ctx: HarnessContext) -> Path:
    """OpenClaw's state directory for the run (`--state-dir`): sessions, caches, databases."""
    return ctx.home / ".openclaw" / "state"


def prompt_path(ctx: HarnessContext) -> Path:
    return ctx.home / ".openclaw" / "task.md"


def write_config(ctx: HarnessContext, options: OpenClawOptions) -> Path:
    """Write the config into the rollout's isolated HOME and return its path."""
    path = config_path(ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build_config(ctx, options), indent=2) + "\n")
    return path
