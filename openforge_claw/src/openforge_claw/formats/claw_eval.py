"""Claw-Eval tasks, read from a checkout of github.com/claw-eval/claw-eval, unchanged.

`environment_options.path` may be the checkout's root, its `tasks/` folder or one task's
folder. Each `tasks/<id>/task.yaml` becomes a claw task of format `claw-eval` whose
`claw_eval` field (`claweval.spec.ClawEvalTask`) holds what a rollout needs: its tools and
their endpoints, its services, the files the agent starts with and the ones its grader
reads afterwards. Scoring is the task's own `grader.py` (`claweval.grading`), never the
`scoring_components` of `task.yaml` (Claw-Eval does not run those either).

What changes on the way, and why:

- the prompt's `/workspace/<path>` (Claw-Eval's container) becomes `<path>`, relative to
  the rollout's own workspace (each rollout has one; they run side by side);
- a short note listing the task's tools and how to call them is appended to the prompt
  (Claw-Eval's runner puts the same list in its system prompt, which a harness owns);
- a task that cannot run here is loaded with its `needs` (real web, simulated user, LLM
  judge, missing fixture files) and skipped by the environment with a count, never
  scored; one whose `task.yaml` cannot be read is listed in the loader's `skipped`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openforge_claw.claweval import SKIP_REASONS, blocking_need, checkout
from openforge_claw.claweval.spec import (
    CONTAINER_WORKSPACE,
    ClawEvalTask,
    Need,
    ServiceDef,
    ToolEndpoint,
    ToolSpec,
)
from openforge_claw.tasks import (
    TASK_FILE,
    UNREADABLE,
    ClawTask,
    SkippedTask,
    TaskList,
    TaskLoadError,
    read_yaml,
)

# Services that reach the live web (web search through a SERP API key, page fetches).
REAL_WEB_SERVICES = re.compile(r"mock_services/web_real")
_PATH_VARIABLE = re.compile(r"(_FIXTURES|_DIR)$")
_WORKSPACE_PATH = re.compile(re.escape(CONTAINER_WORKSPACE) + r"/")
TOOL_CLI = "claw-tool"
MCP_SERVER = "claw-eval"


def container_paths_relative(text: str) -> str:
    """`/workspace/x` (Claw-Eval's container) -> `x`, relative to the agent's workspace."""
    return _WORKSPACE_PATH.sub("", text)


def tool_note(tools: list[ToolSpec]) -> str:
    """The note appended to a prompt that has tools: what they are and how to call them."""
    if not tools:
        return ""
    lines = "\n".join(f"- {t.name}: {' '.join(t.description.split())}" for t in tools)
    return (f"\n\nTools for this task:\n{lines}\nIf you take MCP tools, they are offered as "
            f"tools of the MCP server `{MCP_SERVER}`; from a shell, call one with "
            f"`{TOOL_CLI} NAME '<JSON arguments>'` (`{TOOL_CLI} list` prints their JSON schemas).")


def _needs(data: dict[str, Any], spec: ClawEvalTask, root: Path, task_dir: Path) -> list[Need]:
    needs: list[Need] = []
    missing = [rel for rel in [*spec.sandbox_files, *spec.attachments, *spec.sandbox_grader_files]
               if checkout.resolve_task_file(root, task_dir, rel) is None]
    missing += [rel for rel in spec.local_grader_files if not (task_dir / rel).exists()]
    for service in spec.services:
        missing += [value for key, value in service.env.items() if _PATH_VARIABLE.search(key)
                    and not checkout.resolve_service_path(root, value).exists()]
    if missing:
        needs.append(Need(kind="fixture", detail=", ".join(dict.fromkeys(missing))))
    web = [s.name for s in spec.services if REAL_WEB_SERVICES.search(s.command)]
    if web:
        needs.append(Need(kind="real_web", detail=f"services {', '.join(web)} search and fetch "
                                                  f"the live web (SERP_DEV_KEY)"))
    if (data.get("user_agent") or {}).get("enabled"):
        needs.append(Need(kind="simulated_user", detail="user_agent: a model plays the user "
                                                        "over several turns"))
    if checkout.grader_uses_judge(root, task_dir):
        needs.append(Need(kind="judge", detail="its grader asks Claw-Eval's LLM judge"))
    return needs


def _spec(data: dict[str, Any], root: Path, task_dir: Path) -> ClawEvalTask:
    env = data.get("environment") or {}
    prompt = data.get("prompt") or {}
    endpoints = [ToolEndpoint.model_validate(e) for e in data.get("tool_endpoints") or []]
    routed = {e.tool_name for e in endpoints}
    tools = [ToolSpec.model_validate(t) for t in data.get("tools") or []]
    return ClawEvalTask(
        repo=str(root), task_dir=str(task_dir), task_id=str(data["task_id"]),
        language=str(prompt.get("language", "zh")),
        tools=[t for t in tools if t.name in routed],
        sandbox_tools=[t.name for t in tools if t.name not in routed],
        tool_endpoints=endpoints,
        services=[ServiceDef.model_validate(s) for s in data.get("services") or []],
        sandbox_files=[str(f) for f in data.get("sandbox_files") or env.get("fixtures") or []],
        attachments=[str(f) for f in prompt.get("attachments") or []],
        sandbox_grader_files=[str(f) for f in data.get("sandbox_grader_files") or []],
        local_grader_files=[str(f) for f in data.get("local_grader_files") or []],
        env_snapshot_files=[str(f) for f in data.get("env_snapshot_files") or []],
        env_snapshot_commands=[str(c) for c in data.get("env_snapshot_commands") or []],
        env_snapshot_timeout_s=float(env.get("env_snapshot_timeout", 10)),
        max_turns=int(env.get("max_turns", 20)))


def skipped(task: ClawTask, judged: bool) -> SkippedTask | None:
    """The task as skipped, when it has a need this run cannot meet (`judged`: a judge is
    set); None when it runs."""
    spec = task.claw_eval
    kind = blocking_need(spec, judged) if spec is not None else None
    if spec is None or kind is None:
        return None
    need = spec.need(kind)
    return SkippedTask(id=task.id, reason=SKIP_REASONS[kind], detail=need.detail if need else "")


def load_task(task_dir: Path, root: Path | None = None) -> ClawTask:
    """One task folder; raises TaskLoadError when its `task.yaml` cannot be read."""
    task_dir = task_dir.resolve()
    root = root or checkout.find_root(task_dir)
    try:
        data = read_yaml(task_dir / TASK_FILE)
        if not isinstance(data, dict) or "task_id" not in data:
            raise TaskLoadError(f"{task_dir / TASK_FILE}: not a Claw-Eval task (no task_id)")
        text = (data.get("prompt") or {}).get("text")
        if not text:
            raise TaskLoadError(f"{task_dir / TASK_FILE}: no prompt.text")
        spec = _spec(data, root, task_dir)
    except (ValidationError, ValueError, TypeError, AttributeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TaskLoadError(f"{task_dir / TASK_FILE}: {reason}") from None
    spec.needs = _needs(data, spec, root, task_dir)
    timeout = (data.get("environment") or {}).get("timeout_seconds")
    return ClawTask(
        id=spec.task_id, prompt=container_paths_relative(str(text)) + tool_note(spec.tools),
        category=str(data.get("category") or "general"),
        tools=[t.name for t in spec.tools], timeout_s=float(timeout) if timeout else None,
        format="claw-eval", root=str(task_dir), claw_eval=spec)


def load_claw_eval(path: Path) -> TaskList:
    """Every task of a checkout, of its `tasks/` folder, or one task's folder. A task whose
    `task.yaml` cannot be read is listed in the result's `skipped`; the others load."""
    root = checkout.find_root(path)
    if (path / TASK_FILE).is_file():
        dirs = [path]
    else:
        dirs = sorted(d for d in (root / "tasks").iterdir() if (d / TASK_FILE).is_file())
    if not dirs:
        raise TaskLoadError(f"{root / 'tasks'}: no Claw-Eval task folders (tasks/<id>/task.yaml)")
    loaded = TaskList()
    for task_dir in dirs:
        try:
            loaded.append(load_task(task_dir, root))
        except TaskLoadError as exc:
            loaded.skipped.append(SkippedTask(id=task_dir.name, reason=UNREADABLE,
                                              detail=str(exc)))
    if not loaded:
        reasons = "; ".join(s.detail for s in loaded.skipped[:3])
        raise TaskLoadError(f"{path}: no task could be read ({reasons})")
    return loaded
