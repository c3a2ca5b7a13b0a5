"""Shared fixtures for tests that need the tiny model (import them in a test module or conftest).

`tiny_bundle` is the tokenizer + renderer of the tiny untrained Qwen3 model, built offline
on first use into the openforge cache (`$OPENFORGE_CACHE` or ~/.cache/openforge).
"""

from __future__ import annotations

import json

import pytest

from openforge.gateway.conversation import ChatRequest, Message, Tool, ToolCall
from openforge.gateway.model import ModelBundle, load_model_bundle

SHELL_TOOL = Tool(
    name="shell", description="Run a shell command and return its output.",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)


@pytest.fixture(scope="session")
def tiny_bundle() -> ModelBundle:
    return load_model_bundle("tiny")


def shell_call(cid: str, cmd: str) -> ToolCall:
    return ToolCall(id=cid, name="shell", arguments=json.dumps({"cmd": cmd}))


def chat(messages: list[Message], tools: list[Tool] | None = None, **kw: object) -> ChatRequest:
    return ChatRequest(model="tiny", messages=messages, tools=tools or [], **kw)
