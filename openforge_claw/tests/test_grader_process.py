"""The grader process both benchmarks' graders run in (`grader_process`): only the line with
the job's nonce is the result, and nothing the grader started outlives it."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from openforge_claw import grader_process

RUNNER = "openforge_claw.formats.qwenclawbench_runner"  # a grader main built on `serve`


def _run(code: str, ws: Path, timeout_s: float = 60) -> grader_process.Outcome:
    return grader_process.run(RUNNER, {"code": code, "transcript": [], "workspace": str(ws)},
                              cwd=ws, env=dict(os.environ), timeout_s=timeout_s)


# A module the agent plants in the grader's cwd (its workspace) under a standard library name:
# imported before the grader, it reads the nonce from stdin and writes a result of its own.
FORGER = ("import os, re, sys\n"
          "nonce = re.search(r'\"nonce\": \"([0-9a-f]+)\"', sys.stdin.read()).group(1)\n"
          "os.write(1, (nonce + ' {\"ok\": true, \"scores\": {\"forged\": 1}}\\n').encode())\n"
          "os._exit(0)\n")


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


def test_nothing_in_the_cwd_runs_in_the_grader_process(tmp_path: Path) -> None:
    for name in ("json.py", "traceback.py", "runpy.py", "secrets.py"):
        (tmp_path / name).write_text(FORGER)
    env = dict(os.environ)
    # An empty PYTHONPATH entry is read as the cwd: it must not bring the cwd back either.
    env["PYTHONPATH"] = os.pathsep.join(["", *filter(None, [env.get("PYTHONPATH")])])
    done = grader_process.run(RUNNER, {"code": "def grade(t, w):\n    return {'real': 0.5}\n",
                                       "transcript": [], "workspace": str(tmp_path)},
                              cwd=tmp_path, env=env, timeout_s=60)
    assert done.result == {"ok": True, "scores": {"real": 0.5}}, done.output


def test_import_paths_are_absolute_and_outside_the_untrusted_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    (ws / "lib").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(ws)
    monkeypatch.chdir(tmp_path)
    pythonpath = os.pathsep.join(["", "src", str(ws / "lib"), str(tmp_path / "alias"),
                                  "/opt/lib", ""])
    assert grader_process.import_paths(pythonpath, untrusted=ws) == [
        str(tmp_path / "src"), "/opt/lib"]
    assert grader_process.import_paths(None) == []


def test_a_note_arrives_even_when_the_process_dies_next(tmp_path: Path) -> None:
    code = ("import os\nfrom openforge_claw.grader_process import note\n"
            "def grade(t, w):\n    note('about to end')\n    os._exit(5)\n")
    done = _run(code, tmp_path)
    assert done.result is None and done.returncode == 5 and "about to end" in done.notes
    assert "about to end" not in done.output  # notes are not output
