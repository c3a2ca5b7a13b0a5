"""The grader process both benchmarks' graders run in (`grader_process`): only the line with
the job's nonce is the result, and nothing the grader started outlives it."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from openforge_claw import grader_process

RUNNER = "openforge_claw.formats.qwenclawbench_runner"  # a grader main built on `serve`


def _run(code: str, ws: Path, timeout_s: float = 60) -> grader_process.Outcome:
    return grader_process.run(RUNNER, {"code": code, "transcript": [], "workspace": str(ws)},
                              cwd=ws, env=dict(os.environ), timeout_s=timeout_s)


def _sleepers(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if tag in (proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_only_the_nonce_line_is_the_result(tmp_path: Path) -> None:
    # A grader writing to the real stdout (fd 1) cannot forge the result: it lacks the nonce.
    code = ("import os, json\n"
            "def grade(t, w):\n"
            "    os.write(1, b'deadbeef {\"ok\": true, \"scores\": {\"forged\": 1}}\\n')\n"
            "    print('{\"ok\": true}')\n"
            "    return {'real': 0.5}\n")
    done = _run(code, tmp_path)
    assert done.result == {"ok": True, "scores": {"real": 0.5}} and not done.timed_out


def test_a_crash_without_a_result_and_a_timeout_are_told_apart(tmp_path: Path) -> None:
    crashed = _run("import os\ndef grade(t, w):\n    os._exit(7)\n", tmp_path)
    assert crashed.result is None and not crashed.timed_out and crashed.returncode == 7
    hung = _run("def grade(t, w):\n    import time\n    time.sleep(60)\n", tmp_path, 1)
    assert hung.result is None and hung.timed_out


def test_nothing_the_grader_started_outlives_it(tmp_path: Path) -> None:
    tag = "317.25"  # a sleep no other process runs
    code = ("import subprocess\n"
            "def grade(t, w):\n"
            f"    subprocess.Popen(['sleep', {tag!r}], stdout=subprocess.DEVNULL,\n"
            "                     stderr=subprocess.DEVNULL, start_new_session=False)\n"
            "    return {'done': 1}\n")
    done = _run(code, tmp_path)
    assert done.result == {"ok": True, "scores": {"done": 1}}
    left = [p for p in _sleepers(tag) if p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [p.pid for p in left]
