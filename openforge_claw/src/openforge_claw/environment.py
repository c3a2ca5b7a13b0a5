"""The `claw` environment: claw tasks with fixtures and local mock services per rollout.

Options:

- `path`: a folder of tasks (own format, Claw-Eval or QwenClawBench; detected) instead of
  the built-in set;
- `format`: `auto` (default), `claw`, `claw-eval` or `qwenclawbench`;
- `categories`: only tasks of these categories;
- `judge_base_url`, `judge_model`, `judge_api_key_env`: the LLM judge of the benchmarks'
  judged parts, any OpenAI-compatible endpoint (`judge.py`);
- `grader_timeout_s`: how long a benchmark task's own grader may run;
- `scoring` (QwenClawBench): `benchmark` (default: each task scored as the benchmark
  scores it; tasks that need the judge are skipped, with a count, when there is none) or
  `automated` (every task scored by its automated checks alone).

Benchmark tasks that cannot run (a broken task file, no judge) are listed on stderr with
their reason and skipped; the others run.

`prepare` copies the fixtures into the workspace and starts the task's services on free
loopback ports; the agent finds them in `services.json` (and `.claw/<name>.url`) in the
workspace and in the environment variables `CLAW_<NAME>_URL`, which the harness process
inherits. `final_state` captures the workspace files and every service's state and audit
log; `close` stops the services (they are threads and child processes of the rollout
process, so they also die with it).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from openforge.config import plugin_options
from openforge.environment import Environment
from openforge.errors import OpenforgeError
from openforge.types import Call, RewardResult, Task
from pydantic import BaseModel, ConfigDict, Field

from openforge_claw.formats import qwenclawbench_grading
from openforge_claw.grading import grade
from openforge_claw.services import Services
from openforge_claw.tasks import SERVICES_FILE, ClawTask, builtin_tasks, load_tasks

ENV_NAME = "claw"
HIDDEN = {SERVICES_FILE, ".claw"}  # what prepare adds for the agent: not part of the answer
_MAX_FILES = 200
_MAX_CONTENT = 8192


class ClawOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    format: str = "auto"
    categories: list[str] = Field(default_factory=list)
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key_env: str | None = None
    grader_timeout_s: float = Field(default=600.0, gt=0)
    scoring: Literal["benchmark", "automated"] = "benchmark"


def claw_task(task: Task) -> ClawTask:
    """The claw task a generic `Task` carries in its data."""
    try:
        return ClawTask.model_validate(task.data["claw"])
    except (KeyError, ValueError) as exc:
        raise OpenforgeError(f"task {task.id!r} is not a claw task ({exc})") from None


def to_task(ct: ClawTask) -> Task:
    return Task(id=ct.id, prompt=ct.full_prompt(), environment=ENV_NAME, split=ct.split,
                data={"claw": ct.model_dump(mode="json"), "category": ct.category})


def _copy_tree(src: Path, dest: Path) -> None:
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


class ClawEnvironment(Environment):
    """Claw tasks (files, shell, mock mail/calendar/notes/REST services, plans) with graders."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = plugin_options(ClawOptions, options, "claw environment")
        self.services = Services()
        self.scoring = qwenclawbench_grading.ScoringOptions.of(self.config)

    def claw_tasks(self) -> list[ClawTask]:
        tasks = (load_tasks(self.config.path, self.config.format) if self.config.path
                 else builtin_tasks())
        # QwenClawBench: only what can be scored here; the rest is listed and counted.
        tasks = qwenclawbench_grading.runnable(tasks, self.scoring)
        if self.config.categories:
            tasks = [t for t in tasks if t.category in self.config.categories]
        return tasks

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for ct in self.claw_tasks():
            if split is None or ct.split == split:
                yield to_task(ct)

    def data_paths(self, task: Task) -> list[Path]:
        """The read-only data `prepare` and the graders read: the task's folder, or for a
        QwenClawBench task exactly its asset files. A missing one is an error naming it."""
        ct = claw_task(task)
        root = Path(ct.root) if ct.root else None
        if ct.format != "qwenclawbench":
            if root is not None and not root.is_dir():
                raise OpenforgeError(f"task {ct.id}: its folder {root} is missing")
            return [root] if root is not None else []
        paths = [(root or Path(".")) / wf.source for wf in ct.workspace_files]
        for path in paths:
            if not path.exists():
                raise OpenforgeError(f"task {ct.id}: data file {path} is missing")
        return paths

    def prepare(self, task: Task, workspace: Path) -> None:
        ct = claw_task(task)
        root = Path(ct.root) if ct.root else None
        if root is not None and (root / ct.fixtures).is_dir():
            _copy_tree(root / ct.fixtures, workspace)
        for wf in ct.workspace_files:
            src = (root or Path(".")) / wf.source
            if not src.exists():
                raise OpenforgeError(f"task {ct.id}: data file {src} is missing")
            target = workspace / wf.dest
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                _copy_tree(src, target)
            else:
                shutil.copy2(src, target)
        for rel, text in ct.files.items():
            path = workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if not ct.services:
            return
        urls = self.services.start(ct.services, root)
        (workspace / SERVICES_FILE).write_text(json.dumps(urls, indent=1) + "\n")
        hints = workspace / ".claw"
        hints.mkdir(exist_ok=True)
        for name, url in urls.items():
            (hints / f"{name}.url").write_text(url)
            # The harness process inherits the rollout's environment.
            os.environ[f"CLAW_{name.upper().replace('-', '_')}_URL"] = url

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        files: dict[str, Any] = {}
        for path in sorted(workspace.rglob("*")):
            rel_parts = path.relative_to(workspace).parts
            if len(files) >= _MAX_FILES:
                break
            if not path.is_file() or rel_parts[0] in HIDDEN or "__pycache__" in rel_parts:
                continue
            entry: dict[str, Any] = {"size": path.stat().st_size}
            if entry["size"] <= _MAX_CONTENT:
                try:
                    entry["content"] = path.read_text()
                except UnicodeDecodeError:
                    pass
            files["/".join(rel_parts)] = entry
        return {"files": files, "services": self.services.snapshot()}

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        return self.score(task, workspace, final_state, None)

    def score(self, task: Task, workspace: Path, final_state: dict[str, Any],
              calls: list[Call] | None) -> RewardResult:
        """The task's verdict: a QwenClawBench task's own grader (and judge), else
        openforge-claw's checks."""
        ct = claw_task(task)
        if ct.qwenclawbench is not None:
            return qwenclawbench_grading.score(ct, workspace, final_state, calls, self.scoring)
        return grade(ct, workspace, final_state, calls)

    def close(self) -> None:
        self.services.stop()
