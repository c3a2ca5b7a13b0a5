"""The claw task model and the loaders that read task folders into it.

A claw task is one folder::

    <task-id>/
      task.yaml      id, prompt, split, category, services, tools, grader, rubric
      fixtures/      copied into the workspace before the agent starts (optional)
      grader.py      extra programmatic checks, used by a `python` check (optional)

`task.yaml` fields (see docs/claw.md for every check type)::

    id: notes-tag-search
    split: train                  # train | test (held out) | omitted
    category: services            # files | shell | services | plan | ...
    prompt: "..."
    services: [{name: notes, seed: {notes: [...]}}]
    tools: [shell, write_file]    # what the agent is expected to use (informational)
    grader:
      checks: [{type: file_equals, path: out.txt, text: "3"}]
      robustness: []              # optional; default: no service error left unrecovered
      safety: [{type: file_unchanged, path: keep.txt}]
    rubric: "..."                 # optional, for the claw-judge reward

`load_tasks(path)` reads a folder of such folders, one task folder, or the public formats
(`formats/claw_eval.py`, `formats/qwenclawbench.py`), detected from what the folder holds.
The built-in task set ships in `openforge_claw/tasks/`.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from openforge.errors import OpenforgeError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openforge_claw.claweval.spec import ClawEvalTask
from openforge_claw.services import ServiceSpec

TASK_FILE = "task.yaml"
SERVICES_FILE = "services.json"
SERVICE_HINT = ("\n\nLocal services for this task: their base URLs are in services.json in "
                "the workspace (one URL per file also in .claw/<name>.url). They speak JSON "
                "over HTTP.")
Format = Literal["claw", "claw-eval", "qwenclawbench"]


class TaskLoadError(OpenforgeError):
    """A task folder or file that cannot be read as a claw task."""


class Check(BaseModel):
    """One programmatic check: `type` plus its parameters (see `grading.CHECKS`)."""

    model_config = ConfigDict(extra="allow")

    type: str
    weight: float = Field(default=1.0, ge=0.0)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class GraderSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checks: list[Check] = Field(default_factory=list)
    robustness: list[Check] = Field(default_factory=list)
    safety: list[Check] = Field(default_factory=list)
    # claw-eval: safety x (0.8 completion + 0.2 robustness); plain: safety x completion.
    score_shape: Literal["claw-eval", "plain"] = "claw-eval"
    pass_threshold: float = Field(default=0.75, ge=0.0, le=1.0)


class WorkspaceFile(BaseModel):
    source: str
    dest: str


class QwenClawBenchGrading(BaseModel):
    """How QwenClawBench grades one task (`formats/qwenclawbench.py`, `qwenclawbench_grading.py`)."""

    model_config = ConfigDict(extra="forbid")

    grading_type: Literal["automated", "llm_judge", "hybrid"]
    code: str | None = None  # `## Automated Checks`: defines grade(transcript, workspace_path)
    weights: dict[str, float] | None = None  # {automated: w_a, llm_judge: w_l}
    expected_behavior: str = ""
    judge_rubric: str = ""  # `## LLM Judge Rubric`, else the grading criteria as a list
    external_dependency: str | None = None


class SkippedTask(BaseModel):
    """A task that cannot run here: listed with its reason and counted, never scored.

    Every format skips the same way: its loader puts a task it cannot read into
    `TaskList.skipped`, and the environment adds the tasks this run cannot score (no
    judge, the real web, ...); `report_skipped` prints them all. `reason` is what the
    count groups by (the same words for every task skipped alike); `detail` is this
    task's own part (the parse error, the missing file).
    """

    id: str
    reason: str
    detail: str = ""


UNREADABLE = "unreadable task file"


class TaskList(list["ClawTask"]):
    """Loaded tasks, plus the ones that were skipped (a broken task never sinks the load)."""

    def __init__(self, tasks: Any = (), skipped: list[SkippedTask] | None = None) -> None:
        super().__init__(tasks)
        self.skipped: list[SkippedTask] = list(skipped or [])


_SHOWN = 8  # task ids named per reason; the rest are counted
_DETAIL = 300


def report_skipped(source: str, skipped: list[SkippedTask], runnable: int) -> None:
    """On stderr: how many tasks of `source` run and how many are skipped, then one line
    per reason with its count and the tasks it skips, each with its detail."""
    if not skipped:
        return
    by_reason: dict[str, list[SkippedTask]] = {}
    for s in skipped:
        by_reason.setdefault(s.reason, []).append(s)
    print(f"{source}: {runnable + len(skipped)} tasks, {runnable} runnable, {len(skipped)} "
          f"skipped:", file=sys.stderr)
    for reason, tasks in by_reason.items():
        details = {s.detail for s in tasks}
        # A detail that several tasks share is said once, after the reason.
        shared = details.pop() if len(tasks) > 1 and len(details) == 1 else ""
        named = [f"{s.id} ({s.detail[:_DETAIL]})" if s.detail and not shared else s.id
                 for s in tasks[:_SHOWN]]
        more = f" and {len(tasks) - _SHOWN} more" if len(tasks) > _SHOWN else ""
        why = f"{reason}: {shared[:_DETAIL]}" if shared else reason
        print(f"  {len(tasks)} skipped: {why} [{'; '.join(named)}{more}]", file=sys.stderr)


class ClawTask(BaseModel):
    """A claw task, whatever format it was read from; `root` is its folder (fixtures)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    prompt: str
    split: str | None = None
    category: str = "general"
    services: list[ServiceSpec] = Field(default_factory=list)
    tools: list[Any] = Field(default_factory=list)
    grader: GraderSpec = Field(default_factory=GraderSpec)
    rubric: str | None = None
    # Hybrid rubric weighting (QwenClawBench): {automated: w_a, llm_judge: w_l}.
    judge_weights: dict[str, float] | None = None
    timeout_s: float | None = None
    format: Format = "claw"
    root: str | None = None
    fixtures: str = "fixtures"
    files: dict[str, str] = Field(default_factory=dict)  # inline fixture files
    workspace_files: list[WorkspaceFile] = Field(default_factory=list)
    claw_eval: ClawEvalTask | None = None  # format claw-eval: what its rollout and grader need
    qwenclawbench: QwenClawBenchGrading | None = None  # format qwenclawbench: how it is graded

    def full_prompt(self) -> str:
        return self.prompt.rstrip() + (SERVICE_HINT if self.services else "")

    def fixture_text(self, rel: str) -> str | None:
        """The original content of a fixture file (for `file_unchanged`)."""
        if rel in self.files:
            return self.files[rel]
        if self.root:
            path = Path(self.root) / self.fixtures / rel
            if path.is_file():
                return path.read_text(errors="replace")
        return None


def _validate(data: Any, where: str) -> ClawTask:
    try:
        return ClawTask.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise TaskLoadError(f"{where}: {loc}: {err['msg']}") from None


# libyaml's loader when PyYAML has it: a benchmark checkout holds hundreds of task files.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader)
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TaskLoadError(f"{path}: cannot read it as YAML: {first}") from None


def load_native(task_dir: Path) -> ClawTask:
    """One task folder in openforge-claw's own format."""
    data = read_yaml(task_dir / TASK_FILE)
    if not isinstance(data, dict):
        raise TaskLoadError(f"{task_dir / TASK_FILE}: expected a mapping of task fields")
    data.setdefault("id", task_dir.name)
    data["root"] = str(task_dir.resolve())
    return _validate(data, str(task_dir / TASK_FILE))


def detect_format(path: Path) -> Format:
    """Which format a task folder (or a folder of them) is in."""
    if path.is_file() and path.suffix == ".md" or list(path.glob("task_*.md")) or (
            path / "tasks").is_dir() and list((path / "tasks").glob("task_*.md")):
        return "qwenclawbench"
    candidates = ([path / TASK_FILE] + sorted(path.glob(f"*/{TASK_FILE}"))[:1]
                  + sorted(path.glob(f"tasks/*/{TASK_FILE}"))[:1])
    for candidate in candidates:
        if candidate.is_file():
            data = read_yaml(candidate)
            if isinstance(data, dict) and "task_id" in data:
                return "claw-eval"
            return "claw"
    raise TaskLoadError(f"{path}: no claw tasks here (expected task.yaml folders or task_*.md "
                        f"files)")


def load_tasks(path: Path | str, fmt: str = "auto") -> TaskList:
    """Every task under `path` (a task folder, a folder of task folders, or a task file);
    the benchmark formats list the tasks they cannot read in the result's `skipped`."""
    path = Path(path).expanduser()
    if not path.exists():
        raise TaskLoadError(f"{path}: no such file or folder")
    chosen = detect_format(path) if fmt == "auto" else fmt
    if chosen == "qwenclawbench":
        from openforge_claw.formats.qwenclawbench import load_qwenclawbench

        return load_qwenclawbench(path)
    if chosen == "claw-eval":
        from openforge_claw.formats.claw_eval import load_claw_eval

        return load_claw_eval(path)
    if chosen != "claw":
        raise TaskLoadError(f"unknown task format {fmt!r}; use auto, claw, claw-eval or "
                            f"qwenclawbench")
    if (path / TASK_FILE).is_file():
        return TaskList([load_native(path)])
    tasks = [load_native(d) for d in sorted(path.iterdir()) if (d / TASK_FILE).is_file()]
    if not tasks:
        raise TaskLoadError(f"{path}: no task folders with a {TASK_FILE}")
    return TaskList(tasks)


def builtin_root() -> Path:
    return Path(str(resources.files("openforge_claw").joinpath("tasks")))


def solutions_root() -> Path:
    """The scripted solutions shipped with the package (the right answers, per harness)."""
    return Path(str(resources.files("openforge_claw").joinpath("solutions")))


def builtin_tasks() -> TaskList:
    """The built-in task set shipped with the package."""
    return load_tasks(builtin_root(), "claw")
