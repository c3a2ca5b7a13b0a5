"""Reuse of the history a harness resends with every request.

Harnesses are stateless clients: each request carries the whole conversation again, so
turn N would parse the N-1 turns it already parsed. A `HistoryMemo` (one per session)
keeps a fingerprint of each raw item of the session's last parsed request (chat messages,
Responses input items, Anthropic messages) and the canonical messages they became. The
next request's leading items whose fingerprints match reuse those `Message` objects; only
the rest is parsed.

A fingerprint identifies the item's exact JSON value: types, key order and values. That is
stricter than `==` on purpose: in Python `1 == 1.0 == True` and `{"a": 1, "b": 2} ==
{"b": 2, "a": 1}`, yet such items can parse differently (a boolean field is type-checked,
tool arguments are kept as JSON text in their key order). It is the keyed 64-bit hash of
the item's `marshal` serialization (version 2: no back-references, so equal values always
serialize alike); the memo holds no raw JSON, only integers, which keeps it small and out
of the garbage collector's way. Like the renderer's message fingerprints, it relies on
64-bit hashes not colliding.

A dialect whose items do not map one to one onto messages (Responses merges the items of
one assistant turn into one message) marks only the boundaries where its history is
complete; reuse stops at the last such boundary before the first changed item.

Reused messages are shared between requests: nothing downstream may mutate a parsed
`Message` (dialects build new ones; the renderer and the recorder only read them).
"""

from __future__ import annotations

import marshal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge.gateway.conversation import Message, Tool

OPEN = -1
"""An item boundary where the parsed history is incomplete (cannot resume there)."""


def fingerprint(value: Any) -> int | None:
    """The fingerprint of a decoded JSON value; None (matches nothing) if it has none."""
    try:
        return hash(marshal.dumps(value, 2))
    except ValueError:  # nested beyond marshal's limit: never reused, always parsed
        return None


@dataclass(slots=True)
class Resume:
    """Where parsing a request starts: its first `n` items are reused.

    `messages` and `ends` hold what those items parsed to (new lists, to be extended by
    parsing the remaining items: each item appends its messages, then its boundary to
    `ends`); `prints` are the fingerprints of all the request's items. `called` maps the
    id of each tool call the reused messages made to the message that made it first.
    """

    n: int = 0
    messages: list[Message] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    prints: list[int | None] = field(default_factory=list)
    called: dict[str, int] = field(default_factory=dict)
    reused: int = 0  # how many of `messages` were reused (already checked)


def resume(memo: HistoryMemo | None, dialect: str, items: Sequence[Any]) -> Resume:
    """`memo.resume(dialect, items)`, or a fresh start without a memo."""
    return memo.resume(dialect, items) if memo is not None else Resume()


class HistoryMemo:
    """One session's last parsed history, item by item, and its last parsed tools."""

    __slots__ = ("dialect", "prints", "ends", "messages", "called", "tools_print", "tools")

    def __init__(self) -> None:
        self.dialect = ""
        self.prints: list[int | None] = []
        # ends[i]: how many messages items[:i + 1] produced, or OPEN.
        self.ends: list[int] = []
        self.messages: list[Message] = []
        self.called: dict[str, int] = {}  # tool call id -> the message that made it first
        self.tools_print: int | None = None
        self.tools: list[Tool] | None = None

    def clear(self) -> None:
        """Forget the last request (it was refused: the next one should not build on it)."""
        self.__init__()  # type: ignore[misc]

    def resume(self, dialect: str, items: Sequence[Any]) -> Resume:
        """The longest prefix of `items` identical to the last request's that ends at a
        complete boundary, with the messages it parsed to."""
        prints = [fingerprint(item) for item in items]
        if dialect != self.dialect:
            return Resume(prints=prints)
        n = produced = 0
        for i, (new, old) in enumerate(zip(prints, self.prints, strict=False)):
            if new is None or new != old:
                break
            if self.ends[i] != OPEN:
                n, produced = i + 1, self.ends[i]
        if produced == len(self.messages):
            called = dict(self.called)
        else:  # calls are kept in message order: those of the reused messages
            called = {k: at for k, at in self.called.items() if at < produced}
        return Resume(n, self.messages[:produced], self.ends[:n], prints, called, produced)

    def reuse_tools(self, dialect: str, raw: Any) -> list[Tool] | None:
        """The tools parsed last time from an identical `tools` value (a new list), or None."""
        if self.tools is None or dialect != self.dialect:
            return None
        new = fingerprint(raw)
        if new is None or new != self.tools_print:
            return None
        return list(self.tools)

    def remember(self, dialect: str, parsed: Resume, raw_tools: Any, tools: list[Tool]) -> None:
        """Keep a successfully parsed request for the next request of the session."""
        self.dialect = dialect
        self.prints = parsed.prints
        self.ends = parsed.ends
        self.messages = list(parsed.messages)
        self.called = parsed.called
        if not (self.tools and _same_objects(tools, self.tools)):
            # Not what reuse_tools returned: fingerprint the value they came from.
            self.tools_print = fingerprint(raw_tools)
        self.tools = list(tools)


def _same_objects(a: list[Tool], b: list[Tool]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
