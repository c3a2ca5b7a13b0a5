"""QwenClawBench tasks (`tasks/task_*.md` + `assets/<task id>/`) as claw tasks.

A task file is Markdown with a YAML front matter (`id`, `name`, `category`,
`grading_type`: automated | llm_judge | hybrid, `grading_weights`, `timeout_seconds`,
`workspace_files: [{source, dest}]`) and the sections `## Prompt`, `## Expected Behavior`,
`## Grading Criteria`, `## Automated Checks` (a python block defining
`grade(transcript, workspace_path) -> dict` of criterion scores in [0, 1]) and
`## LLM Judge Rubric`.

Mapping: the prompt section is the prompt; `assets/<id>/` is copied into the workspace
(and `workspace_files` sources are read relative to `assets/`); the automated `grade` is a
`python` check, its criteria averaged, scored `plain` (no robustness term); the rubric
(with expected behaviour and grading criteria) goes to `claw-judge`, and `hybrid` tasks
keep their `grading_weights`. The transcript `grade` receives is the recorded
conversation when the reward has it, else the final answer as one assistant message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from openforge_claw.tasks import Check, ClawTask, GraderSpec, TaskLoadError, WorkspaceFile

_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n(.*)\Z", re.DOTALL)
_CODE = re.compile(r"```(?:python)?\s*\n(.*?)```", re.DOTALL)


def sections(body: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current = None
    for line in body.splitlines():
        if line.startswith("## "):
            current = line[3:].strip().lower()
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return {k: v.strip() for k, v in out.items()}


def load_task(path: Path, assets: Path) -> ClawTask:
    text = path.read_text()
    match = _FRONT.match(text)
    if not match:
        raise TaskLoadError(f"{path}: no YAML front matter (--- ... ---)")
    try:
        meta: dict[str, Any] = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"{path}: bad front matter: {str(exc).splitlines()[0]}") from None
    parts = sections(match.group(2))
    prompt = parts.get("prompt")
    if not prompt:
        raise TaskLoadError(f"{path}: no '## Prompt' section")
    task_id = str(meta.get("id") or path.stem)
    grading = str(meta.get("grading_type", "automated"))
    checks = []
    code = _CODE.search(parts.get("automated checks", ""))
    if code:
        checks.append(Check(type="python", code=code.group(1), function="grade"))
    elif grading != "llm_judge":
        raise TaskLoadError(f"{path}: grading_type {grading} needs a python block under "
                            f"'## Automated Checks'")
    rubric = "\n\n".join(f"{name.title()}:\n{parts[name]}" for name in
                         ("expected behavior", "grading criteria", "llm judge rubric")
                         if parts.get(name)) or None
    weights = meta.get("grading_weights") if grading == "hybrid" else None
    task_assets = assets / task_id
    files = [WorkspaceFile(source=str(Path("assets") / task_id), dest=".")] \
        if task_assets.is_dir() else []
    for wf in meta.get("workspace_files") or []:
        files.append(WorkspaceFile(source=str(Path("assets") / wf["source"]), dest=wf["dest"]))
    return ClawTask(
        id=task_id, prompt=prompt, category=str(meta.get("category", "general")),
        grader=GraderSpec(checks=checks, score_shape="plain"), rubric=rubric,
        judge_weights={k: float(v) for k, v in weights.items()} if weights else None,
        timeout_s=float(meta["timeout_seconds"]) if meta.get("timeout_seconds") else None,
        format="qwenclawbench", root=str(assets.parent.resolve()), workspace_files=files)


def load_qwenclawbench(path: Path) -> list[ClawTask]:
    """A task file, a `tasks/` folder, or a data folder holding `tasks/` and `assets/`."""
    if path.is_file():
        files, base = [path], path.parent
    else:
        base = path / "tasks" if (path / "tasks").is_dir() else path
        files = sorted(base.glob("task_*.md"))
    if not files:
        raise TaskLoadError(f"{path}: no task_*.md files")
    root = base.parent if base.name == "tasks" else base
    return [load_task(f, root / "assets") for f in files]
