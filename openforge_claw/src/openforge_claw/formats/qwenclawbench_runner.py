"""Runs one QwenClawBench grader in its own process: `python -m
openforge_claw.formats.qwenclawbench_runner`.

The job (`grader_process`: JSON on stdin, the result back after the nonce) is `{code,
transcript, workspace}`. The code is executed in a fresh namespace and its
`grade(transcript, workspace)` called, as the benchmark's runner does. The result is
`{"ok": true, "scores": ...}` or `{"ok": false, "kind": ..., "error": ...}` with kind `no_grade` (the code defines no grade()), `grader_import` (the grader's
own code imports a module this Python lacks: the grader could not run here) or
`exception` (grade() raised: the benchmark scores that 0).
"""

from __future__ import annotations

import traceback
from typing import Any

from openforge_claw.grader_process import serve

GRADER_FILE = "<automated checks>"


def _jsonable(scores: Any) -> Any:
    if not isinstance(scores, dict):
        return None
    out: dict[str, Any] = {}
    for key, value in scores.items():
        out[str(key)] = value if isinstance(value, bool | int | float) else str(value)
    return out


def _failed_in_grader(exc: BaseException) -> bool:
    """True when the innermost frame of `exc` is the grader's own code (not agent code it
    imported or ran)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename == GRADER_FILE


def run(job: dict[str, Any]) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    try:
        exec(compile(job["code"], GRADER_FILE, "exec"), namespace)  # noqa: S102
        grade = namespace.get("grade")
        if not callable(grade):
            return {"ok": False, "kind": "no_grade", "error": "the code defines no grade()"}
        scores = grade(job["transcript"], job["workspace"])
    except ModuleNotFoundError as exc:
        kind = "grader_import" if _failed_in_grader(exc) else "exception"
        return {"ok": False, "kind": kind, "module": exc.name,
                "error": f"ModuleNotFoundError: {exc}"}
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a grader is a failure too
        tail = "".join(traceback.format_exception(exc)[-3:])[-1500:]
        return {"ok": False, "kind": "exception", "error": f"{type(exc).__name__}: {exc}"[:500],
                "traceback": tail}
    return {"ok": True, "scores": _jsonable(scores)}


if __name__ == "__main__":
    serve(run)
