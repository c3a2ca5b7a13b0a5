"""The `tasks` environment: task sets from data files or a `datasets` dataset, no plugin needed.

Each task is a record (a JSONL line, a YAML or JSON list item, a dataset row)::

    id: hello                      # unique; default: <file stem>-<n> (row-<n> for a dataset)
    prompt: Create hello.txt containing exactly "Hello, world!"
    files: {notes.txt: "first\\n"} # the workspace the rollout starts in: path -> text
    split: train                   # optional: train, test, ... (`openforge run --split`)
    check: {files: {hello.txt: "Hello, world!"}}   # how it is scored, one of:
    #   {command: "python -m pytest -q"}     exit status 0 passes (run in the workspace, in a
    #                                        fresh sandbox of the attempt: sandbox.verifier)
    #   {files: {path: expected text}}       each file's text, whitespace-trimmed, must equal
    #   {function: "my_module:grade"}        grade(task, workspace, final_state) -> bool,
    #                                        a score in [0, 1], (score, details) or RewardResult
    ground_truth: "Hello, world!"  # optional; veRL exports carry it (reward_model.ground_truth)
    data: {anything: the check function reads}

Sources (option `path` or `dataset`):

- a `.jsonl`, `.yaml` / `.yml` (a list, or a mapping with a `tasks:` list) or `.json` file;
- a folder: every such file in it, plus each sub-folder holding a `task.yaml` (one task
  whose `workspace/` sub-folder, when present, is copied into the rollout's workspace);
- `dataset`: a Hugging Face `datasets` dataset: a folder written by `save_to_disk`, a
  folder of data files, or the name of a dataset in the local Hugging Face cache; its
  split names become the tasks' splits; `columns` maps the fields above to its columns.

The `checker` reward scores a rollout with the task's check (the option `check` is the
default for tasks without one). Every harness works: the prompt is all a harness is given.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from openforge.environment import Environment
from openforge.errors import OpenforgeError
from openforge.options import PluginOptions, describe_errors
from openforge.sandbox import bounded, verifier
from openforge.types import RewardResult, Task

ENV_NAME = "tasks"
TASK_FILE_SUFFIXES = (".jsonl", ".yaml", ".yml", ".json")
FOLDER_TASK = "task.yaml"
FOLDER_WORKSPACE = "workspace"
_OUTPUT_TAIL = 2000
# Bytes of a checked file read past its expected content's size (whitespace the comparison
# strips); a larger file is read cut, and does not match.
_SLACK = 1 << 20


class TaskSetError(OpenforgeError):
    """A task file, folder or dataset that cannot be read as tasks."""


class Check(BaseModel):
    """How a task is scored: exactly one of `command`, `files`, `function`."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    files: dict[str, str] | None = None
    function: str | None = None
    timeout_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Check:
        given = [k for k in ("command", "files", "function") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a check is exactly one of command, files, function "
                             f"(got {', '.join(given) or 'none'})")
        if self.function is not None and ":" not in self.function:
            raise ValueError(f"function {self.function!r}: write it as module:function")
        return self


class TaskRecord(BaseModel):
    """One task as a file or dataset holds it."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    prompt: str = Field(min_length=1)
    files: dict[str, str] = Field(default_factory=dict)
    split: str | None = None
    check: Check | None = None
    ground_truth: Any = None
    data: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_columns(cls, raw: Any) -> Any:
        """Dataset columns hold nested values as JSON text, or as structs whose keys other
        rows used (None here): read the first, drop the second."""
        if not isinstance(raw, dict):
            return raw
        raw = dict(raw)
        for key in ("files", "check", "data"):
            value = raw.get(key)
            if isinstance(value, str) and value.strip().startswith("{"):
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            if isinstance(value, dict):
                value = {k: v for k, v in value.items() if v is not None}
            raw[key] = value
        return {k: v for k, v in raw.items() if v is not None}


class TasksOptions(PluginOptions):
    """Options of the `tasks` environment (`environment_options`)."""

    path: Path | None = None
    """A task file (.jsonl, .yaml, .yml, .json) or a folder of them."""
    dataset: str | None = None
    """A `datasets` dataset: a save_to_disk folder, a folder of data files, or a cached name."""
    dataset_config: str | None = None
    """The dataset's configuration name, when it has several."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Task field -> dataset column, e.g. {prompt: question, id: uid}."""
    check: Check | None = None
    """The check of tasks that bring none, e.g. {function: my_module:grade}."""

    @model_validator(mode="after")
    def _one_source(self) -> TasksOptions:
        if (self.path is None) == (self.dataset is None):
            raise ValueError("give exactly one of path (a task file or folder) and dataset")
        unknown = set(self.columns) - set(TaskRecord.model_fields)
        if unknown:
            raise ValueError(f"columns: {', '.join(sorted(unknown))} is not a task field "
                             f"({', '.join(TaskRecord.model_fields)})")
        return self


# -- reading -------------------------------------------------------------------------------


def _record(raw: Any, where: str) -> TaskRecord:
    if not isinstance(raw, dict):
        raise TaskSetError(f"{where}: a task must be a mapping with at least a prompt")
    try:
        return TaskRecord.model_validate(raw)
    except ValidationError as exc:
        raise TaskSetError(f"{where}: " + "; ".join(describe_errors(exc, TaskRecord))) from None


def read_task_file(path: Path) -> list[tuple[str, TaskRecord]]:
    """(where, record) for each task of one file, `where` naming its line or position."""
    text = path.read_text()
    out: list[tuple[str, TaskRecord]] = []
    if path.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    raw = json.loads(line)
                except ValueError as exc:
                    raise TaskSetError(f"{path}: line {n}: not valid JSON ({exc})") from None
                out.append((f"{path}: line {n}", _record(raw, f"{path}: line {n}")))
        return out
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TaskSetError(f"{path}: not valid {path.suffix[1:].upper()}: {first}") from None
    if isinstance(data, dict) and "tasks" in data:
        data = data["tasks"]
    if isinstance(data, dict):
        data = [data]  # a file holding one task
    if not isinstance(data, list):
        raise TaskSetError(f"{path}: expected a list of tasks (or a mapping with `tasks:`)")
    for n, raw in enumerate(data, 1):
        out.append((f"{path}: task {n}", _record(raw, f"{path}: task {n}")))
    return out


def _file_tasks(path: Path) -> Iterator[Task]:
    for n, (where, record) in enumerate(read_task_file(path), 1):
        yield _to_task(record, record.id or f"{path.stem}-{n}", where)


def _folder_tasks(folder: Path) -> Iterator[Task]:
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.suffix in TASK_FILE_SUFFIXES:
            yield from _file_tasks(entry)
        elif entry.is_dir() and (entry / FOLDER_TASK).is_file():
            records = read_task_file(entry / FOLDER_TASK)
            if len(records) != 1:
                raise TaskSetError(f"{entry / FOLDER_TASK}: holds {len(records)} tasks; a task "
                                   "folder's task.yaml holds exactly one")
            [(where, record)] = records
            task = _to_task(record, record.id or entry.name, where)
            if (entry / FOLDER_WORKSPACE).is_dir():
                task.data["workspace_dir"] = str((entry / FOLDER_WORKSPACE).resolve())
            yield task


def _load_dataset(name: str, config: str | None) -> Any:
    """A DatasetDict (or Dataset) from a save_to_disk folder, a data folder, or a cached name."""
    import datasets

    folder = Path(name).expanduser()
    try:
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
            return datasets.load_from_disk(str(folder))
        return datasets.load_dataset(str(folder) if folder.exists() else name, name=config)
    except Exception as exc:  # datasets raises many types for "not found" / "cannot read"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TaskSetError(f"dataset {name!r} cannot be loaded: {type(exc).__name__}: "
                           f"{first}") from None


def _dataset_tasks(options: TasksOptions) -> Iterator[Task]:
    assert options.dataset is not None
    loaded = _load_dataset(options.dataset, options.dataset_config)
    splits = loaded.items() if hasattr(loaded, "items") else [(None, loaded)]
    rename = {column: field for field, column in options.columns.items()}
    for split_name, rows in splits:
        for n, row in enumerate(rows):
            raw = {rename.get(k, k): v for k, v in row.items()}
            # Columns that are not task fields travel as data, for the check to read.
            extra = {k: raw.pop(k) for k in list(raw) if k not in TaskRecord.model_fields}
            raw.setdefault("split", split_name)
            raw["data"] = {**extra, **(raw.get("data") or {})}
            where = f"dataset {options.dataset}: {split_name or 'rows'} row {n}"
            record = _record(raw, where)
            yield _to_task(record, record.id or f"{split_name or 'row'}-{n}", where)


def _to_task(record: TaskRecord, task_id: str, where: str) -> Task:
    data: dict[str, Any] = dict(record.data)
    data.update(files=record.files, where=where)
    if record.check is not None:
        data["check"] = record.check.model_dump(exclude_defaults=True)
    if record.ground_truth is not None:
        data["ground_truth"] = record.ground_truth
    return Task(id=str(task_id), prompt=record.prompt, environment=ENV_NAME, split=record.split,
                data=data)


# -- checking ------------------------------------------------------------------------------


def _inside(workspace: Path, rel: str) -> Path:
    root = workspace.resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise TaskSetError(f"file {rel!r} is outside the workspace")
    return target


def check_command(check: Check, workspace: Path) -> RewardResult:
    assert check.command is not None
    # The command runs what the agent left in its workspace: in a rollout it runs in a fresh
    # sandbox of the attempt (openforge.sandbox.verifier), never on the trusted side.
    proc = verifier.run(["/bin/sh", "-c", check.command], cwd=workspace,
                        timeout_s=check.timeout_s)
    if proc.timed_out or proc.returncode is None:
        return RewardResult(score=0.0, passed=False, details={
            "check": "command", "command": check.command,
            "reason": f"the check command ran past {check.timeout_s:g}s"})
    passed = proc.returncode == 0
    output = (proc.stdout + proc.stderr)[-_OUTPUT_TAIL:]
    return RewardResult(score=float(passed), passed=passed, details={
        "check": "command", "command": check.command, "exit_code": proc.returncode,
        "output": output})


def check_files(check: Check, workspace: Path) -> RewardResult:
    assert check.files is not None
    results: dict[str, str] = {}
    for rel, expected in check.files.items():
        path = _inside(workspace, rel)
        if not path.is_file():
            results[rel] = "missing"
        # Read no more than could match (a larger file is cut, with a line saying so).
        elif (got := bounded.read_text(path, len(expected.encode()) + _SLACK)).strip() \
                == expected.strip():
            results[rel] = "ok"
        else:
            results[rel] = "different: " + got[:200]
    good = sum(1 for r in results.values() if r == "ok")
    score = good / len(results) if results else 1.0
    return RewardResult(score=score, passed=good == len(results),
                        details={"check": "files", "files": results})


def check_function(check: Check, task: Task, workspace: Path,
                   final_state: dict[str, Any]) -> RewardResult:
    assert check.function is not None
    function = resolve_name(check.function)
    verdict = function(task, workspace, final_state)
    details: dict[str, Any] = {"check": "function", "function": check.function}
    if isinstance(verdict, RewardResult):
        return verdict
    if isinstance(verdict, tuple):
        verdict, more = verdict
        details.update(more or {})
    if isinstance(verdict, bool):
        return RewardResult(score=float(verdict), passed=verdict, details=details)
    if isinstance(verdict, int | float):
        score = min(max(float(verdict), 0.0), 1.0)
        return RewardResult(score=score, passed=score >= 1.0, details=details)
    raise TypeError(f"check function {check.function} returned {type(verdict).__name__}; "
                    "return a bool, a score in [0, 1], (score, details) or a RewardResult")


class TasksEnvironment(Environment):
    """Task sets from JSONL / YAML / JSON files, a folder, or a `datasets` dataset; checks by
    command, file comparison or Python function."""

    options_model = TasksOptions
    options: TasksOptions

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        opts = self.options
        if opts.dataset is not None:
            found = list(_dataset_tasks(opts))
        else:
            assert opts.path is not None
            path = opts.path.expanduser()
            if path.is_dir():
                found = list(_folder_tasks(path))
            elif path.is_file():
                found = list(_file_tasks(path))
            else:
                raise TaskSetError(f"{path}: no such task file or folder")
        seen: dict[str, str] = {}
        for task in found:
            if task.id in seen:
                raise TaskSetError(f"task id {task.id!r} is used twice ({seen[task.id]} and "
                                   f"{task.data['where']}); give each task its own id")
            seen[task.id] = task.data["where"]
        return [t for t in found if split is None or t.split == split]

    def prepare(self, task: Task, workspace: Path) -> None:
        folder = task.data.get("workspace_dir")
        if folder:
            shutil.copytree(folder, workspace, dirs_exist_ok=True)
        for rel, text in (task.data.get("files") or {}).items():
            target = _inside(workspace, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult | None:
        raw = task.data.get("check")
        check = Check.model_validate(raw) if raw else self.options.check
        if check is None:
            return None
        if check.command is not None:
            return check_command(check, workspace)
        if check.files is not None:
            return check_files(check, workspace)
        return check_function(check, task, workspace, final_state)
