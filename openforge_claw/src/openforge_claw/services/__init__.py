"""Local mock services a claw task needs, started per rollout and torn down after.

`ServiceSpec` is how a task names one: a built-in kind (`mail`, `calendar`, `notes`,
`rest`) with a seed state, or `command` (a program of the task's own). `Services` starts
them all on free loopback ports, tells the agent where they are, snapshots them for the
grader and stops them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from openforge_claw.services.base import MockService
from openforge_claw.services.calendar import CalendarService
from openforge_claw.services.command import CommandService
from openforge_claw.services.mail import MailService
from openforge_claw.services.notes import NotesService
from openforge_claw.services.rest import RestService

BUILTIN: dict[str, type[MockService]] = {
    "mail": MailService, "calendar": CalendarService, "notes": NotesService, "rest": RestService,
}
ServiceKind = Literal["mail", "calendar", "notes", "rest", "command"]


class ServiceSpec(BaseModel):
    """One service of a task. `name` is how the agent and the grader refer to it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: ServiceKind | None = None  # default: the name, when it is a built-in kind
    seed: dict[str, Any] = Field(default_factory=dict)
    command: str | None = None
    health_check: str = "/"
    state_path: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def resolved_kind(self) -> str:
        if self.kind:
            return self.kind
        if self.command:
            return "command"
        if self.name in BUILTIN:
            return self.name
        raise ValueError(f"service {self.name!r}: set `kind` (one of "
                         f"{', '.join([*BUILTIN, 'command'])}) or a `command`")


class RunningService(Protocol):
    name: str

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...


def build_service(spec: ServiceSpec, task_dir: Path | None) -> RunningService:
    kind = spec.resolved_kind
    if kind == "command":
        assert spec.command
        return CommandService(spec.name, spec.command, task_dir or Path.cwd(), spec.env,
                              spec.health_check, spec.state_path)
    service = BUILTIN[kind](spec.seed)
    service.name = spec.name
    return service


class Services:
    """The running services of one rollout."""

    def __init__(self) -> None:
        self.running: list[RunningService] = []

    def start(self, specs: list[ServiceSpec], task_dir: Path | None) -> dict[str, str]:
        """Start every service; on any failure stop those already started. name -> URL."""
        try:
            for spec in specs:
                service = build_service(spec, task_dir)
                service.start()
                self.running.append(service)
        except BaseException:
            self.stop()
            raise
        return self.urls()

    def urls(self) -> dict[str, str]:
        return {s.name: s.url for s in self.running}

    def snapshot(self) -> dict[str, Any]:
        return {s.name: s.snapshot() for s in self.running}

    def stop(self) -> None:
        errors = []
        while self.running:
            service = self.running.pop()
            try:
                service.stop()
            except Exception as exc:  # stop the others anyway
                errors.append(f"{service.name}: {exc}")
        if errors:
            raise RuntimeError("stopping services failed: " + "; ".join(errors))
