"""Claw-Eval's `env_snapshot`: what a grader reads from the agent's container afterwards.

Claw-Eval collects it once the agent is done, in this order: the task's grader-only files
(`sandbox_grader_files`, e.g. a verify script that knows the answer) are copied in, its
`env_snapshot_commands` run in the container (key `cmd:<command>` -> `{exit_code, stdout,
stderr}`), its `env_snapshot_files` are read (key `file:<path>` -> `{content, encoding,
mime_type}` or `{error}`; a glob gives one key per match, by absolute container path), and
its `local_grader_files` are read from the task's folder (key `local_file:<path>` ->
base64, or `{error}`).

The container's `/workspace` is the rollout's workspace. Commands and verify scripts name
`/workspace/...` literally, so each command runs under bubblewrap with the workspace
mounted at /workspace, in the checks' sandbox (`check_sandbox`: openforge's allowlisted
view, no network, no capabilities), with a clean environment and the task's
`env_snapshot_timeout`: the commands run the agent's files (its scripts, the database it
repaired), so they get no more reach than the agent had.
"""

from __future__ import annotations

import base64
import glob
import mimetypes
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from openforge.sandbox import bounded
from openforge.sandbox.scrub import fresh_path

from openforge_claw import check_sandbox
from openforge_claw.claweval import checkout
from openforge_claw.claweval.spec import CONTAINER_WORKSPACE, ClawEvalTask

# What Claw-Eval's sandbox server reads as text (`/read`): these types and extensions.
_TEXT_MIMES = {"application/json", "application/xml", "application/yaml", "application/x-yaml",
               "application/javascript"}
_TEXT_EXTENSIONS = {".txt", ".md", ".csv", ".json", ".yaml", ".yml", ".xml", ".html", ".htm",
                    ".js", ".ts", ".py", ".sh", ".bash", ".cfg", ".ini", ".toml", ".log", ".sql",
                    ".r", ".rmd"}
_IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tiff", ".tif"}
_MAX_GLOB = 50
_OUTPUT_LIMIT = 1_000_000
_FILE_LIMIT = 64 << 20  # bytes of one file read for the grader


class SnapshotError(RuntimeError):
    """A snapshot command cannot run here (no bubblewrap)."""


def container_argv(workspace: Path, command: str, python: str, nested: bool) -> list[str]:
    """bubblewrap argv running `command` with `workspace` at /workspace, in the checks'
    sandbox (`check_sandbox`: openforge's allowlisted view, no network, no capabilities).
    `nested`: inside another bubblewrap, which cannot mount a new /proc."""
    exe = check_sandbox.usable_bwrap(with_proc=not nested)
    if exe is None:
        raise SnapshotError("the task runs env_snapshot_commands at /workspace, which needs "
                            "bubblewrap: apt-get install bubblewrap")
    return [exe, *check_sandbox.prefix(workspace, mount_at=CONTAINER_WORKSPACE, python=python,
                                       with_proc=not nested),
            "--clearenv", "--setenv", "PATH", f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
            "/bin/sh", "-c", command]


def run_command(workspace: Path, command: str, timeout_s: float, python: str) -> dict[str, Any]:
    """One snapshot command, as Claw-Eval's sandbox `/exec` answers it."""
    nested = check_sandbox.usable_bwrap(with_proc=True) is None
    argv = container_argv(workspace, command, python, nested)
    # Into files, of which the first _OUTPUT_LIMIT bytes are read: the command runs the
    # agent's files, which print as much as the agent made them print.
    with bounded.run_to_files(argv, timeout_s=timeout_s) as ran:
        if ran.returncode is None:
            return {"exit_code": -1, "stdout": "", "stderr": f"Timed out after {timeout_s:g}s"}
        return {"exit_code": ran.returncode,
                "stdout": bounded.read_text(ran.stdout, _OUTPUT_LIMIT),
                "stderr": bounded.read_text(ran.stderr, _OUTPUT_LIMIT)}


def read_file(path: Path, shown: str) -> dict[str, Any]:
    """A file as Claw-Eval's sandbox `/read` gives it (images as one base64 frame)."""
    if not path.is_file():
        return {"error": f"File not found: {shown}"}
    size = path.stat().st_size
    if size > _FILE_LIMIT:  # the agent's file, as large as it made it: not read into memory
        return {"error": f"File too large to read: {shown} ({size:,} bytes; at most "
                         f"{_FILE_LIMIT:,} are read)"}
    ext = path.suffix.lower()
    mime, _ = mimetypes.guess_type(path.name)
    if ext in _IMAGE_EXTENSIONS:
        return {"content": base64.b64encode(path.read_bytes()).decode("ascii"),
                "encoding": "base64", "mime_type": mime or "image/png"}
    is_text = (mime in _TEXT_MIMES or (mime is not None and mime.startswith("text/"))
               or (mime is None and ext in _TEXT_EXTENSIONS))
    if is_text:
        return {"content": path.read_text(encoding="utf-8", errors="replace"),
                "mime_type": mime or "text/plain", "encoding": "utf-8"}
    return {"content": base64.b64encode(path.read_bytes()).decode("ascii"),
            "mime_type": mime or "application/octet-stream", "encoding": "base64",
            "size_bytes": path.stat().st_size}


def _in_workspace(workspace: Path, pattern: str) -> str:
    """A container path (absolute under /workspace, or relative to it) on this machine."""
    if pattern == CONTAINER_WORKSPACE or pattern.startswith(CONTAINER_WORKSPACE + "/"):
        return str(workspace) + pattern[len(CONTAINER_WORKSPACE):]
    return pattern if os.path.isabs(pattern) else str(workspace / pattern)


def _as_container(workspace: Path, path: str) -> str:
    rel = os.path.relpath(path, workspace)
    return CONTAINER_WORKSPACE if rel == "." else f"{CONTAINER_WORKSPACE}/{rel}"


def collect(spec: ClawEvalTask, workspace: Path, python: str = sys.executable) -> dict[str, Any]:
    """The `env_snapshot` Claw-Eval hands to a grader, gathered from `workspace`."""
    root, task_dir = Path(spec.repo), Path(spec.task_dir)
    for rel in spec.sandbox_grader_files:
        source = checkout.require(checkout.resolve_task_file(root, task_dir, rel), rel,
                                  spec.task_id)
        shutil.copyfile(source, fresh_path(workspace, rel))
    snapshot: dict[str, Any] = {}
    for command in spec.env_snapshot_commands:
        snapshot[f"cmd:{command}"] = run_command(workspace, command, spec.env_snapshot_timeout_s,
                                                 python)
    ws = workspace.resolve()
    for pattern in spec.env_snapshot_files:
        local = _in_workspace(ws, pattern)
        if "*" in pattern or "?" in pattern:
            for match in sorted(glob.glob(local, recursive=True))[:_MAX_GLOB]:
                if os.path.isfile(match) and Path(match).resolve().is_relative_to(ws):
                    shown = _as_container(ws, match)
                    snapshot[f"file:{shown}"] = read_file(Path(match), shown)
        else:
            path = Path(local)
            inside = path.resolve().is_relative_to(ws)  # a symlink out is not the agent's file
            snapshot[f"file:{pattern}"] = (read_file(path, pattern) if inside else
                                           {"error": f"File not found: {pattern}"})
    for rel in spec.local_grader_files:
        path = task_dir / rel
        snapshot[f"local_file:{rel}"] = (
            {"encoding": "base64", "content": base64.b64encode(path.read_bytes()).decode()}
            if path.exists() else {"error": f"not found: {path}"})
    return snapshot
