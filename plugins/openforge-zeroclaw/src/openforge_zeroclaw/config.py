"""The `zeroclaw` harness's options and the ZeroClaw config written per rollout.

ZeroClaw (0.8, config schema 3) reads `$ZEROCLAW_CONFIG_DIR/config.toml`, by default
`~/.zeroclaw/config.toml`. The config holds one provider alias, one agent using it, a
risk profile that lets it act unattended and a runtime profile bounding its loop:

- `chat`: `[providers.models.custom.of]` with `uri` = the session URL (OpenAI chat
  completions, ZeroClaw appends `/chat/completions`);
- `responses`: the same with `wire_api = "responses"`;
- `messages`: `[providers.models.anthropic.of]` with `uri` = the session URL without
  `/v1` (ZeroClaw appends `/v1/messages`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import Field

from openforge.harness import (
    HarnessContext,
    WireAPI,
    drop_none,
    merge_config,
    provider_base_url,
)
from openforge.options import PluginOptions

ALIAS = "of"
SCHEMA_VERSION = 3
Api = Literal["chat", "responses", "messages"]
WIRE_API: dict[Api, WireAPI] = {"chat": "chat", "responses": "responses", "messages": "messages"}


class ZeroClawOptions(PluginOptions):
    """Options of the `zeroclaw` harness (`harness_options` in the run config)."""


    api: Api = "chat"
    bin: str | None = None  # the zeroclaw binary; default $ZEROCLAW_BIN, then PATH
    max_tool_iterations: int = Field(default=20, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    request_timeout_s: int = Field(default=300, ge=1)  # per model request
    config: dict[str, Any] = Field(default_factory=dict)  # extra config keys, merged last


def provider_slot(api: Api) -> str:
    """The provider family slot: `custom` (OpenAI-compatible) or `anthropic`."""
    return "anthropic" if api == "messages" else "custom"


def build_config(ctx: HarnessContext, options: ZeroClawOptions) -> dict[str, Any]:
    """The ZeroClaw config for one rollout, as nested dicts (None values are left out)."""
    slot = provider_slot(options.api)
    provider: dict[str, Any] = {
        "uri": provider_base_url(ctx.base_url, options.api),
        "model": ctx.model,
        "api_key": ctx.api_key,
        "wire_api": "responses" if options.api == "responses" else None,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "timeout_secs": options.request_timeout_s,
    }
    base: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "providers": {"models": {slot: {ALIAS: provider}}},
        "agents": {ALIAS: {
            "enabled": True,
            "model_provider": f"{slot}.{ALIAS}",
            "risk_profile": ALIAS,
            "runtime_profile": ALIAS,
            "workspace": {"path": str(ctx.workspace)},
        }},
        # Unattended: no approval prompts (nobody answers them). The rollout's own
        # sandbox isolates it; ZeroClaw's nested sandboxes (bwrap, Landlock) would need
        # namespaces the rollout sandbox does not grant.
        "risk_profiles": {ALIAS: {
            "level": "full",
            "require_approval_for_medium_risk": False,
            "block_high_risk_commands": False,
            "sandbox_enabled": False,
        }},
        "runtime_profiles": {ALIAS: {"max_tool_iterations": options.max_tool_iterations}},
        # Every rollout starts fresh: no memories carried between tasks.
        "memory": {"auto_save": False},
    }
    return merge_config(base, options.config)


def config_dir(ctx: HarnessContext) -> Path:
    return ctx.home / ".zeroclaw"


def write_config(ctx: HarnessContext, options: ZeroClawOptions) -> Path:
    """Write `$HOME/.zeroclaw/config.toml` into the rollout's isolated HOME."""
    path = config_dir(ctx) / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(drop_none(build_config(ctx, options))))
    return path
