"""The `scripted` engine: replies from a script, as the model's own tokens.

For tests and demos of real harnesses without a trained model. Each reply is rendered to
the exact completion ids the chat template would hold for that assistant turn (ending in
its stop token), so everything downstream (parsing, bridging, recording, training data)
runs on the real path. Logprobs are 0.0.

Script format (YAML or JSON): a list of entries; the first whose `match` regex is found in
the conversation's first user message wins, else in its next user message, and so on (a
harness may send its own context before the task, as Codex does); an entry without
`match` takes any conversation no other entry matched::

    - match: "list files"
      replies:
        - {reasoning: "Look first.", tool_calls: [{name: shell, arguments: {cmd: ls}}]}
        - {content: "There are 2 files."}
    - replies: [{content: "I don't know."}]

The Nth reply answers the conversation's Nth assistant turn (the last one repeats). A reply
`{error: "engine exploded", status: 503}` makes that turn fail with an EngineError.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from openforge.gateway.conversation import ChatRequest, Message, Tool, ToolCall
from openforge.gateway.engines.base import (
    Engine,
    EngineConfigError,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.gateway.engines.local import EngineLog, Finish
from openforge.gateway.render import assistant_turn_ids, new_tool_call_id


class ScriptToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptReply(BaseModel):
    """One assistant turn, or an injected failure (`error`, `status`)."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    error: str | None = None
    status: int = 503

    def message(self) -> Message:
        return Message(role="assistant", content=self.content, reasoning=self.reasoning,
                       tool_calls=[ToolCall(id=new_tool_call_id(), name=c.name,
                                            arguments=json.dumps(c.arguments))
                                   for c in self.tool_calls])


class ScriptEntry(BaseModel):
    match: str | None = None
    replies: list[ScriptReply] = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc})") from None
        return value


class Script(BaseModel):
    entries: list[ScriptEntry] = Field(min_length=1)


def load_script(path: str | Path) -> Script:
    """Read and validate a script file; one-line EngineConfigError on any problem."""
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except OSError as exc:
        raise EngineConfigError(f"script {p}: cannot read it ({exc.strerror or exc})") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EngineConfigError(f"script {p}: not valid {p.suffix.lstrip('.') or 'YAML'}: "
                                f"{first}") from None
    return _validate(data, f"script {p}")


def _validate(data: Any, where: str) -> Script:
    if isinstance(data, dict) and "entries" not in data:
        data = [data]
    try:
        return Script.model_validate({"entries": data} if isinstance(data, list) else data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"][1:]) or "(top)"
        raise EngineConfigError(f"{where}: {loc}: {err['msg']}") from None


class ScriptedEngine(Engine):
    """Options: `script` (file path) or `replies` (inline list of replies) or `entries`
    (inline list of entries); `delay_s` (sleep per generate); `log_size`."""

    def __init__(self, model: Any = None, **options: Any) -> None:
        super().__init__(model, **options)
        if model is None:
            raise EngineConfigError("the scripted engine needs a model bundle (e.g. --model tiny)")
        if options.get("script"):
            self.script = load_script(options["script"])
        elif options.get("entries") is not None:
            self.script = _validate(options["entries"], "scripted engine option 'entries'")
        elif options.get("replies") is not None:
            self.script = _validate([{"replies": options["replies"]}],
                                    "scripted engine option 'replies'")
        else:
            raise EngineConfigError("the scripted engine needs a script: set the option "
                                    "script=PATH (YAML or JSON) or replies=[...]")
        try:
            self.delay_s = float(options.get("delay_s", 0.0))
        except (TypeError, ValueError):
            raise EngineConfigError(f"scripted engine: delay_s must be a number, "
                                    f"not {options.get('delay_s')!r}") from None
        self._patterns = [re.compile(e.match) if e.match else None for e in self.script.entries]
        self._ids_cache: dict[tuple[int, int, int], list[int]] = {}
        self.log = EngineLog(int(options.get("log_size", 10_000)))

    @property
    def weight_version(self) -> str:
        return "scripted"

    def pick(self, chat: ChatRequest | None) -> tuple[int, int, ScriptReply]:
        """(entry index, reply index, reply) for this conversation's next assistant turn."""
        users: list[str] = [""]
        turns = 0
        if chat is not None:
            users = [m.content for m in chat.messages if m.role == "user"] or [
                chat.raw_prompt or ""]
            turns = sum(1 for m in chat.messages if m.role == "assistant")
        entries = list(enumerate(zip(self.script.entries, self._patterns, strict=True)))
        found = next((i for text in users for i, (_, pattern) in entries
                      if pattern is not None and pattern.search(text)), None)
        if found is None:
            found = next((i for i, (_, pattern) in entries if pattern is None), None)
        if found is None:
            raise EngineError("scripted engine: no script entry matches the user messages "
                              f"{' | '.join(u[:60] for u in users)[:240]!r}", 502)
        entry = self.script.entries[found]
        j = min(turns, len(entry.replies) - 1)
        return found, j, entry.replies[j]

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        i, j, reply = self.pick(request.chat)
        if reply.error is not None:
            raise EngineError(reply.error, reply.status)
        ids = self._completion_ids(request.chat, i, j, reply)
        finish: Finish = "stop"
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[:request.sampling.max_tokens], "length"
        logprobs = [0.0] * len(ids)
        self.log.record(request, ids, logprobs, finish)
        return GenerateResult(completion_ids=ids, logprobs=logprobs, finish_reason=finish,
                              weight_version=self.weight_version)

    def _completion_ids(self, chat: ChatRequest | None, i: int, j: int,
                        reply: ScriptReply) -> list[int]:
        bundle = self.model
        if chat is None or chat.raw_prompt is not None or chat.raw_prompt_ids is not None:
            return bundle.encode(reply.content) + bundle.stop_token_ids[:1]
        tools: list[Tool] = chat.tools
        key = (i, j, hash(tuple(t.name for t in tools)))
        ids = self._ids_cache.get(key)
        if ids is None:
            # A fresh turn after a one-message context: the assistant turn's tokens do not
            # depend on the history for the templates we know, and caching keeps the
            # engine near-instant for benchmarks.
            ids = assistant_turn_ids(bundle, [], reply.message(), tools)
            self._ids_cache[key] = ids
        return list(ids)
