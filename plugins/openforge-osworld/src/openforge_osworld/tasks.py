"""OSWorld task files: the JSON format and the folder layout they come in.

One task is one JSON file (`evaluation_examples/examples/<domain>/<id>.json` in OSWorld):

    {"id", "snapshot", "instruction", "source", "config": [setup steps],
     "related_apps": [...], "evaluator": {"func", "result", "expected", "postconfig", ...}}

A task set is a folder of such files, searched recursively, optionally with an index in
OSWorld's `test_all.json` shape: `{"<domain>": ["<id>", ...], ...}`, where the task `<id>`
lives at `<domain>/<id>.json` under the examples folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class TaskFileError(ValueError):
    """A task file or index that cannot be used; the message names the file and the fault."""


class Evaluator(BaseModel):
    """How DesktopEnv scores a task: metric name(s), getters, postconfig. Kept as given."""

    model_config = ConfigDict(extra="allow")

    func: str | list[str]
    result: dict[str, Any] | list[dict[str, Any]] | None = None
    expected: dict[str, Any] | list[dict[str, Any] | None] | None = None
    postconfig: list[dict[str, Any]] = Field(default_factory=list)
    conj: str | None = None


class OSWorldTask(BaseModel):
    """One OSWorld task file. Unknown keys (`trajectory`, `proxy`, ...) are kept."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    snapshot: str = ""
    source: str = ""
    config: list[dict[str, Any]] = Field(default_factory=list)
    related_apps: list[str] = Field(default_factory=list)
    evaluator: Evaluator

    @property
    def infeasible(self) -> bool:
        return self.evaluator.func == "infeasible"


def load_task(path: Path) -> OSWorldTask:
    try:
        return OSWorldTask.model_validate(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskFileError(f"{path}: cannot read the task: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise TaskFileError(f"{path}: not an OSWorld task: {where}: {err['msg']}") from None


def _index(path: Path) -> dict[str, list[str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskFileError(f"{path}: cannot read the index: {exc}") from None
    if not isinstance(data, dict) or not all(
            isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in data.values()):
        raise TaskFileError(f"{path}: an index maps each domain to a list of task ids")
    return data


def iter_tasks(examples: Path, index: Path | None = None,
               domains: list[str] | None = None) -> Iterator[tuple[str, OSWorldTask]]:
    """(domain, task) pairs from a folder of task files, in index order when one is given.

    Without an index, every `*.json` under `examples` is a task and its domain is the name
    of the folder it sits in.
    """
    if not examples.is_dir():
        raise TaskFileError(f"{examples}: no such folder of OSWorld task files")
    if index is not None:
        for domain, ids in _index(index).items():
            if domains and domain not in domains:
                continue
            for task_id in ids:
                path = examples / domain / f"{task_id}.json"
                if not path.is_file():
                    raise TaskFileError(f"{index}: lists {domain}/{task_id}, but {path} "
                                        "does not exist")
                yield domain, load_task(path)
        return
    for path in sorted(examples.rglob("*.json")):
        domain = path.parent.name if path.parent != examples else ""
        if domains and domain not in domains:
            continue
        yield domain, load_task(path)
