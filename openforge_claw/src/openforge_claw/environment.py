"""The `claw` environment: claw tasks with fixtures and local mock services per rollout.

Options:

- `path`: a folder of tasks (own format, Claw-Eval or QwenClawBench; detected) instead of
  the built-in set;
- `format`: `auto` (default), `claw`, `claw-eval` or `qwenclawbench`;
- `categories`: only tasks of these categories;
- `judge_base_url`, `judge_model`, `judge_api_key_env` (the variable that holds its key):
  the LLM judge of the benchmarks' judged parts, any OpenAI-compatible endpoint
  (`judge.JudgeEndpoint`; a Claw-Eval grader asks it through Claw-Eval's own `LLMJudge`);
  without one, the tasks that need it are skipped;
- `grader_timeout_s`: how long a benchmark task's own grader may run;
- `scoring` (QwenClawBench): `benchmark` (default: each task scored as the benchmark
  scores it) or `automated` (every task scored by its automated checks alone);
- `agent_code_in_grader` (QwenClawBench): `skip` (default: a task whose grader runs the
  agent's code in its own process, where that code could write any score, is skipped) or
  `score` (scored as the benchmark does, labelled in the reward's details);
- Claw-Eval only: `python` (the interpreter of its services and graders, default this
  one), `service_env` (extra variables for its services, e.g. `{ERROR_RATE: "0.25"}`:
  Claw-Eval's own injection of 429/500 answers and slow responses, for robustness runs).

Benchmark tasks that cannot run here (an unreadable task file, no judge, the real web, ...)
are listed on stderr with their reason and a count (`tasks.report_skipped`) and skipped;
the others run.

`prepare` copies the fixtures into the workspace and starts the task's services on free
loopback ports; the agent finds them in `services.json` (and `.claw/<name>.url`) in the
workspace (the harness's environment is an allowlist: docs/sandboxing.md). These run in the
trusted rollout supervisor, outside the agent's sandbox, which reaches them over loopback
in every sandbox mode. `final_state` captures the workspace files and every service's
state and audit log; `close` stops the services (they are threads and child processes of
the supervisor, so they also die with it).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from openforge.environment import Environment
from openforge.errors import OpenforgeError
from openforge.harness import McpServer
from openforge.options import PluginOptions
from openforge.types import Call, RewardResult, Task
from pydantic import Field, ValidationError

from openforge_claw.claweval.grading import grade as grade_claw_eval
from openforge_claw.claweval.rollout import ClawEvalRollout
from openforge_claw.claweval.rollout import mcp_servers as claw_eval_mcp_servers
from openforge_claw.formats import claw_eval, qwenclawbench_grading
from openforge_claw.grading import grade
from openforge_claw.judge import JudgeEndpoint
from openforge_claw.services import Services
from openforge_claw.tasks import (
    SERVICES_FILE,
    ClawTask,
    SkippedTask,
    builtin_root,
    builtin_tasks,
    load_tasks,
    report_skipped,
    solutions_root,
)

ENV_NAME = "claw"
HIDDEN = {SERVICES_FILE, ".claw"}  # what prepare adds for the agent: not part of the answer
_MAX_FILES = 200
_MAX_CONTENT = 8192


class ClawOptions(PluginOptions):
    """Options of the `claw` environment."""

    path: str | None = None
    """A task set to load instead of the built-in tasks (docs/claw.md)."""
    format: str = "auto"
    """The task set's format: auto, claw, claw-eval or qwenclawbench."""
    categories: list[str] = Field(default_factory=list)
    """Only tasks of these categories (empty: all)."""
    judge_base_url: str | None = None
    """The rubric judge's OpenAI-compatible endpoint (with judge_model)."""
    judge_model: str | None = None
    """The judge's model name."""
    judge_api_key_env: str | None = None
    """The environment variable holding the judge's API key."""
    grader_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds a benchmark's own grader may run for one rollout."""
    scoring: Literal["benchmark", "automated"] = "benchmark"
    """QwenClawBench: `benchmark` (its own automated + judged mix) or `automated` only."""
    agent_code_in_grader: Literal["skip", "score"] = "skip"
    """QwenClawBench: `skip` a task whose grader runs the agent's code in its own process
    (that code could write any score), or `score` it as the benchmark does."""
    python: str = Field(default_factory=lambda: sys.executable)
    """Claw-Eval checkouts only: the Python that runs its services and graders."""
    service_env: dict[str, str] = Field(default_factory=dict)
    """Claw-Eval checkouts only: extra environment for the task's services."""

    def judge(self) -> JudgeEndpoint | None:
        """The judge endpoint, when one is set (both `judge_base_url` and `judge_model`)."""
        if not (self.judge_base_url or self.judge_model):
            return None
        if not (self.judge_base_url and self.judge_model):
            raise OpenforgeError("claw environment: set both judge_base_url and judge_model "
                                 "(the judge's OpenAI-compatible endpoint)")
        try:
            return JudgeEndpoint(base_url=self.judge_base_url, model=self.judge_model,
                                 api_key_env=self.judge_api_key_env)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise OpenforgeError(f"claw environment: judge_base_url {why}") from None


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

    options_model = ClawOptions
    options: ClawOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.services = Services()
        self.judge = self.options.judge()
        self.scoring = qwenclawbench_grading.ScoringOptions(
            judge=self.judge, scoring=self.options.scoring,
            grader_timeout_s=self.options.grader_timeout_s,
            agent_code_in_grader=self.options.agent_code_in_grader)
        self.claw_eval: ClawEvalRollout | None = None

    def claw_tasks(self) -> list[ClawTask]:
        """The tasks that run here. The others (unreadable, or needing what this run does
        not have) are listed on stderr with their reasons and counted, never scored."""
        loaded = (load_tasks(self.options.path, self.options.format) if self.options.path
                  else builtin_tasks())
        skipped = list(loaded.skipped)
        tasks: list[ClawTask] = []
        for task in loaded:
            if self.options.categories and task.category not in self.options.categories:
                continue
            why = self.skipped(task)
            if why is None:
                tasks.append(task)
            else:
                skipped.append(why)
        report_skipped(loaded[0].format if loaded else "claw", skipped, len(tasks))
        return tasks

    def skipped(self, task: ClawTask) -> SkippedTask | None:
        """`task` as skipped when this run cannot score it, else None."""
        if task.claw_eval is not None:
            return claw_eval.skipped(task, judged=self.judge is not None)
        why = qwenclawbench_grading.unscorable(task, self.scoring)
        return SkippedTask(id=task.id, reason=why) if why else None

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for ct in self.claw_tasks():
            if split is None or ct.split == split:
                yield to_task(ct)

    def prepare(self, task: Task, workspace: Path) -> None:
        ct = claw_task(task)
        if ct.claw_eval is not None:
            self.claw_eval = ClawEvalRollout(ct.claw_eval, self.options.python,
                                             self.options.service_env)
            self.claw_eval.prepare(workspace)
            return
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

    def mcp_servers(self, task: Task, workspace: Path) -> list[McpServer]:
        ct = claw_task(task)
        return claw_eval_mcp_servers(ct.claw_eval, workspace, self.options.python) \
            if ct.claw_eval else []

    def data_paths(self, task: Task) -> list[Path]:
        """The read-only data the agent may see outside the workspace: exactly what `prepare`
        copies into it (the task's `fixtures/` and its listed data files); a missing one is
        an error naming it.

        Never the task's folder itself: its `task.yaml` holds the grader's expected answers
        and a `grader.py` its code, and the graders read them on the trusted side. For a
        QwenClawBench task that leaves out the rest of `assets/<id>/`, which may hold answer
        keys and data generators. (The built-in tasks ship inside this package, whose task
        folders no sandbox shows at all: `hidden_paths`.)

        None for a Claw-Eval task: its reward reads the checkout (the grader, its grader-only
        files such as verify scripts with the answers, `claw_eval` itself), and showing the
        agent those files would show it the answers. The grader runs on the trusted side,
        where the checkout is; the agent gets its own files as copies in the workspace.
        """
        ct = claw_task(task)
        if ct.claw_eval is not None:
            return []
        root = Path(ct.root) if ct.root else None
        if ct.format != "qwenclawbench" and root is not None and not root.is_dir():
            raise OpenforgeError(f"task {ct.id}: its folder {root} is missing")
        fixtures = [root / ct.fixtures] if root is not None and (root / ct.fixtures).is_dir() \
            else []
        listed = [(root or Path(".")) / wf.source for wf in ct.workspace_files]
        for path in listed:
            if not path.exists():
                raise OpenforgeError(f"task {ct.id}: data file {path} is missing")
        return [*fixtures, *listed]

    def hidden_paths(self, task: Task) -> list[Path]:
        """The built-in tasks' folders (their graders' expected answers) and the scripted
        solutions: they ship inside this package, which the sandbox maps with the Python
        paths, so its view empties them whatever the task."""
        return [builtin_root(), solutions_root()]

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
        if self.claw_eval is not None:
            return {"files": files, "claw_eval": self.claw_eval.final_state(workspace)}
        return {"files": files, "services": self.services.snapshot()}

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        return self.score(task, workspace, final_state, None)

    def score(self, task: Task, workspace: Path, final_state: dict[str, Any],
              calls: list[Call] | None) -> RewardResult:
        """The task's verdict, the single entry of `claw-grader`: a benchmark task's own
        grader (Claw-Eval's `grader.py`; QwenClawBench's automated checks and judge), else
        openforge-claw's checks."""
        ct = claw_task(task)
        if ct.claw_eval is not None:
            return grade_claw_eval(ct.claw_eval, ct.prompt, final_state, calls,
                                   category_name=ct.category, judge=self.judge,
                                   python=self.options.python,
                                   timeout_s=self.options.grader_timeout_s)
        if ct.qwenclawbench is not None:
            return qwenclawbench_grading.score(ct, workspace, final_state, calls, self.scoring)
        return grade(ct, workspace, final_state, calls)

    def close(self) -> None:
        if self.claw_eval is not None:
            self.claw_eval.close()
            self.claw_eval = None
        self.services.stop()
