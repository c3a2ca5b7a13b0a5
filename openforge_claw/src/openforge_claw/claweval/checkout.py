"""A Claw-Eval checkout on disk: where it is, which files a task names, which graders judge.

A checkout is the repository's root: `src/claw_eval/` (the package every `grader.py`
imports), `mock_services/` (the services' programs) and `tasks/<id>/`. Paths in a task
resolve as Claw-Eval resolves them:

- a sandbox or grader file (`sandbox_files`, `sandbox_grader_files`, `attachments`) is
  relative to the task's folder, else to the checkout's root (tasks borrow fixtures from
  other tasks: `tasks/T021zh_.../fixtures/rss/articles.json`); it lands in the workspace
  at the same relative path (Claw-Eval's `/workspace/<path>`);
- a service's `*_FIXTURES` / `*_DIR` variable is relative to the checkout's root, where
  Claw-Eval starts its services;
- a `local_grader_files` entry is relative to the task's folder.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from openforge.errors import OpenforgeError

GRADER_FILE = "grader.py"
# A grader that touches `judge` beyond its signature's `judge: Any | None = None` (or
# `judge=None`): an attribute, an argument to a helper, a truth test.
_JUDGE_USE = re.compile(r"judge\s*\.|\(\s*judge\b|,\s*judge\b|judge\s*=\s*judge|\bjudge\s*\)"
                        r"|\bif\s+(not\s+)?judge\b")
_JUDGE_PARAM = re.compile(r"judge\s*:\s*[^,)]*|judge\s*=\s*None\b")
_PEER = re.compile(r"load_peer_grader\(\s*['\"]([^'\"]+)['\"]")
_GRADER_MODULE = re.compile(r"from\s+claw_eval\.graders\.(\w+)\s+import|"
                            r"import\s+claw_eval\.graders\.(\w+)")
# Modules of claw_eval.graders that define the base class and the loader, not grading.
_PLUMBING = {"base", "registry", "__init__"}


class CheckoutError(OpenforgeError):
    """A folder that is not (part of) a Claw-Eval checkout, or a file a task needs is missing."""


def find_root(path: Path) -> Path:
    """The checkout root for `path`: the root itself, its `tasks/` or one task's folder."""
    path = path.resolve()
    for candidate in (path, *path.parents):
        if (candidate / "tasks").is_dir() and (candidate / "src" / "claw_eval").is_dir():
            return candidate
    raise CheckoutError(f"{path}: not inside a Claw-Eval checkout (no folder above it holds "
                        f"both tasks/ and src/claw_eval/); point environment_options.path at "
                        f"your clone of github.com/claw-eval/claw-eval")


def commit(root: Path) -> str | None:
    """The checkout's git commit, when it is a git work tree."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def resolve_task_file(root: Path, task_dir: Path, rel: str) -> Path | None:
    """A sandbox/grader file of a task: the task's folder first, then the checkout's root."""
    for base in (task_dir, root):
        candidate = base / rel
        if candidate.exists():
            return candidate
    return None


def resolve_service_path(root: Path, value: str) -> Path:
    """A service variable naming a file or folder: relative to the checkout's root."""
    path = Path(value)
    return path if path.is_absolute() else root / path


def require(path: Path | None, rel: str, task_id: str) -> Path:
    """`path`, or a one-line error naming the missing file."""
    if path is None or not path.exists():
        raise CheckoutError(f"task {task_id}: the file {rel} is not in the checkout "
                            f"(Claw-Eval ships large fixtures such as videos on Hugging Face: "
                            f"put it at tasks/{task_id}/{rel})")
    return path


def _grader_sources(root: Path, task_dir: Path, seen: set[Path]) -> list[str]:
    path = task_dir / GRADER_FILE
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    text = path.read_text(errors="replace")
    sources = [text]
    for peer in _PEER.findall(text):
        sources += _grader_sources(root, root / "tasks" / peer, seen)
    return sources


def grader_uses_judge(root: Path, task_dir: Path) -> bool:
    """Whether the task's grader (its own file, the peer graders it extends and the
    `claw_eval.graders` modules they import) calls the LLM judge.

    Checked on the text: a grader may call the judge on any path, so "it could" counts.
    The grading run backs this up: a grader that touches the judge when none is set stops
    with a labelled error instead of a score.
    """
    sources = _grader_sources(root, task_dir, set())
    modules: set[str] = set()
    for text in list(sources):
        for a, b in _GRADER_MODULE.findall(text):
            modules.add(a or b)
    for name in sorted(modules - _PLUMBING):
        module = root / "src" / "claw_eval" / "graders" / f"{name}.py"
        if module.is_file():
            sources.append(module.read_text(errors="replace"))
    return any(_JUDGE_USE.search(_JUDGE_PARAM.sub("", text)) for text in sources)
