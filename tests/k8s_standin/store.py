"""The stand-in's object store: resourceVersions, a bounded event history, watchers.

Like etcd behind the API server: one global, increasing resourceVersion; every change is an
event kept in a bounded history so a watch can resume from a resourceVersion, and a watch
from a version older than the history gets 410 Gone ("too old resource version").
Everything here runs on the stand-in's event loop thread.

A stored object is never changed in place (events and the history share it): `get` hands
out a copy to edit and `put` back; `peek` and `list` hand out the stored object, to read.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace, name


@dataclass
class Event:
    rv: int
    type: str  # ADDED / MODIFIED / DELETED
    kind: str
    obj: Obj
    old: Obj | None = None


@dataclass
class Watcher:
    kind: str
    namespace: str | None
    matches: Callable[[Obj], bool]
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)


class TooOld(Exception):
    """The requested resourceVersion is older than the retained history."""


class ObjectStore:
    """Objects by (kind, namespace, name) with watch fan-out."""

    def __init__(self, history: int = 5000) -> None:
        self.objects: dict[Key, Obj] = {}
        self.rv = 100
        self.history: deque[Event] = deque(maxlen=history)
        self.compacted_rv = self.rv  # events at or below this are gone
        self.watchers: list[Watcher] = []
        self.listeners: list[Callable[[Event], None]] = []
        # owner uid -> the objects that name it in their ownerReferences (for the GC)
        self.dependents: dict[str, set[Key]] = {}

    def _bump(self) -> int:
        self.rv += 1
        return self.rv

    def _emit(self, event: Event) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        self.history.append(event)
        for watcher in self.watchers:
            self._offer(watcher, event)
        for listener in self.listeners:
            listener(event)

    @staticmethod
    def _offer(watcher: Watcher, event: Event) -> None:
        if watcher.kind != event.kind:
            return
        if watcher.namespace and event.obj["metadata"].get("namespace") != watcher.namespace:
            return
        now = watcher.matches(event.obj) and event.type != "DELETED"
        before = event.old is not None and watcher.matches(event.old)
        if event.type == "DELETED":
            if watcher.matches(event.obj):
                watcher.queue.put_nowait(event)
        elif now and before:
            watcher.queue.put_nowait(event)
        elif now:
            watcher.queue.put_nowait(Event(event.rv, "ADDED", event.kind, event.obj))
        elif before:  # it stopped matching: to this watcher, it is gone
            watcher.queue.put_nowait(Event(event.rv, "DELETED", event.kind, event.obj))

    def compact(self) -> None:
        """Forget the whole event history (what etcd compaction does to old versions)."""
        self.history.clear()
        self.compacted_rv = self.rv

    # -- objects -------------------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """A copy: callers edit it and `put` it back, so the old version stays intact."""
        obj = self.objects.get((kind, namespace, name))
        return clone(obj) if obj is not None else None

    def peek(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The stored object itself: read it, never change it."""
        return self.objects.get((kind, namespace, name))

    def list(self, kind: str, namespace: str | None) -> list[Obj]:
        return [o for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and (namespace is None or ns == namespace)]

    def put(self, kind: str, obj: Obj) -> Obj:
        """Create or replace `obj`, stamping a new resourceVersion; emits ADDED or MODIFIED."""
        meta = obj["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        meta["resourceVersion"] = str(self._bump())
        self.objects[key] = obj
        self._index(key, old, obj)
        self._emit(Event(self.rv, "MODIFIED" if old else "ADDED", kind, obj, old))
        return obj

    def remove(self, kind: str, namespace: str, name: str) -> Obj | None:
        stored = self.objects.pop((kind, namespace, name), None)
        if stored is None:
            return None
        self._index((kind, namespace, name), stored, None)
        obj = {**stored, "metadata": {**stored["metadata"], "resourceVersion": str(self._bump())}}
        self._emit(Event(self.rv, "DELETED", kind, obj))
        return obj

    def _index(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        refs = [(o or {}).get("metadata", {}).get("ownerReferences") for o in (old, new)]
        if refs[0] == refs[1] and old is not None and new is not None:
            return
        for obj, add in ((old, False), (new, True)):
            for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or []:
                deps = self.dependents.setdefault(ref.get("uid", ""), set())
                if add:
                    deps.add(key)
                else:
                    deps.discard(key)
                    if not deps:
                        self.dependents.pop(ref.get("uid", ""), None)

    # -- watch ---------------------------------------------------------------------------------

    def watch(self, kind: str, namespace: str | None, matches: Callable[[Obj], bool],
              resource_version: str | None) -> Watcher:
        """Register a watcher, pre-filled with what it must see first.

        No resourceVersion (or "0"): synthetic ADDED events for the current state. A version:
        the retained events after it, or TooOld when history no longer reaches back that far.
        """
        watcher = Watcher(kind, namespace, matches)
        if not resource_version or resource_version == "0":
            for obj in self.list(kind, namespace):
                if matches(obj):
                    watcher.queue.put_nowait(Event(int(obj["metadata"]["resourceVersion"]),
                                                   "ADDED", kind, obj))
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise TooOld(resource_version) from None
            if since < self.compacted_rv:
                raise TooOld(resource_version)
            for event in self.history:
                if event.rv > since:
                    self._offer(watcher, event)
        self.watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)


def clone(obj: Obj) -> Obj:
    """A deep copy of a JSON object (faster than copy.deepcopy for this kind of data)."""
    return json.loads(json.dumps(obj))  # type: ignore[no-any-return]
