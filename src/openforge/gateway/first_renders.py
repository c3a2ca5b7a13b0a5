"""Sessions' first prompts, rendered once per model (`FirstRenders`).

A session's first call renders its whole conversation with the chat template: for a
harness's system prompt and tool list of thousands of tokens that is milliseconds of the
renderer's per-token work, and every later call of the session only bridges onto it. The
rollouts of one task open with the same messages (the k attempts of a GRPO group, a
retried rollout), so the model's sessions share those renders.

An entry is found by the exact value of what the renderer is given, messages and tools as
the renderer's dicts (their `marshal` serialization, hashed to 64 bits like the history
memo's fingerprints): a conversation that differs in anything, key order included, renders
on its own. Images are not cached (their bytes would be hashed on every first call).
"""

from __future__ import annotations

import marshal
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MAX_ENTRIES = 256
"""First prompts kept (least recently used first out): 4 bytes per id, so 256 prompts of
11k tokens hold about 11 MB."""


class FirstRenders:
    """The ids of recent first prompts, shared by the sessions of one model (thread-safe:
    renders run in the gateway's render threads)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._ids: OrderedDict[int, array] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               render: Callable[[], list[int]]) -> list[int]:
        """The ids `render()` gives for `messages` and `tools`: from an earlier session's
        identical first call, else rendered now (and kept)."""
        key = _key(messages, tools)
        if key is None:
            return render()
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                self.hits += 1
                return ids.tolist()
            self.misses += 1
        rendered = render()  # outside the lock: another session may render meanwhile
        with self._lock:
            self._ids[key] = array("i", rendered)
            while len(self._ids) > self.max_entries:
                self._ids.popitem(last=False)
        return rendered

    def __len__(self) -> int:
        return len(self._ids)


def _key(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int | None:
    if any(not isinstance(m.get("content"), str) for m in messages):
        return None  # content parts: images
    try:
        return hash(marshal.dumps((messages, tools), 2))
    except ValueError:  # a value marshal cannot write, or nested too deep: not cached
        return None
