"""Plugin discovery and lookup by name.

One `pluggy.PluginManager` loads every module declared under the `openforge` entry-point
group (the built-in plugins included), then each `register_<kind>s` hook fills one table
per kind. `lookup("harness", "codex")` returns the registration or raises a one-line error
that lists what is installed.

Nothing one plugin does wrong takes the others down: a plugin module that fails to import
is skipped (`failures`, one line each on stderr), and a name two distributions register is
kept for both, marked as a clash: `openforge plugins` lists it, only using it is an error.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pkgutil import resolve_name
from typing import Any

import pluggy
from pydantic import BaseModel

from openforge import hookspecs
from openforge.errors import OpenforgeError
from openforge.options import OptionsError, check_options, options_model_of

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
class LoadFailure:
    """A plugin module that could not be imported or registers nothing, and why."""

    entry_point: str
    distribution: str
    error: str
    what: str = "failed to import"

    def message(self) -> str:
        return (f"openforge plugin '{self.entry_point}' from distribution '{self.distribution}' "
                f"{self.what} and is skipped ({self.error}); fix it or "
                f"`pip uninstall {self.distribution}`")


@dataclass(frozen=True)
class Registration:
    """One named thing a plugin provides: `factory(**options)` builds it.

    `clashes_with` names the other distributions that registered the same kind and name.
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    distribution: str
    version: str
    description: str
    clashes_with: tuple[str, ...] = field(default=())

    def create(self, **options: Any) -> Any:
        """Build it with `options`; bad options are refused in one line naming the plugin."""
        try:
            return self.factory(**options)
        except OptionsError as exc:
            raise exc.relabel(f"{self.kind} '{self.name}'") from None

    def options_model(self) -> type[BaseModel]:
        """The options model it declares (imports a lazily registered plugin's module)."""
        target = getattr(self.factory, "lazy_target", None)
        return options_model_of(self.factory if target is None else resolve_name(target))


def _first_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


class PluginRegistry:
    """The loaded plugins and everything they registered, by kind and name."""

    def __init__(self, pm: pluggy.PluginManager, dists: dict[str, tuple[str, str]],
                 failures: list[LoadFailure] | None = None):
        self.pm = pm
        self._dists = dists  # plugin name -> (distribution, version)
        self.failures = list(failures or [])
        # kind -> name -> every registration of that name (more than one: a clash)
        self._tables: dict[str, dict[str, list[Registration]]] = {}
        for kind, hook_name in KINDS.items():
            self._tables[kind] = self._collect(kind, hook_name)

    def _collect(self, kind: str, hook_name: str) -> dict[str, list[Registration]]:
        table: dict[str, list[Registration]] = {}
        hook = getattr(self.pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            plugin_name = self.pm.get_name(impl.plugin) or "?"
            dist, version = self._dists.get(plugin_name, (plugin_name, ""))

            def register(name: str, factory: Callable[..., Any], description: str | None = None,
                         _dist: str = dist, _version: str = version) -> None:
                table.setdefault(name, []).append(Registration(
                    kind, name, factory, _dist, _version, description or _first_line(factory)))

            try:
                impl.function(register=register)
            except Exception as exc:  # a broken hook must not take the others down
                self.failures.append(LoadFailure(plugin_name.split(":")[-1], dist,
                                                 f"its {hook_name} hook raised "
                                                 f"{type(exc).__name__}: {exc}"))
        for name, regs in table.items():
            if len(regs) > 1:
                dists = [r.distribution for r in regs]
                table[name] = [dataclasses.replace(r, clashes_with=tuple(
                    d for d in dists if d != r.distribution)) for r in regs]
        return table

    def names(self, kind: str) -> list[str]:
        return sorted(self._tables[kind])

    def registrations(self, kind: str | None = None) -> list[Registration]:
        """Everything registered (both sides of a clash included), by kind then name."""
        kinds = [kind] if kind else list(KINDS)
        return [reg for k in kinds for _, regs in sorted(self._tables[k].items()) for reg in regs]

    def lookup(self, kind: str, name: str) -> Registration:
        regs = self._tables[kind].get(name)
        if not regs:
            installed = ", ".join(sorted(self._tables[kind])) or "none"
            why = "".join(f"; note: plugin '{f.entry_point}' from '{f.distribution}' {f.what} "
                          f"({f.error}) and may be the one that provides it"
                          for f in self.failures)
            raise UnknownPluginError(f"unknown {kind} '{name}'; installed: {installed}{why}")
        if len(regs) > 1:
            both = " and ".join(f"'{r.distribution}'" for r in regs)
            raise PluginConflictError(
                f"{kind} '{name}' is registered by both {both}; uninstall one of them "
                "(`openforge plugins` lists both)")
        return regs[0]

    def create(self, kind: str, name: str, **options: Any) -> Any:
        return self.lookup(kind, name).create(**options)


def load_registry() -> PluginRegistry:
    """Load every installed plugin. A plugin that fails to import or implements no hook is
    skipped and listed in `failures` (`get_registry` prints one line for each)."""
    pm = pluggy.PluginManager("openforge")
    pm.add_hookspecs(hookspecs)
    dists: dict[str, tuple[str, str]] = {}
    failures: list[LoadFailure] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist_name = ep.dist.name if ep.dist else "?"
        dist_version = ep.dist.version if ep.dist else ""
        plugin_name = f"{dist_name}:{ep.name}"
        if pm.has_plugin(plugin_name):
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            first = str(exc).splitlines()[0] if str(exc) else ""
            failures.append(LoadFailure(ep.name, dist_name, f"{type(exc).__name__}: {first}"))
            continue
        pm.register(module, name=plugin_name)
        if not pm.get_hookcallers(module):
            # Most often an entry point naming a package instead of its plugin module, or
            # an install whose metadata predates a move (openforge's own: reinstall it).
            pm.unregister(module)
            failures.append(LoadFailure(ep.name, dist_name, (
                f"{ep.value} implements no openforge hook: point the entry point at the "
                "module with the @hookimpl functions, or reinstall the package if it moved "
                "them"), "registers nothing"))
            continue
        dists[plugin_name] = (dist_name, dist_version)
    return PluginRegistry(pm, dists, failures)


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_registry()
        for failure in _registry.failures:
            print(f"warning: {failure.message()}", file=sys.stderr)
    return _registry


def lookup(kind: str, name: str) -> Registration:
    return get_registry().lookup(kind, name)


def lazy(target: str) -> Callable[..., Any]:
    """A factory that imports `module:attr` on first call and builds it: register heavy
    plugins this way so that `openforge plugins` and unrelated runs never import them."""
    def factory(**options: Any) -> Any:
        return resolve_name(target)(**options)

    factory.__qualname__ = factory.__name__ = target.rsplit(":", 1)[-1]
    factory.lazy_target = target  # type: ignore[attr-defined]
    return factory


def options_model(kind: str, name: str) -> type[BaseModel]:
    """The options model of plugin `name` of `kind` (a registered name, or `module:attr`)."""
    if ":" in name:
        return options_model_of(resolve_name(name))
    return lookup(kind, name).options_model()


def check(kind: str, name: str, options: dict[str, Any]) -> BaseModel:
    """`options` validated against plugin `name`'s options model, without building it."""
    return check_options(options_model(kind, name), options, f"{kind} '{name}'")


def create(kind: str, name: str, **options: Any) -> Any:
    """Build the `kind` plugin registered as `name` with `options`."""
    return get_registry().create(kind, name, **options)
