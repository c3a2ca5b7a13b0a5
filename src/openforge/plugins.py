"""Plugin discovery and lookup by name.

One `pluggy.PluginManager` loads every module declared under the `openforge` entry-point
group (the built-in plugins included), then each `register_<kind>s` hook fills one table
per kind. `lookup("harness", "codex")` returns the registration or raises a one-line error
that lists what is installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from openforge import hookspecs
from openforge.errors import OpenforgeError

ENTRY_POINT_GROUP = "openforge"

# kind -> the hook that registers it
KINDS: dict[str, str] = {
    "harness": "register_harnesses",
    "environment": "register_environments",
    "reward": "register_rewards",
    "executor": "register_executors",
    "engine": "register_engines",
    "trainer": "register_trainers",
    "recipe": "register_recipes",
}


class UnknownPluginError(OpenforgeError):
    """A name that no installed plugin registered."""


class PluginConflictError(OpenforgeError):
    """Two plugins registered the same name for the same kind."""


@dataclass(frozen=True)
class Registration:
    """One named thing a plugin provides: `factory(**options)` builds it."""

    kind: str
    name: str
    factory: Callable[..., Any]
    distribution: str
    version: str
    description: str

    def create(self, **options: Any) -> Any:
        return self.factory(**options)


def _first_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


class PluginRegistry:
    """The loaded plugins and everything they registered, by kind and name."""

    def __init__(self, pm: pluggy.PluginManager, dists: dict[str, tuple[str, str]]):
        self.pm = pm
        self._dists = dists  # plugin name -> (distribution, version)
        self._tables: dict[str, dict[str, Registration]] = {}
        for kind, hook_name in KINDS.items():
            self._tables[kind] = self._collect(kind, hook_name)

    def _collect(self, kind: str, hook_name: str) -> dict[str, Registration]:
        table: dict[str, Registration] = {}
        hook = getattr(self.pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            plugin_name = self.pm.get_name(impl.plugin) or "?"
            dist, version = self._dists.get(plugin_name, (plugin_name, ""))

            def register(name: str, factory: Callable[..., Any], description: str | None = None,
                         _dist: str = dist, _version: str = version) -> None:
                if name in table:
                    other = table[name].distribution
                    raise PluginConflictError(
                        f"{kind} '{name}' is registered by both '{other}' and '{_dist}'; "
                        f"uninstall one of them"
                    )
                table[name] = Registration(kind, name, factory, _dist, _version,
                                           description or _first_line(factory))

            impl.function(register=register)
        return table

    def names(self, kind: str) -> list[str]:
        return sorted(self._tables[kind])

    def registrations(self, kind: str | None = None) -> list[Registration]:
        kinds = [kind] if kind else list(KINDS)
        return [reg for k in kinds for _, reg in sorted(self._tables[k].items())]

    def lookup(self, kind: str, name: str) -> Registration:
        table = self._tables[kind]
        if name not in table:
            installed = ", ".join(sorted(table)) or "none"
            raise UnknownPluginError(f"unknown {kind} '{name}'; installed: {installed}")
        return table[name]

    def create(self, kind: str, name: str, **options: Any) -> Any:
        return self.lookup(kind, name).create(**options)


def load_registry() -> PluginRegistry:
    """Load every installed plugin. A plugin that fails to import is skipped with a warning."""
    pm = pluggy.PluginManager("openforge")
    pm.add_hookspecs(hookspecs)
    dists: dict[str, tuple[str, str]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist_name = ep.dist.name if ep.dist else "?"
        dist_version = ep.dist.version if ep.dist else ""
        plugin_name = f"{dist_name}:{ep.name}"
        if pm.has_plugin(plugin_name):
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            warnings.warn(
                f"openforge plugin '{ep.name}' from distribution '{dist_name}' failed to "
                f"import and was skipped: {type(exc).__name__}: {exc}",
                stacklevel=2,
            )
            continue
        pm.register(module, name=plugin_name)
        dists[plugin_name] = (dist_name, dist_version)
    return PluginRegistry(pm, dists)


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_registry()
    return _registry


def lookup(kind: str, name: str) -> Registration:
    return get_registry().lookup(kind, name)


def lazy(target: str) -> Callable[..., Any]:
    """A factory that imports `module:attr` on first call and builds it: register heavy
    plugins this way so that `openforge plugins` and unrelated runs never import them."""
    module_name, attr = target.split(":")

    def factory(**options: Any) -> Any:
        return getattr(importlib.import_module(module_name), attr)(**options)

    factory.__qualname__ = factory.__name__ = attr
    return factory


def create(kind: str, name: str, **options: Any) -> Any:
    """Build the `kind` plugin registered as `name` with `options`."""
    return get_registry().create(kind, name, **options)
