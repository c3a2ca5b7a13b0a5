"""QwenClawBench tasks on fixture folders written in its format (every variant the real
benchmark has): loading, workspace files, the grader on OpenClaw session events, the
judge (a local OpenAI-compatible stand-in), the hybrid weighting and penalty, skipping."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import IN_PROCESS_FORGER, JudgeStandIn
from openforge.errors import OpenforgeError
from openforge.types import Call, Task

from openforge_claw import check_sandbox
from openforge_claw.environment import ClawEnvironment
from openforge_claw.formats import openclaw_events
from openforge_claw.formats import qwenclawbench_grading as qg
from openforge_claw.formats.qwenclawbench import grading_code, sections, strip_tracing_fields
from openforge_claw.grader_process import GraderError
from openforge_claw.judge import JudgeEndpoint, JudgeError
from openforge_claw.rewards import GraderReward
from openforge_claw.tasks import UNREADABLE, TaskLoadError, load_tasks

DATA = Path(__file__).parent / "fixtures" / "qwenclawbench"

# Planted by the agent in its workspace under a standard library module's name: imported
# first thing by a grader process whose sys.path starts with its cwd, it reads the job (with
# the nonce) from stdin and writes a perfect result before the grader runs.
FORGER = ("import os, re, sys\n"
          "nonce = re.search(r'\"nonce\": \"([0-9a-f]+)\"', sys.stdin.read()).group(1)\n"
          "os.write(1, (nonce + ' {\"ok\": true, \"scores\": {\"file_exists\": 1.0}}\\n')"
          ".encode())\n"
          "os._exit(0)\n")


def _judge_options(server: JudgeStandIn, **extra: Any) -> dict[str, Any]:
    return {"judge_base_url": server.url, "judge_model": "judge-1", **extra}


# -- recorded calls as the gateway stores them (chat dialect) --------------------------------

def _call(i: int, messages: list[dict[str, Any]], reply: dict[str, Any]) -> Call:
    return Call(id=f"c{i}", session_id="s1", index=i, dialect="chat",
                request={"model": "policy", "messages": messages},
                response={"choices": [{"index": 0, "message": reply,
                                       "finish_reason": "tool_calls" if reply.get("tool_calls")
                                       else "stop"}],
                          "usage": {"prompt_tokens": 10, "completion_tokens": 3}},
                finish_reason="tool_calls" if reply.get("tool_calls") else "stop",
                started_at=100.0 + i, finished_at=100.5 + i)


def _solve_sum_calls(answer: str = "The sum is 60.") -> list[Call]:
    system = {"role": "system", "content": "You are an agent."}
    user = {"role": "user", "content": "numbers.txt holds ..."}
    tool_call = {"id": "call_1", "type": "function",
                 "function": {"name": "shell", "arguments": json.dumps(
                     {"command": "awk '{s += $1} END {print s}' numbers.txt > sum.txt"})}}
    first = _call(0, [system, user], {"role": "assistant", "content": None,
                                      "tool_calls": [tool_call]})
    second = _call(1, [system, user, {"role": "assistant", "content": None,
                                      "tool_calls": [tool_call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "60"}],
                   {"role": "assistant", "content": answer})
    return [first, second]


def _env(**options: Any) -> ClawEnvironment:
    return ClawEnvironment(path=str(DATA), **options)


def _task(env: ClawEnvironment, task_id: str) -> Task:
    return next(t for t in env.tasks() if t.id == task_id)


def _prepared(env: ClawEnvironment, task: Task, ws: Path) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    env.prepare(task, ws)
    return ws


# -- loading ---------------------------------------------------------------------------------

def test_broken_tasks_are_skipped_with_their_reason_and_the_rest_load() -> None:
    tasks = load_tasks(DATA)
    assert [t.id for t in tasks] == ["task_00001_sum", "task_00002_report", "task_00003_explain"]
    assert {s.reason for s in tasks.skipped} == {UNREADABLE}
    reasons = {s.id: s.detail for s in tasks.skipped}
    assert "asset file 'nowhere.csv' not found" in reasons["task_00004_missing_asset"]
    assert "assets/task_00004_missing_asset/nowhere.csv" in reasons["task_00004_missing_asset"]
    assert "do not compile" in reasons["task_00005_bad_code"]
    assert "outside the workspace" in reasons["task_00006_escape"]
    with pytest.raises(TaskLoadError, match="no task could be read"):
        load_tasks(DATA / "tasks" / "task_00005_bad_code.md")


def test_front_matter_sections_and_code_are_read_as_the_benchmark_means_them() -> None:
    by_id = {t.id: t for t in load_tasks(DATA)}
    total = by_id["task_00001_sum"]
    assert total.qwenclawbench and total.qwenclawbench.grading_type == "automated"
    assert total.prompt.startswith("numbers.txt holds one integer per line.")
    assert total.category == "Data Analysis" and total.timeout_s == 120
    code = total.qwenclawbench.code or ""
    # The fence inside the regex and the `## ` comment did not cut the code short.
    assert "FENCE_RE = re.compile(r'```" in code and code.rstrip().endswith("}")
    assert "## Helpers" in code
    report = by_id["task_00002_report"].qwenclawbench
    assert report and report.weights == {"automated": 0.4, "llm_judge": 0.6}
    assert report.judge_rubric.startswith("### Report quality")
    explain = by_id["task_00003_explain"].qwenclawbench
    assert explain and explain.code is None  # llm_judge: nothing automated
    # No rubric section: the grading criteria become the judge's rubric.
    assert explain.judge_rubric == "- The answer is one sentence\n- The answer is accurate"


def test_tracing_fields_and_code_extraction_edge_cases() -> None:
    front = "id: x\nsource_query: a: b\n  c: [d\nsource_line_number: 3\nname: y"
    assert strip_tracing_fields(front) == "id: x\nname: y"
    assert sections("## A\none\n```\n## not a header\n```\n## B\ntwo") == {
        "A": "one\n```\n## not a header\n```", "B": "two"}
    # A line that is only a fence inside a string: the first close that compiles wins.
    text = '```python\nT = """\n```\n"""\ndef grade(t, w):\n    return {}\n```'
    assert grading_code(text, "t") == 'T = """\n```\n"""\ndef grade(t, w):\n    return {}'
    assert grading_code("no code here", "t") is None
    with pytest.raises(TaskLoadError, match="never closed"):
        grading_code("```python\ndef grade(t, w):\n    return {}", "t")


def test_workspace_gets_the_listed_files_only(tmp_path: Path) -> None:
    env = _env(scoring="automated")
    ws = _prepared(env, _task(env, "task_00001_sum"), tmp_path / "sum")
    assert (ws / "numbers.txt").read_text() == "10\n20\n30\n"  # assets/<id>/<source>
    assert (ws / "docs/README.txt").read_text() == "shared docs\n"  # assets/<source>
    # The task's asset folder holds an answer key that is not a workspace file.
    assert not list(ws.rglob("answer_key*"))
    ws2 = _prepared(env, _task(env, "task_00002_report"), tmp_path / "report")
    assert (ws2 / "inbox/notes.md").read_text() == "alpha\nbeta\n"
    assert json.loads((ws2 / "config/settings.json").read_text()) == {"uppercase": True}


def test_data_paths_name_exactly_the_assets_and_a_missing_one(tmp_path: Path) -> None:
    env = _env(scoring="automated")
    task = _task(env, "task_00001_sum")
    paths = env.data_paths(task)
    assert sorted(p.name for p in paths) == ["README.txt", "numbers.txt"]
    assert all(p.is_absolute() and p.is_file() for p in paths)
    moved = Task.model_validate(json.loads(task.model_dump_json()))
    moved.data["claw"]["root"] = str(tmp_path / "gone")
    with pytest.raises(OpenforgeError, match=r"data file .*gone/assets/task_00001_sum/data/"
                                             r"numbers.txt is missing"):
        env.data_paths(moved)
    with pytest.raises(OpenforgeError, match="numbers.txt is missing"):
        env.prepare(moved, tmp_path / "ws")


# -- skipping what cannot be scored ----------------------------------------------------------

def test_without_a_judge_judge_tasks_are_listed_and_skipped(capsys: pytest.CaptureFixture[str],
                                                            judge: JudgeStandIn) -> None:
    env = _env()
    assert [t.id for t in env.tasks()] == ["task_00001_sum"]
    err = capsys.readouterr().err
    assert "qwenclawbench: 6 tasks, 1 runnable, 5 skipped:" in err
    assert f"  3 skipped: {UNREADABLE} [task_00004_missing_asset (" in err
    assert "asset file 'nowhere.csv' not found" in err  # each task's own detail
    assert "2 skipped: needs an LLM judge" not in err  # two different grading types
    assert "1 skipped: needs an LLM judge (grading_type hybrid)" in err
    assert "1 skipped: needs an LLM judge (grading_type llm_judge)" in err
    assert "task_00002_report" in err and "task_00004_missing_asset" in err
    automated = _env(scoring="automated")
    assert [t.id for t in automated.tasks()] == ["task_00001_sum", "task_00002_report"]
    assert "llm_judge task: it has no automated checks" in capsys.readouterr().err
    judged = _env(**_judge_options(judge))
    assert len(list(judged.tasks())) == 3


# -- the automated grader --------------------------------------------------------------------

def test_do_nothing_scores_low_and_the_right_work_passes(tmp_path: Path) -> None:
    env = _env()
    task = _task(env, "task_00001_sum")
    ws = _prepared(env, task, tmp_path / "idle")
    state = env.final_state(task, ws)
    state["final_answer"] = "Done."
    idle = env.check(task, ws, state)
    assert not idle.passed and idle.details["category"] == "wrong_final_state"
    # Only the boolean "no code fence" criterion holds for an idle agent: 1 of 5.
    assert idle.score == pytest.approx(0.2)
    assert idle.details["automated_breakdown"]["no_code_fence_in_answer"] == 1.0
    assert idle.details["transcript_source"] == "final answer"

    ws = _prepared(env, task, tmp_path / "work")
    (ws / "sum.txt").write_text("60\n")
    state = env.final_state(task, ws)
    verdict = GraderReward().score(task, env, ws, state, _solve_sum_calls())
    assert verdict.passed and verdict.score == 1.0, verdict.details
    assert verdict.details["transcript_source"] == "recorded calls"
    assert verdict.details["breakdown"]["automated.read_the_data"] == 1.0
    # Without the calls the grader cannot see the tool call: 4 of 5, not a pass.
    state["final_answer"] = "The sum is 60."
    partial = env.check(task, ws, state)
    assert partial.score == pytest.approx(0.8) and not partial.passed


def test_grader_failures(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    raising = "def grade(transcript, workspace_path):\n    return {'a': 1.0} + 1\n"
    result = qg.run_grader(raising, [], ws, 60)
    assert result["kind"] == "exception" and "TypeError" in result["error"]
    missing = "import no_such_module_here\ndef grade(t, w):\n    return {}\n"
    assert qg.run_grader(missing, [], ws, 60)["kind"] == "grader_import"
    # The agent's own module failing to import is the agent's doing: an exception, scored 0.
    (ws / "agent_mod.py").write_text("import no_such_module_either\n")
    importing = ("def grade(t, w):\n    import sys\n    sys.path.insert(0, w)\n"
                 "    import agent_mod\n    return {}\n")
    assert qg.run_grader(importing, [], ws, 60)["kind"] == "exception"
    hanging = "def grade(t, w):\n    import time\n    time.sleep(60)\n"
    assert qg.run_grader(hanging, [], ws, 1)["kind"] == "timeout"
    noisy = ("def grade(t, w):\n    print('not the result')\n"
             "    return {'x': True, 'y': 0, 'z': 'n/a', 'w': '0.5'}\n")
    scores = qg.run_grader(noisy, [], ws, 60)["scores"]
    assert scores == {"x": True, "y": 0, "z": "n/a", "w": "0.5"}
    assert qg.mean_score(scores) == 0.5  # booleans count, strings do not
    assert qg.as_floats(scores) == {"x": 1.0, "y": 0.0, "w": 0.5}


def test_grader_runs_sandboxed_when_bubblewrap_works(tmp_path: Path) -> None:
    if check_sandbox.usable_bwrap() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap; .ci/run does)")
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = Path(tempfile.mkdtemp(dir="/var/tmp")) / "outside.txt"  # not under /tmp
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    code = ("def grade(t, w):\n    import os, socket\n    out = {}\n"
            f"    try:\n        open({str(outside)!r}, 'w').write('x')\n        out['wrote'] = 1\n"
            "    except OSError:\n        out['wrote'] = 0\n"
            "    open(os.path.join(w, 'inside.txt'), 'w').write('ok')\n"
            f"    try:\n        socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
            "        out['net'] = 1\n    except OSError:\n        out['net'] = 0\n"
            "    return out\n")
    try:
        result = qg.run_grader(code, [], ws, 60)
    finally:
        listener.close()
        shutil.rmtree(outside.parent)
    # Read-only outside the workspace, and no way to the host's network.
    assert result["scores"] == {"wrote": 0, "net": 0}
    assert (ws / "inside.txt").read_text() == "ok"


def test_a_bubblewrap_that_cannot_sandbox_here_falls_back_to_a_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside another sandbox bwrap exists but cannot mount /proc: probed with the grader's
    own flags, it is not used, and the grader still runs (as a plain process)."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Cannot mount proc' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(check_sandbox, "bwrap_path", lambda: str(fake))
    check_sandbox.usable_bwrap.cache_clear()
    try:
        assert check_sandbox.usable_bwrap() is None
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "json.py").write_text(FORGER)  # nor does the workspace shadow a module there
        assert qg.run_grader("def grade(t, w):\n    return {'ok': 1}\n", [], ws, 60) == {
            "ok": True, "scores": {"ok": 1}}
    finally:
        check_sandbox.usable_bwrap.cache_clear()


def test_a_grader_that_cannot_run_here_is_an_infra_error(tmp_path: Path) -> None:
    env = _env()
    task = _task(env, "task_00001_sum")
    spec = task.data["claw"]["qwenclawbench"]
    spec["code"] = "import no_such_module_here\n" + spec["code"]
    ws = _prepared(env, task, tmp_path / "ws")
    with pytest.raises(GraderError, match="needs the Python module 'no_such_module_here'"):
        env.check(task, ws, env.final_state(task, ws))


# -- what the agent can do to its grader -----------------------------------------------------

def _grader_prepended(task: Task, code: str) -> None:
    spec = task.data["claw"]["qwenclawbench"]
    spec["code"] = code + spec["code"]


def test_a_workspace_module_cannot_shadow_what_the_grader_imports(tmp_path: Path) -> None:
    env = _env()
    task = _task(env, "task_00001_sum")
    ws = _prepared(env, task, tmp_path / "ws")
    for name in ("traceback.py", "json.py", "runpy.py"):
        (ws / name).write_text(FORGER)
    state = env.final_state(task, ws)
    state["final_answer"] = "Done."
    verdict = env.check(task, ws, state)
    # The idle agent's 1 of 5, as without the planted files: the forged 1.0 was never read.
    assert verdict.score == pytest.approx(0.2), verdict.details
    assert "grader_error" not in verdict.details


def test_a_module_the_grader_looks_for_in_the_workspace_is_the_agents_to_write(
        tmp_path: Path) -> None:
    env = _env(agent_code_in_grader="score")  # its grader imports the agent's module
    task = _task(env, "task_00001_sum")
    _grader_prepended(task, "import sys\n"
                                 "def _solution(w):\n"
                                 "    sys.path.insert(0, w)\n"
                                 "    import solution\n"
                                 "    return solution.ANSWER\n")
    spec = task.data["claw"]["qwenclawbench"]
    spec["code"] = spec["code"].replace('path = os.path.join(workspace_path, "sum.txt")',
                                        '_solution(workspace_path)\n'
                                        '    path = os.path.join(workspace_path, "sum.txt")')
    ws = _prepared(env, task, tmp_path / "missing")
    # Not writing solution.py is the agent's failure: a 0 with the reason, not an error.
    verdict = env.check(task, ws, env.final_state(task, ws))
    assert verdict.score == 0.0 and not verdict.passed
    assert verdict.details["grader_error"].startswith("workspace_import: ")
    assert "'solution'" in verdict.details["grader_error"]
    ws = _prepared(env, task, tmp_path / "written")
    (ws / "solution.py").write_text("ANSWER = 60\n")
    (ws / "sum.txt").write_text("60\n")
    verdict = env.check(task, ws, env.final_state(task, ws))
    assert verdict.details["automated_breakdown"]["correct"] == 1.0, verdict.details
    assert str(ws / "solution.py") in verdict.details["agent_code_in_grader"]


def test_a_grader_process_the_agents_code_ends_scores_0(tmp_path: Path) -> None:
    """Agent code that ends the grader's process (os._exit in the module grade() imports, a
    script it runs that kills its parent) leaves no result: a 0 with the reason, never an
    error that leaves the rollout unscored."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text("import os\nos._exit(1)\n")
    (ws / "run.py").write_text("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
    importing = ("def grade(t, w):\n    import sys\n    sys.path.insert(0, w)\n"
                 "    import solution\n    return {'a': 1.0}\n")
    result = qg.run_grader(importing, [], ws, 60)
    assert result["kind"] == "died" and "ran workspace code" in result["error"], result
    assert str(ws / "solution.py") in result["error"]
    running = ("def grade(t, w):\n    import subprocess, sys\n"
               "    subprocess.run([sys.executable, 'run.py'], cwd=w)\n    return {'a': 1.0}\n")
    result = qg.run_grader(running, [], ws, 60)
    assert result["kind"] == "died" and "started a program" in result["error"], result
    score, criteria, error, ran = qg.automated(
        qg.QwenClawBenchGrading(grading_type="automated", code=running), [], ws,
        qg.ScoringOptions(grader_timeout_s=60))
    assert (score, criteria, ran) == (0.0, {}, None) and error and error.startswith("died: ")
    # A workspace the agent closed to everyone (the grader cannot even start in it): a 0 too.
    ws.chmod(0)
    try:
        result = qg.run_grader(running, [], ws, 60)
    finally:
        ws.chmod(0o755)
    assert result["kind"] == "exception" and "closed to the grader" in result["error"]
    # A grader whose process ends before it touched anything of the agent's failed on its own.
    with pytest.raises(GraderError, match="before it touched anything of the agent's"):
        qg.run_grader("import os\nos._exit(3)\ndef grade(t, w):\n    return {}\n", [], ws, 60)


def test_a_program_the_grader_runs_cannot_read_the_nonce_from_its_memory(
        tmp_path: Path) -> None:
    """An agent script run by grade() (as the benchmark's graders run them) finds the job in
    its parent's memory, writes a result with the nonce on its parent's stdout and kills it:
    the grader process is not dumpable, so /proc/PARENT/mem and fd are closed to it."""
    if check_sandbox.usable_bwrap() is None:
        pytest.skip("bubblewrap is not installed: outside it the grader keeps this process's "
                    "capabilities (root's CAP_SYS_PTRACE opens /proc whatever the flag)")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "forge.py").write_text(
        "import os, re, signal\n"
        "pid = os.getppid()\n"
        "mem = open(f'/proc/{pid}/mem', 'rb')\n"
        "for line in open(f'/proc/{pid}/maps'):\n"
        "    start, end = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "    if 'rw' not in line.split()[1]:\n"
        "        continue\n"
        "    try:\n"
        "        mem.seek(start)\n"
        "        found = re.search(rb'\"nonce\": \"([0-9a-f]{32})\"', mem.read(end - start))\n"
        "    except (OSError, ValueError, OverflowError):\n"
        "        continue\n"
        "    if found:\n"
        "        with open(f'/proc/{pid}/fd/1', 'wb') as out:\n"
        "            out.write(found.group(1) + b' {\"ok\": true, \"scores\": {\"f\": 1.0}}\\n')\n"
        "        os.kill(pid, signal.SIGKILL)\n")
    code = ("def grade(t, w):\n    import subprocess, sys\n"
            "    done = subprocess.run([sys.executable, 'forge.py'], cwd=w, capture_output=True,"
            " text=True)\n"
            "    return {'real': 0.0, 'forge_failed': done.returncode != 0}\n")
    assert qg.run_grader(code, [], ws, 60) == {
        "ok": True, "scores": {"real": 0.0, "forge_failed": True}}


# -- a grader that runs the agent's code in its own process ----------------------------------

# The benchmark's task_00059 grades this way: the agent's module loaded by its path into the
# grader's own process.
LOADS_BY_PATH = (
    "import importlib.util\n"
    "def _load(w):\n"
    "    spec = importlib.util.spec_from_file_location('submission', os.path.join(w, 'calc.py'))\n"
    "    module = importlib.util.module_from_spec(spec)\n"
    "    spec.loader.exec_module(module)\n"
    "    return module\n")



def test_how_a_grader_runs_agent_code_in_its_process_is_read_from_its_source() -> None:
    assert qg.loads_code_in_process("import os\n" + LOADS_BY_PATH) == (
        "spec_from_file_location() at line 4")
    for code, how in [
            ("import sys\nsys.path.insert(0, '/w')\nimport solution\n", "sys.path.insert() at line 2"),
            ("import importlib\nm = importlib.import_module('solution')\n", "import_module() at line 2"),
            ("def grade(t, w):\n    exec(open(w + '/s.py').read())\n", "exec() at line 2"),
            ("m = __import__('solution')\n", "__import__() at line 1"),
            ("import runpy\nrunpy.run_path('/w/s.py')\n", "run_path() at line 2"),
            ("import ctypes\nctypes.CDLL('/w/lib.so')\n", "CDLL() at line 2"),
            ("import sys\nsys.path = ['/w'] + sys.path\n", "an assignment to sys.path at line 2"),
            ("import sys\nsys.path += ['/w']\n", "an assignment to sys.path at line 2")]:
        assert qg.loads_code_in_process(code) == how, code
    # A program it starts (task_00076 imports the agent's module in one), a regex, reading
    # the agent's source: nothing of the agent's runs in the grader's own process.
    program = ("import subprocess, sys\n"
               "def grade(t, w):\n"
               "    code = f'import sys\\nsys.path.insert(0, {w!r})\\nimport solution'\n"
               "    subprocess.run([sys.executable, '-c', code])\n"
               "    return {}\n")
    reading = ("import re\nR = re.compile('def ')\n"
               "def grade(t, w):\n    return {'defines': bool(R.search(open(w + '/s.py').read()))}\n")
    for code in (program, reading, "def grade(t, w) return {}\n"):
        assert qg.loads_code_in_process(code) is None
    assert all(qg.loads_code_in_process(t.qwenclawbench.code) is None
               for t in load_tasks(DATA) if t.qwenclawbench and t.qwenclawbench.code)


def _loading_task_set(tmp_path: Path) -> Path:
    """The fixture tasks, task_00001_sum's grader loading the agent's calc.py as task_00059
    does (one more criterion: its ANSWER)."""
    data = tmp_path / "qcb"
    shutil.copytree(DATA, data)
    md = data / "tasks" / "task_00001_sum.md"
    text = md.read_text().replace("import re\n", "import re\n" + LOADS_BY_PATH, 1)
    text = text.replace('        "correct": ', '        "answer": _load(workspace_path).ANSWER == 60,\n'
                                              '        "correct": ')
    md.write_text(text)
    return data


def test_a_task_whose_grader_runs_the_agents_module_is_skipped_unless_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _loading_task_set(tmp_path)
    assert [t.id for t in ClawEnvironment(path=str(data)).tasks()] == []
    err = capsys.readouterr().err
    assert ("1 skipped: its grader runs the agent's code in its own process "
            "(spec_from_file_location() at line 5), where that code could write any result: "
            "set environment_options.agent_code_in_grader=score") in err, err
    env = ClawEnvironment(path=str(data), agent_code_in_grader="score")
    task = _task(env, "task_00001_sum")
    # Scored as the benchmark scores it, and labelled: an honest module...
    ws = _prepared(env, task, tmp_path / "honest")
    (ws / "calc.py").write_text("ANSWER = 60\n")
    (ws / "sum.txt").write_text("60\n")
    verdict = GraderReward().score(task, env, ws, env.final_state(task, ws), _solve_sum_calls())
    assert verdict.passed and verdict.details["automated_breakdown"]["answer"] == 1.0
    assert verdict.details["agent_code_in_grader"] == f"ran workspace code: {ws / 'calc.py'}"
    # ...and why that is not the default: a module that writes its own result passes a task
    # it did nothing for.
    ws = _prepared(env, task, tmp_path / "forger")
    (ws / "calc.py").write_text(IN_PROCESS_FORGER)
    verdict = env.check(task, ws, env.final_state(task, ws))
    assert verdict.passed and verdict.details["automated_breakdown"] == {"forged": 1.0}
    assert "calc.py" in verdict.details["agent_code_in_grader"]


def test_agent_code_a_grader_runs_unseen_in_its_source_is_never_a_score(tmp_path: Path) -> None:
    """A grader whose source hides how it loads the agent's module: the runner tells the
    trusted side before that code runs, and under the default the result is not taken (a
    plugin error, as the forger's perfect result would otherwise stand)."""
    env = _env()
    task = _task(env, "task_00001_sum")
    hidden = LOADS_BY_PATH.replace("importlib.util.spec_from_file_location(",
                                   "getattr(importlib.util, 'spec_from_' + 'file_location')(")
    hidden = hidden.replace("spec.loader.exec_module(module)",
                            "getattr(spec.loader, 'exec_' + 'module')(module)")
    assert qg.loads_code_in_process(hidden) is None
    _grader_prepended(task, "import os\n" + hidden)
    spec = task.data["claw"]["qwenclawbench"]
    spec["code"] = spec["code"].replace('    path = os.path.join(workspace_path, "sum.txt")',
                                        '    _load(workspace_path)\n'
                                        '    path = os.path.join(workspace_path, "sum.txt")')
    ws = _prepared(env, task, tmp_path / "ws")
    (ws / "calc.py").write_text(IN_PROCESS_FORGER)
    with pytest.raises(GraderError, match=r"ran the agent's code in its own process \(ran "
                                          r"workspace code: .*calc.py\), where that code could "
                                          r"write any result: not scored"):
        env.check(task, ws, env.final_state(task, ws))


def test_compiled_code_from_the_workspace_is_seen_whatever_file_it_names(tmp_path: Path) -> None:
    """A sourceless module whose code claims to be the grader's own (`<automated checks>`)
    or a library file: its opening is told, before it runs."""
    import py_compile

    ws = tmp_path / "ws"
    ws.mkdir()
    source = tmp_path / "solution_src.py"
    source.write_text("ANSWER = 60\n")
    importing = ("def grade(t, w):\n    import sys\n    sys.path.insert(0, w)\n"
                 "    import solution\n    return {'a': float(solution.ANSWER == 60)}\n")
    for claimed in (qg.qwenclawbench_runner.GRADER_FILE, "/usr/lib/python3/json/__init__.py"):
        py_compile.compile(str(source), cfile=str(ws / "solution.pyc"), dfile=claimed,
                           doraise=True)
        result = qg.run_grader(importing, [], ws, 60)
        assert result["scores"] == {"a": 1.0}, result
        assert result["agent_code"] == f"ran workspace code: opened compiled code {ws / 'solution.pyc'}"
    # Reading the agent's source is no running of it.
    (ws / "solution.pyc").unlink()
    (ws / "solution.py").write_text("ANSWER = 60\n")
    reading = "def grade(t, w):\n    return {'a': float('60' in open(w + '/solution.py').read())}\n"
    assert qg.run_grader(reading, [], ws, 60) == {"ok": True, "scores": {"a": 1.0}}


# -- transcripts -----------------------------------------------------------------------------

def test_recorded_calls_become_openclaw_session_events() -> None:
    events = openclaw_events.from_calls(_solve_sum_calls(), cwd="/ws")
    assert events is not None
    assert events[0]["type"] == "session" and events[0]["cwd"] == "/ws"
    messages = [e["message"] for e in events[1:]]
    assert all(e["type"] == "message" for e in events[1:])
    assert [m["role"] for m in messages] == ["user", "assistant", "toolResult", "assistant"]
    assert messages[0]["content"] == "numbers.txt holds ..."  # user content: a string
    call = messages[1]["content"][0]
    assert call["type"] == "toolCall" and call["name"] == "shell"
    assert call["arguments"] == {"command": "awk '{s += $1} END {print s}' numbers.txt > sum.txt"}
    assert messages[1]["stopReason"] == "toolUse" and messages[1]["api"] == "openai-completions"
    assert messages[2] == {"role": "toolResult", "toolCallId": "call_1", "toolName": "shell",
                           "content": [{"type": "text", "text": "60"}], "isError": False,
                           "timestamp": messages[2]["timestamp"]}
    assert messages[3]["content"] == [{"type": "text", "text": "The sum is 60."}]
    assert messages[3]["stopReason"] == "stop" and messages[3]["usage"]["totalTokens"] == 13
    assert [e["parentId"] for e in events[2:]] == [e["id"] for e in events[1:-1]]


def test_other_wire_dialects_become_the_same_events() -> None:
    anthropic = Call(id="a", session_id="s", dialect="messages",
                     request={"model": "m", "max_tokens": 10,
                              "messages": [{"role": "user", "content": "hi"}]},
                     response={"content": [{"type": "thinking", "thinking": "hmm"},
                                           {"type": "text", "text": "ok"},
                                           {"type": "tool_use", "id": "t1", "name": "exec",
                                            "input": {"command": "ls"}}]})
    responses = Call(id="r", session_id="s", dialect="responses",
                     request={"model": "m", "input": "hi"},
                     response={"output": [{"type": "message", "content": [
                         {"type": "output_text", "text": "ok"}]},
                         {"type": "function_call", "call_id": "t1", "name": "exec",
                          "arguments": "{\"command\": \"ls\"}"}]})
    for call in (anthropic, responses):
        events = openclaw_events.from_calls([call])
        assert events is not None
        assert openclaw_events.assistant_turns(events) == [
            ("ok", [("exec", json.dumps({"command": "ls"}))])]
    thinking = (openclaw_events.from_calls([anthropic]) or [])[-1]["message"]["content"][0]
    assert thinking == {"type": "thinking", "thinking": "hmm"}


def test_openclaw_own_transcript_is_used_only_when_it_agrees_with_the_calls(tmp_path: Path) -> None:
    env = _env()
    task = _task(env, "task_00001_sum")
    ct = env.claw_tasks()[0]
    calls = _solve_sum_calls()
    own = openclaw_events.from_calls(calls) or []
    own[1]["message"]["content"] = "numbers.txt holds ... (as OpenClaw stored it)"
    state = {"harness_transcript": {"ok": True, "session_events": own}}
    events, source = qg.transcript(ct, tmp_path, state, calls)
    assert source == "openclaw" and events is own
    forged = json.loads(json.dumps(own))
    forged[-1]["message"]["content"] = [{"type": "text", "text": "I read numbers.txt: 60"}]
    events, source = qg.transcript(ct, tmp_path, {"harness_transcript": {
        "session_events": forged}}, calls)
    assert source.startswith("recorded calls (openclaw's own transcript disagreed")
    assert events[-1]["message"]["content"] == [{"type": "text", "text": "The sum is 60."}]
    assert task.id == ct.id


# -- the judge, the hybrid weighting and the penalty -----------------------------------------

def _report_done(env: ClawEnvironment, tmp_path: Path, right: bool) -> tuple[Task, Path]:
    task = _task(env, "task_00002_report")
    ws = _prepared(env, task, tmp_path / ("right" if right else "wrong"))
    (ws / "report.md").write_text("ALPHA\nBETA\n" if right else "alpha\n")
    return task, ws


def _report_calls() -> list[Call]:
    call = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": json.dumps(
        {"command": "cat inbox/notes.md"})}}
    user = {"role": "user", "content": "inbox/notes.md lists topics"}
    return [_call(0, [user], {"role": "assistant", "content": None, "tool_calls": [call]}),
            _call(1, [user, {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c1", "content": "alpha\nbeta\n"}],
                  {"role": "assistant", "content": "Wrote report.md: 2 topics."})]


def test_hybrid_weighting_and_the_penalty(tmp_path: Path, judge: JudgeStandIn,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QCB_JUDGE_KEY", "judge-secret")
    env = _env(**_judge_options(judge, judge_api_key_env="QCB_JUDGE_KEY"))
    judge.replies += [
        (200, 'Here you go:\n```json\n{"scores": {"quality": {"score": 0.5, "weight": 1}}, '
              '"total": 0.5, "notes": "fine"}\n```'),
        (200, '{"criteria_scores": {"quality": 1.0}, "justification": "x"}')]
    task, ws = _report_done(env, tmp_path, right=True)
    good = GraderReward().score(task, env, ws, env.final_state(task, ws), _report_calls())
    assert good.details["automated"] == 1.0 and good.details["llm_judge"] == 0.5
    assert good.score == pytest.approx(0.4 * 1.0 + 0.6 * 0.5) and not good.passed
    assert good.details["breakdown"] == {"automated.report_written": 1.0,
                                         "automated.read_notes": 1.0, "automated.counted": 1.0,
                                         "llm_judge.quality": 0.5}
    request = judge.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["body"]["model"] == "judge-1"
    assert request["auth"] == "Bearer judge-secret" and request["body"]["temperature"] == 0.0
    prompt = request["body"]["messages"][0]["content"]
    assert "### Report quality" in prompt and "The agent reads the notes" in prompt
    assert 'Tool: shell({"command": "cat inbox/notes.md"})' in prompt
    assert "Result: {'type': 'text', 'text': 'alpha\\nbeta\\n'}" in prompt
    assert good.details["judge_call"]["answer"].startswith("Here you go")

    # Automated 1/3 < 0.75: the judge's perfect score is dropped (penalised), kept in
    # score_simple.
    task, ws = _report_done(env, tmp_path, right=False)
    bad = GraderReward().score(task, env, ws, env.final_state(task, ws), None)
    assert bad.details["llm_judge"] == 1.0 and bad.details["automated"] == pytest.approx(0.0)
    assert bad.score == 0.0
    assert bad.details["score_simple"] == pytest.approx(0.6)


def test_perfect_hybrid_passes_and_llm_judge_tasks_use_the_judge_alone(
        tmp_path: Path, judge: JudgeStandIn) -> None:
    env = _env(**_judge_options(judge))
    judge.replies += [(200, '{"scores": {"quality": 1.0}, "total": 1.0}'),
                      (200, "Overall score: 0.8")]
    task, ws = _report_done(env, tmp_path, right=True)
    perfect = GraderReward().score(task, env, ws, env.final_state(task, ws), _report_calls())
    assert perfect.score == 1.0 and perfect.passed and perfect.details["category"] is None
    explain = _task(env, "task_00003_explain")
    ws = _prepared(env, explain, tmp_path / "explain")
    state = env.final_state(explain, ws)
    state["final_answer"] = "A checksum is a small value computed from data to detect errors."
    verdict = env.check(explain, ws, state)
    assert verdict.score == pytest.approx(0.8) and "automated" not in verdict.details
    assert verdict.details["llm_judge_breakdown"] == {}


def test_a_failing_or_unreadable_judge_is_an_error_never_a_zero(
        tmp_path: Path, judge: JudgeStandIn) -> None:
    env = _env(**_judge_options(judge))
    task, ws = _report_done(env, tmp_path, right=True)
    judge.replies += [(503, "overloaded"), (200, '{"total": 0.5}')]
    flaky = JudgeEndpoint(base_url=_judge_options(judge)["judge_base_url"], model="m", retries=2)
    assert flaky.ask("hi") == '{"total": 0.5}'  # retried after the 503
    judge.replies.append((503, "overloaded"))
    once = JudgeEndpoint(base_url=flaky.base_url, model="m", retries=1)
    with pytest.raises(JudgeError, match="failed 1 times; last: HTTP 503"):
        once.ask("hi")
    judge.replies.append((200, "I cannot grade this."))
    with pytest.raises(JudgeError, match="holds no score"):
        env.check(task, ws, env.final_state(task, ws))
    judge.replies.append((400, "bad model"))
    with pytest.raises(JudgeError, match="refused the request: HTTP 400"):
        env.check(task, ws, env.final_state(task, ws))
    with pytest.raises(OpenforgeError, match="session URL"):
        _env(judge_base_url="http://127.0.0.1:1/s/tok/v1", judge_model="m")
    with pytest.raises(OpenforgeError, match="set both judge_base_url and judge_model"):
        _env(judge_model="m")
    dead = JudgeEndpoint(base_url="http://127.0.0.1:9/v1", model="m", retries=1)
    with pytest.raises(JudgeError, match="ConnectError"):
        dead.ask("hi")


def test_claw_judge_points_benchmark_tasks_at_the_benchmarks_own_judge(tmp_path: Path) -> None:
    from openforge_claw.rewards import JudgeReward

    env = _env(scoring="automated")
    task = _task(env, "task_00001_sum")
    with pytest.raises(JudgeError, match="score it with --reward claw-grader"):
        JudgeReward(model="openai/judge").score(task, env, tmp_path, {}, None)


def test_automated_only_scoring_is_labelled(tmp_path: Path) -> None:
    env = _env(scoring="automated")
    task, ws = _report_done(env, tmp_path, right=True)
    verdict = GraderReward().score(task, env, ws, env.final_state(task, ws), _report_calls())
    assert verdict.passed and verdict.details["scoring"] == "automated-only"
    assert "llm_judge" not in verdict.details
    sum_task = _task(env, "task_00001_sum")
    ws = _prepared(env, sum_task, tmp_path / "sum")
    assert env.check(sum_task, ws, env.final_state(sum_task, ws)).details["scoring"] == "benchmark"


def test_judge_answers_are_read_like_the_benchmark_reads_them() -> None:
    assert qg.parse_judge('x {"a": 1} y {"scores": {"c": 0.4}, "total": 0.3} z {"b": 2}') == {
        "scores": {"c": 0.4}, "total": 0.3, "notes": ""}
    assert qg.parse_judge('{"score": 0.7, "reasoning": "ok"}') == {
        "scores": {}, "total": 0.7, "notes": "ok"}
    assert qg.parse_judge('{"scores": {"a": 0.2, "b": "0.6"}}')["total"] == pytest.approx(0.4)
    assert qg.parse_judge("Final score: 1.0")["total"] == 1.0
    penalised, simple = qg.combine(
        load_tasks(DATA)[1].qwenclawbench, 0.74, 1.0)  # type: ignore[arg-type]
    assert penalised == pytest.approx(0.4 * 0.74) and simple == pytest.approx(0.4 * 0.74 + 0.6)


# -- through `openforge run`: gateway, local executor, the mini agent, the judge -------------

def _run(script: str, runs: Path, judge_url: str, k: int = 1):
    from openforge.config import EngineConfig, RunConfig
    from openforge.runner import read_results, run_from_config

    config = RunConfig(
        harness="mini", harness_options={"max_steps": 6}, environment="claw",
        environment_options={"path": str(DATA), "judge_base_url": judge_url,
                             "judge_model": "judge-1"},
        reward="claw-grader", concurrency=3, timeout_s=120, k=k, runs_dir=runs,
        engine=EngineConfig(name="scripted", options={"script": str(DATA.parent / script)}))
    result = run_from_config(config)
    return result, {r.task_id: r for r in read_results(result.run_dir)}


def test_openforge_run_scores_benchmark_tasks_with_grader_and_judge(
        tmp_path: Path, judge: JudgeStandIn) -> None:
    judge.replies += [(200, '{"scores": {"quality": 1.0}, "total": 1.0}')] * 12
    url = _judge_options(judge)["judge_base_url"]
    right, records = _run("qwenclawbench_solutions.yaml", tmp_path / "right", url, k=2)
    assert set(records) == {"task_00001_sum", "task_00002_report", "task_00003_explain"}
    assert all(r.status == "ok" and r.passed and r.reward == 1.0 for r in records.values()), {
        t: (r.status, r.error, r.reward_details) for t, r in records.items()}
    summed = records["task_00001_sum"].reward_details
    assert summed["transcript_source"] == "recorded calls"
    assert summed["breakdown"]["automated.read_the_data"] == 1.0  # the tool call, seen in events
    report = records["task_00002_report"].reward_details
    assert report["score_simple"] == 1.0 and report["breakdown"]["llm_judge.quality"] == 1.0
    summary = json.loads((right.run_dir / "report.json").read_text())
    assert summary["pass_at_k"] == {"1": 1.0, "2": 1.0} and summary["pass_hat_k"]["2"] == 1.0

    _, wrong = _run("qwenclawbench_wrong.yaml", tmp_path / "wrong", url)
    assert all(r.status == "ok" for r in wrong.values())
    assert not wrong["task_00001_sum"].passed and not wrong["task_00002_report"].passed
    # The llm_judge task is the judge's alone (this stand-in gives everything 1.0; the
    # benchmark's transcript summary shows the judge tool calls, not the answer text).
    assert wrong["task_00003_explain"].reward_details["llm_judge"] == 1.0
    # Automated 0.2 < 0.75: the judge's 1.0 does not count (penalised hybrid score).
    assert wrong["task_00002_report"].reward == pytest.approx(0.0)
    assert wrong["task_00002_report"].reward_details["score_simple"] == pytest.approx(0.6)
    assert wrong["task_00001_sum"].reward == pytest.approx(0.4)  # 2 of 5 criteria


@pytest.mark.e2e
def test_openclaw_runs_benchmark_tasks_and_its_own_transcript_is_graded(tmp_path: Path) -> None:
    """The real OpenClaw (npm): its session events reach the grader (they agree with the
    recorded calls), right scripts pass and wrong ones fail."""
    pytest.importorskip("openforge_openclaw",
                        reason="pip install ./plugins/openforge-openclaw (nox -s e2e does)")
    from openforge.config import EngineConfig, RunConfig
    from openforge.runner import read_results, run_from_config

    results = {}
    for name in ("qwenclawbench_solutions.yaml", "qwenclawbench_wrong.yaml"):
        script = tmp_path / name  # OpenClaw's shell tool is `exec`
        script.write_text((DATA.parent / name).read_text().replace("name: shell", "name: exec"))
        config = RunConfig(
            harness="openclaw", environment="claw", reward="claw-grader", concurrency=2,
            environment_options={"path": str(DATA), "scoring": "automated"},
            tasks=["task_00001_sum", "task_00002_report"], timeout_s=240,
            runs_dir=tmp_path / f"runs-{name}", engine=EngineConfig(name="scripted",
                                                          options={"script": str(script)}))
        results[name] = {r.task_id: r for r in read_results(run_from_config(config).run_dir)}
    right, wrong = results.values()
    assert all(r.status == "ok" and r.passed for r in right.values()), {
        t: (r.status, r.error, r.reward_details) for t, r in right.items()}
    assert all(r.reward_details["transcript_source"] == "openclaw" for r in right.values())
    assert right["task_00001_sum"].reward_details["breakdown"]["automated.read_the_data"] == 1.0
    assert all(r.status == "ok" and not r.passed for r in wrong.values())
