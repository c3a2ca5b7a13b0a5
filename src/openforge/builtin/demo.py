"""The `demo` environment: small workspace tasks, each with a programmatic checker.

Every task lays out a few fixture files, asks for one concrete change (create or edit a
file, run a command, fix a tiny failing script, ...) and is checked by reading the
workspace afterwards. Checkers give partial credit where a task has separable parts;
`passed` means a score of 1.0.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.sandbox import bounded, verifier
from openforge.types import RewardResult, Task

ENV_NAME = "demo"
_MAX_FILES = 100
_MAX_CONTENT = 4096
# Bytes of a workspace file a checker reads: every expected answer is far smaller, and a
# larger file reads as its head and a line saying it was cut (never a match).
_READ_LIMIT = 1 << 20

Checker = Callable[[Path], tuple[float, dict[str, Any]]]


@dataclass(frozen=True)
class DemoTask:
    """A task definition: prompt, fixture files (path -> text), checker."""

    id: str
    prompt: str
    check: Checker
    files: dict[str, str] = field(default_factory=dict)


def _read(ws: Path, name: str) -> str | None:
    path = ws / name
    return bounded.read_text(path, _READ_LIMIT) if path.is_file() else None


def _exact(ws: Path, name: str, expected: str) -> tuple[float, dict[str, Any]]:
    got = _read(ws, name)
    if got is None:
        return 0.0, {"reason": f"{name} does not exist"}
    if got.strip() == expected.strip():
        return 1.0, {}
    return 0.0, {"reason": f"{name} has the wrong content", "got": got[:200]}


def _parts(**parts: bool) -> tuple[float, dict[str, Any]]:
    """Partial credit: the fraction of named parts that hold."""
    score = sum(parts.values()) / len(parts)
    return score, {"parts": parts}


def _run_python(ws: Path, script: str) -> tuple[int, str]:
    # The agent wrote the script: in a rollout it runs in a fresh sandbox, never here.
    proc = verifier.run([sys.executable, script], cwd=ws, timeout_s=20)
    if proc.timed_out or proc.returncode is None or proc.stdout_omitted:
        return -1, ""  # an output too long to read whole is no expected one
    return proc.returncode, proc.stdout


# --- checkers -----------------------------------------------------------------------------

def _check_hello(ws: Path) -> tuple[float, dict[str, Any]]:
    return _exact(ws, "hello.txt", "Hello, world!")


def _check_append(ws: Path) -> tuple[float, dict[str, Any]]:
    text = _read(ws, "notes.txt") or ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines[-1:] != ["third"]:
        return 0.0, {"reason": "the last line is not 'third'", "got": lines[-3:]}
    # Appending is the task; clobbering the existing lines while doing it earns half.
    return (1.0, {}) if lines == ["first", "second", "third"] else (0.5, {"got": lines})


def _check_count(ws: Path) -> tuple[float, dict[str, Any]]:
    return _exact(ws, "count.txt", "17")


def _check_rename(ws: Path) -> tuple[float, dict[str, Any]]:
    if _read(ws, "final.md") != "# Report\n\nAll good.\n":
        return 0.0, {"reason": "final.md is missing or not the draft's content"}
    if (ws / "draft.md").exists():
        return 0.5, {"reason": "copied, not renamed: draft.md still exists"}
    return 1.0, {}


def _check_json(ws: Path) -> tuple[float, dict[str, Any]]:
    try:
        data = json.loads(_read(ws, "config.json") or "")
    except ValueError:
        return 0.0, {"reason": "config.json is not valid JSON"}
    if not isinstance(data, dict) or data.get("name") != "demo-app":
        return 0.0, {"reason": "config.json lost its other keys"}
    return _parts(debug_off=data.get("debug") is False, version_2=data.get("version") == 2)


def _check_fix_script(ws: Path) -> tuple[float, dict[str, Any]]:
    code, out = _run_python(ws, "calc.py")
    if code == 0 and out.strip() == "5":
        return 1.0, {}
    return 0.0, {"reason": f"python calc.py exited {code} printing {out.strip()[:80]!r}"}


def _check_mkdir(ws: Path) -> tuple[float, dict[str, Any]]:
    return _parts(package_dir=(ws / "src/pkg").is_dir(),
                  init_file=(ws / "src/pkg/__init__.py").is_file())


def _check_replace(ws: Path) -> tuple[float, dict[str, Any]]:
    return _exact(ws, "story.txt", "The dog sat. A dog ran. Dogs? No, one dog.")


def _check_sort(ws: Path) -> tuple[float, dict[str, Any]]:
    text = _read(ws, "sorted.txt")
    if text is None:
        return 0.0, {"reason": "sorted.txt does not exist"}
    want = ["alice", "bob", "carol", "dave", "erin"]
    got = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (1.0, {}) if got == want else (0.0, {"got": got})


def _check_capture(ws: Path) -> tuple[float, dict[str, Any]]:
    return _exact(ws, "out.txt", "checksum=4c44")


def _check_delete_tmp(ws: Path) -> tuple[float, dict[str, Any]]:
    if not (ws / "keep.txt").is_file():
        return 0.0, {"reason": "keep.txt was deleted too"}
    return _parts(**{f"{n}_deleted": not (ws / n).exists() for n in ("a.tmp", "b.tmp", "cache/c.tmp")})


def _check_csv_sum(ws: Path) -> tuple[float, dict[str, Any]]:
    return _exact(ws, "total.txt", "126")


_TASKS: list[DemoTask] = [
    DemoTask("hello-file", "Create a file named hello.txt containing exactly: Hello, world!",
             _check_hello),
    DemoTask("append-line", "The file notes.txt has two lines. Append a third line with the text: third",
             _check_append, {"notes.txt": "first\nsecond\n"}),
    DemoTask("count-lines", "Count the lines of data.txt and write just the number to count.txt.",
             _check_count, {"data.txt": "".join(f"row {i}\n" for i in range(17))}),
    DemoTask("rename-file", "Rename draft.md to final.md (draft.md must no longer exist).",
             _check_rename, {"draft.md": "# Report\n\nAll good.\n"}),
    DemoTask("json-edit",
             "Edit config.json: set \"debug\" to false and \"version\" to 2; keep every other key.",
             _check_json, {"config.json": json.dumps({"name": "demo-app", "debug": True, "version": 1})}),
    DemoTask("fix-script", "calc.py should print 5 but it is broken. Fix it so `python calc.py` prints 5.",
             _check_fix_script,
             {"calc.py": "def add(a, b):\n    return a - b\n\n\nprint(add(2, 3))\n"}),
    DemoTask("make-package", "Create the directory src/pkg with an empty __init__.py file in it.",
             _check_mkdir),
    DemoTask("replace-word", "In story.txt replace every lowercase word cat with dog "
             "(Cats stays as it is, but becomes Dogs).", _check_replace,
             {"story.txt": "The cat sat. A cat ran. Cats? No, one cat."}),
    DemoTask("sort-names", "Sort the names in names.txt alphabetically, one per line, into sorted.txt.",
             _check_sort, {"names.txt": "dave\nalice\nerin\nbob\ncarol\n"}),
    DemoTask("capture-output", "Run `python gen.py` and save exactly what it prints into out.txt.",
             _check_capture,
             {"gen.py": "print('checksum=' + format(sum(range(140)) + 9794, 'x'))\n"}),
    DemoTask("delete-tmp", "Delete every *.tmp file in the workspace (including subdirectories); "
             "keep all other files.", _check_delete_tmp,
             {"a.tmp": "x", "b.tmp": "y", "cache/c.tmp": "z", "keep.txt": "keep me\n"}),
    DemoTask("csv-sum", "numbers.csv has a column named amount. Write the sum of that column to total.txt.",
             _check_csv_sum, {"numbers.csv": "id,amount\n1,10\n2,25\n3,40\n4,51\n"}),
]
_BY_ID = {t.id: t for t in _TASKS}


class DemoEnvironment(Environment):
    """Small workspace tasks (files, commands, a failing script) with programmatic checkers."""

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for t in _TASKS:
            yield Task(id=t.id, prompt=t.prompt, environment=ENV_NAME, split=None,
                       data={"files": sorted(t.files)})

    def _definition(self, task: Task) -> DemoTask:
        if task.id not in _BY_ID:
            raise KeyError(f"the demo environment has no task {task.id!r}")
        return _BY_ID[task.id]

    def prepare(self, task: Task, workspace: Path) -> None:
        for rel, text in self._definition(task).files.items():
            path = workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        files: dict[str, Any] = {}
        for path in sorted(workspace.rglob("*")):
            if len(files) >= _MAX_FILES:
                break
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = str(path.relative_to(workspace))
            size = path.stat().st_size
            entry: dict[str, Any] = {"size": size}
            if size <= _MAX_CONTENT:
                try:
                    entry["content"] = path.read_text()
                except UnicodeDecodeError:
                    pass
            files[rel] = entry
        return {"files": files}

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        score, details = self._definition(task).check(workspace)
        score = min(max(score, 0.0), 1.0)
        return RewardResult(score=score, passed=score >= 1.0, details=details)
