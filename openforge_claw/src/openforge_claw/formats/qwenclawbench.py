"""QwenClawBench tasks (`tasks/task_*.md` + `assets/<task id>/`) as claw tasks.

A task file is Markdown with a YAML front matter (`id`, `name`, `category`,
`grading_type`: automated | llm_judge | hybrid, `grading_weights`, `timeout_seconds`,
`external_dependency`, `workspace_files`) and the sections `## Prompt`,
`## Expected Behavior`, `## Grading Criteria`, `## Automated Checks` (a python block that
defines `grade(transcript, workspace_path) -> dict` of criterion scores) and
`## LLM Judge Rubric`. Read the way the benchmark's own runner reads it:

- the prompt is the `## Prompt` section, sent to the agent as it stands;
- `workspace_files` entries are `{source, dest}` (the file `assets/<task id>/<source>`,
  else `assets/<source>`, copied to `dest`) or `{path, content}` (written inline); nothing
  else of `assets/<task id>/` reaches the workspace (some tasks keep their data generators
  there);
- the tracing fields `source_query` / `source_line_number` are dropped before the front
  matter is parsed, as the benchmark does (they may hold text that is not valid YAML).

Sections are split at `## ` lines outside fenced code, and the automated-checks code runs
from its opening fence to the first closing fence line after which the code compiles: a
fence inside the code (a regex or a string that holds one) does not cut it short.

A task that cannot be read (bad front matter, missing asset, code that does not compile,
a destination outside the workspace) is skipped and reported with its reason; the others
load. How the tasks are scored is `qwenclawbench_grading.py`.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from openforge_claw.tasks import (
    UNREADABLE,
    ClawTask,
    GraderSpec,
    QwenClawBenchGrading,
    SkippedTask,
    TaskList,
    TaskLoadError,
    WorkspaceFile,
)

_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n(.*)\Z", re.DOTALL)
_HEADER = re.compile(r"^##\s+(.+?)\s*$")
_FENCE = re.compile(r"^\s*```")
_OPEN_CODE = re.compile(r"^\s*```\s*(?:python|py)?\s*$", re.IGNORECASE)
_CLOSE_CODE = re.compile(r"^\s*```\s*$")
_TOP_KEY = re.compile(r"^\w[\w-]*:(\s|$)")
# Tracing fields the benchmark strips before parsing (free text, often not valid YAML).
_TRACING_KEYS = ("source_query:", "source_line_number:")
GRADING_TYPES = ("automated", "llm_judge", "hybrid")
DEFAULT_TIMEOUT_S = 120  # the benchmark's default `timeout_seconds`


def strip_tracing_fields(front: str) -> str:
    """The front matter without `source_query` (with its continuation lines) and
    `source_line_number`."""
    kept: list[str] = []
    skipping = False
    for line in front.splitlines():
        if line.startswith(_TRACING_KEYS):
            skipping = True
            continue
        if skipping and not _TOP_KEY.match(line):
            continue
        skipping = False
        kept.append(line)
    return "\n".join(kept)


def sections(body: str) -> dict[str, str]:
    """`## Name` -> the text under it (stripped); headers inside fenced code are text."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    in_code = False
    for line in body.splitlines():
        header = None if in_code else _HEADER.match(line)
        if header:
            current = header.group(1)
            out[current] = []
            continue
        if _FENCE.match(line):
            in_code = not in_code
        if current is not None:
            out[current].append(line)
    return {name: "\n".join(lines).strip() for name, lines in out.items()}


def grading_code(section: str, where: str) -> str | None:
    """The python of the `## Automated Checks` section, or None when it holds no block.

    Raises TaskLoadError when the block never closes into code that compiles.
    """
    lines = section.splitlines()
    start = next((i for i, line in enumerate(lines) if _OPEN_CODE.match(line)), None)
    if start is None:
        return None
    first_error: SyntaxError | None = None
    for end in range(start + 1, len(lines)):
        if not _CLOSE_CODE.match(lines[end]):
            continue
        code = "\n".join(lines[start + 1:end])
        try:
            compile(code, where, "exec")
        except SyntaxError as exc:
            first_error = first_error or exc
            continue
        return code
    if first_error is not None:
        raise TaskLoadError(f"{where}: the automated checks do not compile: "
                            f"{first_error.msg} (line {first_error.lineno})")
    raise TaskLoadError(f"{where}: the automated checks' code block is never closed")


def _relative_dest(value: Any, where: str) -> str:
    """A workspace-relative destination that cannot leave the workspace."""
    if not isinstance(value, str) or not value.strip():
        raise TaskLoadError(f"{where}: a workspace file has no destination")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise TaskLoadError(f"{where}: workspace file destination {value!r} is outside the "
                            f"workspace")
    return str(path)


def _asset(assets: Path, task_id: str, source: str, where: str) -> Path:
    """`assets/<task id>/<source>`, else `assets/<source>` (the benchmark's lookup order)."""
    rel = PurePosixPath(source)
    if rel.is_absolute() or ".." in rel.parts:
        raise TaskLoadError(f"{where}: asset source {source!r} is outside the assets folder")
    candidates = [assets / task_id / source, assets / source]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise TaskLoadError(f"{where}: asset file {source!r} not found (looked for "
                        f"{candidates[0]} and {candidates[1]})")


def _workspace_files(meta: dict[str, Any], task_id: str, root: Path,
                     where: str) -> tuple[list[WorkspaceFile], dict[str, str]]:
    copied: list[WorkspaceFile] = []
    inline: dict[str, str] = {}
    entries = meta.get("workspace_files") or []
    if not isinstance(entries, list):
        raise TaskLoadError(f"{where}: workspace_files must be a list")
    for entry in entries:
        if not isinstance(entry, dict):
            raise TaskLoadError(f"{where}: workspace file entry {entry!r} is not a mapping")
        if "content" in entry:
            inline[_relative_dest(entry.get("path"), where)] = str(entry["content"] or "")
        elif "source" in entry:
            found = _asset(root / "assets", task_id, str(entry["source"]), where)
            dest = _relative_dest(entry.get("dest", entry["source"]), where)
            copied.append(WorkspaceFile(source=str(found.relative_to(root)), dest=dest))
        else:
            raise TaskLoadError(f"{where}: workspace file entry has neither source/dest nor "
                                f"path/content: {sorted(entry)}")
    return copied, inline


def _criteria_list(text: str) -> str:
    """The `- [ ] ...` items of `## Grading Criteria` as a list (the judge's fallback rubric)."""
    items = [m.group(1) for line in text.splitlines()
             if (m := re.match(r"^-\s+\[[ xX]\]\s+(.+)$", line.strip()))]
    return "\n".join(f"- {item}" for item in items)


def load_task(path: Path, root: Path) -> ClawTask:
    """One `task_*.md`; `root` holds its `assets/`."""
    where = str(path)
    match = _FRONT.match(path.read_text(encoding="utf-8"))
    if not match:
        raise TaskLoadError(f"{where}: no YAML front matter (--- ... ---)")
    try:
        meta = yaml.safe_load(strip_tracing_fields(match.group(1))) or {}
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"{where}: bad front matter: {str(exc).splitlines()[0]}") from None
    if not isinstance(meta, dict):
        raise TaskLoadError(f"{where}: the front matter is not a mapping")
    parts = sections(match.group(2))
    prompt = parts.get("Prompt", "")
    if not prompt:
        raise TaskLoadError(f"{where}: no '## Prompt' section")
    task_id = str(meta.get("id") or path.stem)
    grading = str(meta.get("grading_type") or "automated")
    if grading not in GRADING_TYPES:
        raise TaskLoadError(f"{where}: unknown grading_type {grading!r} "
                            f"(expected one of {', '.join(GRADING_TYPES)})")
    code = grading_code(parts.get("Automated Checks", ""), where)
    if code is not None and not re.search(r"^\s*def\s+grade\s*\(", code, re.MULTILINE):
        raise TaskLoadError(f"{where}: the automated checks define no grade() function")
    if code is None and grading != "llm_judge":
        raise TaskLoadError(f"{where}: grading_type {grading} needs a python block under "
                            f"'## Automated Checks'")
    weights = meta.get("grading_weights")
    if weights is not None and not (isinstance(weights, dict) and all(
            isinstance(v, int | float) for v in weights.values())):
        raise TaskLoadError(f"{where}: grading_weights must map names to numbers")
    files, inline = _workspace_files(meta, task_id, root, where)
    rubric = parts.get("LLM Judge Rubric") or _criteria_list(parts.get("Grading Criteria", ""))
    spec = QwenClawBenchGrading(
        grading_type=grading, code=code,  # type: ignore[arg-type]
        weights={str(k): float(v) for k, v in weights.items()} if weights else None,
        expected_behavior=parts.get("Expected Behavior", ""), judge_rubric=rubric,
        external_dependency=(str(meta["external_dependency"])
                             if meta.get("external_dependency") not in (None, False, "none")
                             else None))
    timeout = meta.get("timeout_seconds") or DEFAULT_TIMEOUT_S
    return ClawTask(
        id=task_id, prompt=prompt, category=str(meta.get("category") or "general"),
        grader=GraderSpec(score_shape="plain", pass_threshold=1.0), rubric=rubric or None,
        judge_weights=spec.weights, timeout_s=float(timeout), format="qwenclawbench",
        root=str(root.resolve()), files=inline, workspace_files=files, qwenclawbench=spec)


def load_qwenclawbench(path: Path) -> TaskList:
    """A task file, a `tasks/` folder, or a data folder holding `tasks/` and `assets/`.

    Tasks that cannot be read are skipped and listed in the result's `skipped`.
    """
    if path.is_file():
        files, base = [path], path.parent
    else:
        base = path / "tasks" if (path / "tasks").is_dir() else path
        files = sorted(base.glob("task_*.md"))
    if not files:
        raise TaskLoadError(f"{path}: no task_*.md files")
    root = base.parent if base.name == "tasks" else base
    loaded = TaskList()
    seen: set[str] = set()
    for file in files:
        try:
            task = load_task(file, root)
        except TaskLoadError as exc:
            loaded.skipped.append(SkippedTask(id=file.stem, reason=UNREADABLE, detail=str(exc)))
            continue
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            loaded.skipped.append(SkippedTask(id=file.stem, reason=UNREADABLE,
                                              detail=f"{file}: {type(exc).__name__}: {exc}"))
            continue
        if task.id in seen:
            loaded.skipped.append(SkippedTask(id=task.id, reason="duplicate task id",
                                              detail=str(file)))
            continue
        seen.add(task.id)
        loaded.append(task)
    if not loaded:
        reasons = "; ".join(s.detail or s.reason for s in loaded.skipped[:3])
        raise TaskLoadError(f"{path}: no task could be read ({reasons})")
    return loaded
