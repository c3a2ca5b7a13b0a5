"""Claw-Eval tasks (`tasks/<id>/task.yaml` + `grader.py` + `fixtures/`) as claw tasks.

What is read from `task.yaml`: `task_id`, `category`, `prompt.text`, `services`
(`name`, `command`, `health_check`, `env`), `tools`, `environment.timeout_seconds`,
`scoring_components` (`weight`, `check.type`), `safety_checks`. Mapping:

- a service whose `name` is one of the built-in mock kinds (mail, calendar, notes, rest,
  with the aliases below) runs as that mock, seeded from the JSON file its `*_FIXTURES`
  variable names; any other service runs its own `command` on a free port (`{port}` and
  `$PORT`; the task's fixed port is not used, so rollouts can run concurrently);
- programmatic checks (`keywords_present`, `keywords_absent`, `tool_called`,
  `tool_not_called`, and every openforge-claw check type) become grader checks with their
  weights; `llm_judge` checks go to the rubric for the `claw-judge` reward;
- `grader.py`, when present, is called as a `python` check (a `grade` function or a
  `*Grader` class with a `grade` method; a dict with completion / robustness / safety sets
  those dimensions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openforge_claw.services import BUILTIN, ServiceSpec
from openforge_claw.tasks import TASK_FILE, Check, ClawTask, GraderSpec, TaskLoadError, read_yaml

ALIASES = {"gmail": "mail", "email": "mail", "inbox": "mail", "todo": "rest", "crm": "rest",
           "contacts": "rest", "notion": "notes"}


def _service(raw: dict[str, Any], task_dir: Path) -> ServiceSpec:
    name = str(raw.get("name"))
    kind = name if name in BUILTIN else ALIASES.get(name)
    env = {k: str(v) for k, v in (raw.get("env") or {}).items()}
    if kind:
        seed: dict[str, Any] = {}
        for key, value in env.items():
            path = task_dir / value
            if key.endswith("_FIXTURES") and path.is_file() and path.suffix == ".json":
                data = json.loads(path.read_text())
                seed.update(data if isinstance(data, dict) else {"items": data})
        return ServiceSpec(name=name, kind=kind, seed=seed)  # type: ignore[arg-type]
    if not raw.get("command"):
        raise TaskLoadError(f"{task_dir}: service {name!r} is not a known mock and has no command")
    return ServiceSpec(name=name, kind="command", command=str(raw["command"]),
                       health_check=str(raw.get("health_check") or "/"), env=env)


def _check(raw: dict[str, Any]) -> tuple[Check | None, str | None]:
    """(grader check, rubric line) for one scoring component."""
    check = dict(raw.get("check") or {})
    weight = float(raw.get("weight", 1.0))
    if check.get("type") == "llm_judge":
        return None, f"- {raw.get('name', 'criterion')} (weight {weight:g}): " \
                     f"{check.get('rubric') or check.get('criteria') or check.get('prompt', '')}"
    if "tool_name" in check and "name" not in check:
        check["name"] = check.pop("tool_name")
    return Check.model_validate({**check, "weight": weight}), None


def load_task(task_dir: Path) -> ClawTask:
    data = read_yaml(task_dir / TASK_FILE)
    if not isinstance(data, dict) or "task_id" not in data:
        raise TaskLoadError(f"{task_dir / TASK_FILE}: not a Claw-Eval task (no task_id)")
    prompt = data.get("prompt")
    text = prompt.get("text") if isinstance(prompt, dict) else prompt
    if not text:
        raise TaskLoadError(f"{task_dir / TASK_FILE}: no prompt.text")
    checks, rubric = [], []
    for component in data.get("scoring_components") or []:
        check, line = _check(component)
        if check:
            checks.append(check)
        if line:
            rubric.append(line)
    safety = [c for c in (_check({"check": s, "weight": 1.0})[0]
                          for s in data.get("safety_checks") or []) if c]
    if (task_dir / "grader.py").is_file():
        checks.append(Check(type="python", file="grader.py", weight=1.0))
    if not checks:
        raise TaskLoadError(f"{task_dir}: no programmatic scoring component and no grader.py")
    timeout = (data.get("environment") or {}).get("timeout_seconds")
    return ClawTask(
        id=str(data["task_id"]), prompt=str(text), category=str(data.get("category", "general")),
        services=[_service(s, task_dir) for s in data.get("services") or []],
        tools=[t.get("name", t) if isinstance(t, dict) else t for t in data.get("tools") or []],
        grader=GraderSpec(checks=checks, safety=safety),
        rubric="\n".join(rubric) or None, timeout_s=float(timeout) if timeout else None,
        format="claw-eval", root=str(task_dir.resolve()))


def load_claw_eval(path: Path) -> list[ClawTask]:
    """A Claw-Eval task folder, a `tasks/` folder of them, or the repository root."""
    if (path / TASK_FILE).is_file():
        return [load_task(path)]
    base = path / "tasks" if (path / "tasks").is_dir() else path
    dirs = sorted(d for d in base.iterdir() if (d / TASK_FILE).is_file())
    if not dirs:
        raise TaskLoadError(f"{path}: no Claw-Eval task folders")
    return [load_task(d) for d in dirs]
