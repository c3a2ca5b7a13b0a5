"""Live-web task sets: the WebVoyager and Online-Mind2Web loaders, the browser environment.

Both need the open web, so they are run where a rollout may reach it; their tasks have no
programmatic checker and are scored by a judge (`webjudge`). The loaders read the files
the benchmarks publish:

- WebVoyager `data/WebVoyager_data.jsonl`: one `{"web_name", "id", "ques", "web"}` a line.
- Online-Mind2Web: a JSON list (or JSONL) of `{"task_id", "website", "confirmed_task",
  "reference_length", ...}`.

This package registers `webvoyager`; the `online-mind2web` environment is the
openforge-mind2web plugin's, built on `load_online_mind2web` and `WebTaskEnvironment`.

Environment options: `path` (the task file, required), `width` x `height` (default
1024 x 768, as WebVoyager), `max_steps` (default 15), `chromium`. The final state holds the
episode (every action, the screenshot after each step) plus the task text and final page,
which is what the judge reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openforge.errors import OpenforgeError
from openforge.types import Task
from openforge_gui.browser import BrowserComputer
from openforge_gui.computer import ComputerEnvironment, ComputerOptions


class TaskFileError(OpenforgeError):
    """A task file that cannot be read as the benchmark publishes it."""


class WebTaskRecord(BaseModel):
    """One task as a benchmark publishes it; keys a benchmark adds (`level`, ...) are kept."""

    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)

    def to_task(self, environment: str) -> Task:
        raise NotImplementedError


class WebVoyagerRecord(WebTaskRecord):
    web_name: str | None = None
    id: str = Field(min_length=1)
    ques: str = Field(min_length=1)
    web: str = Field(min_length=1)

    def to_task(self, environment: str) -> Task:
        return Task(id=self.id, environment=environment,
                    prompt=f"{self.ques}\nStart at {self.web}. When you have the answer, "
                           "reply with answer(\"...\").",
                    data={"start_url": self.web, "site": self.web_name, "task_text": self.ques,
                          "source": "webvoyager"})


class OnlineMind2WebRecord(WebTaskRecord):
    task_id: str = Field(min_length=1)
    website: str = Field(min_length=1)
    confirmed_task: str = Field(min_length=1)
    reference_length: int | None = None

    def to_task(self, environment: str) -> Task:
        return Task(id=self.task_id, environment=environment,
                    prompt=f"{self.confirmed_task}\nStart at {self.website}. When the task is "
                           "done, reply with answer(\"done\") or the answer asked for.",
                    data={"start_url": self.website, "task_text": self.confirmed_task,
                          "reference_length": self.reference_length,
                          "level": (self.model_extra or {}).get("level"),
                          "source": "online-mind2web"})


def _records(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read the task file ({exc.strerror or exc})") from None
    try:
        if text.lstrip().startswith("["):
            data = json.loads(text)
        else:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{path}: not JSON or JSONL ({exc.msg} at line {exc.lineno})") from None
    return data if isinstance(data, list) else [data]


def load_records(path: Path, record: type[WebTaskRecord], environment: str) -> list[Task]:
    """Every task of a JSON list or JSONL file, each validated as `record`."""
    tasks = []
    for n, row in enumerate(_records(path)):
        try:
            tasks.append(record.model_validate(row).to_task(environment))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(the task)"
            raise TaskFileError(f"{path}: task {n + 1}: {where}: {err['msg']}") from None
    return tasks


def load_webvoyager(path: Path, environment: str = "webvoyager") -> list[Task]:
    return load_records(path, WebVoyagerRecord, environment)


def load_online_mind2web(path: Path, environment: str = "online-mind2web") -> list[Task]:
    return load_records(path, OnlineMind2WebRecord, environment)


class WebTaskOptions(ComputerOptions):
    """Options of the live-web environments."""

    max_steps: int = Field(default=15, ge=1)
    """Actions per episode at most."""
    path: Path | None = None
    """The task file (required)."""
    width: int = Field(default=1024, ge=1)
    """Browser viewport width."""
    height: int = Field(default=768, ge=1)
    """Browser viewport height."""
    chromium: str | None = None
    """The Chromium binary (default: found on PATH)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """URLs whose origins the browser may reach although they are not public addresses (the
    start page's own origin always is): an intranet deployment's other sites."""


class WebTaskEnvironment(ComputerEnvironment):
    """Base of the live-web task sets: a fresh browser per rollout at the task's start URL."""

    name = "web"
    options_model: ClassVar[type[WebTaskOptions]] = WebTaskOptions
    options: WebTaskOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if not self.options.path:
            raise OpenforgeError(f"the {self.name} environment needs its task file: "
                                 f"--set environment_options.path=FILE")
        self.path = self.options.path.expanduser()
        self.width = self.options.width
        self.height = self.options.height

    def load(self) -> list[Task]:
        raise NotImplementedError

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        return self.load()

    def start_url(self, task: Task) -> str:
        """Where the rollout's browser starts (a subclass may map it elsewhere)."""
        return str(task.data["start_url"])

    def open_computer(self, task: Task, workspace: Path) -> BrowserComputer:
        computer = BrowserComputer(self.width, self.height, chromium=self.options.chromium,
                                   allowed_hosts=self.options.allowed_hosts)
        try:
            computer.open(self.start_url(task))
        except Exception:
            computer.close()
            raise
        return computer

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        state = super().final_state(task, workspace)
        state["task_text"] = task.data.get("task_text", task.prompt)
        if self.episode is not None:
            computer = self.episode.computer
            state["final_url"], state["final_title"] = self.read_screen(
                state, computer.location, (None, None))
            if isinstance(computer, BrowserComputer) and computer.egress.refused_count:
                state["egress_refused"] = {"count": computer.egress.refused_count,
                                           "first": list(computer.egress.refused)}
        return state


class WebVoyagerEnvironment(WebTaskEnvironment):
    """WebVoyager tasks ({web_name,id,ques,web} JSONL) on the live web in headless Chromium."""

    name = "webvoyager"

    def load(self) -> list[Task]:
        return load_webvoyager(self.path, self.name)
