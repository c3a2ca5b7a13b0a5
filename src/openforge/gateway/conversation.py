"""The canonical conversation every wire dialect is parsed into.

Each dialect (OpenAI chat, completions, Responses, Anthropic Messages) turns its wire
request into a `ChatRequest` and a `Completion` back into its wire response. The renderer
turns `Message`s into token ids with the model's own chat template. The message shape
deliberately mirrors the OpenAI chat format that `renderers` consumes
(`Message.to_renderer()`), so nothing is lost between the two.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from openforge.types import SamplingParams

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(BaseModel):
    """A call the assistant made. `arguments` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str = "{}"

    def arguments_dict(self) -> dict[str, Any]:
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


class ImageRef(BaseModel):
    """An image in a message: the URL the client sent (a data URL, file or http(s) URL).

    `openforge.gateway.images.resolve_images` fills in the exact bytes (`data`), their
    sha256 (the image's key in the store) and their media type before the request is
    rendered; the renderer only ever sees the bytes.
    """

    url: str
    sha256: str | None = None
    media_type: str | None = None
    data: bytes | None = Field(default=None, exclude=True, repr=False)


class Message(BaseModel):
    """One turn: system, user, assistant (text, reasoning, tool calls) or tool result."""

    role: Role
    content: str = ""
    images: list[ImageRef] = Field(default_factory=list)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def to_renderer(self) -> dict[str, Any]:
        """This message in the OpenAI-chat dict shape that `renderers` takes."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.images:
            parts: list[dict[str, Any]] = [
                {"type": "image", "image": i.data if i.data is not None else i.url}
                for i in self.images]
            if self.content:
                parts.append({"type": "text", "text": self.content})
            out["content"] = parts
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "id": c.id,
                 "function": {"name": c.name, "arguments": c.arguments_dict()}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out


class Tool(BaseModel):
    """A function the policy may call (JSON-schema parameters).

    `namespace` is set for a function the client grouped under a namespace (Codex's MCP
    tools, OpenAI Responses `namespace` tools): `name` is then `<namespace>__<function>`,
    the one name the policy sees and calls; the dialect splits it again in its answer.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    namespace: str | None = None

    def to_renderer(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


class ChatRequest(BaseModel):
    """A dialect-independent request: the conversation plus how to sample.

    `raw_prompt` is set instead of `messages` by the legacy completions dialect, whose
    prompt is text (or token ids in `raw_prompt_ids`) that bypasses the chat template.
    """

    model: str = ""
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    # OpenAI `stream_options.include_usage`: send a final usage-only chunk when streaming.
    include_usage: bool = False
    raw_prompt: str | None = None
    raw_prompt_ids: list[int] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class Completion(BaseModel):
    """What the policy answered, parsed: the assistant message plus token accounting."""

    message: Message
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
