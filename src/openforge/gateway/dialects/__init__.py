"""The four wire dialects: wire request -> canonical `ChatRequest`, `Completion` -> wire.

`DIALECTS` maps each dialect's name (the value the store records and harness plugins
declare) to its stateless instance.
"""

from __future__ import annotations

from openforge.gateway.dialects.anthropic import AnthropicDialect, count_tokens_response
from openforge.gateway.dialects.base import KEEPALIVE_FRAME, Dialect, DialectError
from openforge.gateway.dialects.chat import ChatDialect
from openforge.gateway.dialects.completions import CompletionsDialect
from openforge.gateway.dialects.responses import ResponsesDialect

DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (ChatDialect(), CompletionsDialect(), ResponsesDialect(), AnthropicDialect())
}

__all__ = [
    "DIALECTS",
    "KEEPALIVE_FRAME",
    "AnthropicDialect",
    "ChatDialect",
    "CompletionsDialect",
    "Dialect",
    "DialectError",
    "ResponsesDialect",
    "count_tokens_response",
]
