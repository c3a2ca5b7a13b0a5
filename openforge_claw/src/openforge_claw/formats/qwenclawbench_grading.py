"""Scoring a QwenClawBench task the benchmark's way.

- automated: the task's own `grade(transcript, workspace_path)` runs (its own process,
  in the checks' sandbox when bubblewrap works here (`check_sandbox`: openforge's
  allowlisted view, the workspace writable, private /tmp, no network, no capabilities),
  else in a fresh sandbox of the attempt (`openforge.sandbox.verifier`); a hard timeout)
  on the final workspace and the transcript in OpenClaw's session-event format
  (`openclaw_events.py`). Its criterion dict is kept; the score is
  the mean of its numeric values.
- llm_judge: a judge model (`environment_options.judge_base_url` / `judge_model`, any
  OpenAI-compatible endpoint) scores the rubric; its per-criterion dict is kept.
- hybrid: w_a * s_a + w_l * s_l * 1[s_a >= 0.75], divided by w_a + w_l (the benchmark's
  default, penalised scoring; weights from `grading_weights`, default 0.5 / 0.5); the
  plain weighted mean is kept as `score_simple`.
- passed: a perfect score (>= 1.0), the benchmark's definition of a pass in pass@k / pass^k.

Without a judge, the judge-dependent tasks cannot be scored the benchmark's way: the
environment lists and skips them (`unscorable`, `tasks.report_skipped`) unless
`environment_options.scoring` is `automated`, which scores every task by its automated
checks alone (labelled so in the details). A grader that raises scores 0 (as in the
benchmark) with the error in the details, and so does every other failure the agent can
cause (`automated`, `_result`); a grader that cannot run here through no doing of the
agent (a module its Python lacks, a process that dies before it touched anything of the
agent's: `GraderError`) or a judge that fails (`JudgeError`) is a `plugin_error`, never a
0.

A grader that runs the agent's code in its own process (imports or execs the agent's
module: `loads_code_in_process` reads it from the grader's source) gives a result that code
could have written, with any score: such a task is listed and skipped unless
`environment_options.agent_code_in_grader` is `score` (then scored as the benchmark does,
with `agent_code_in_grader` in the details). A grader whose source hid it, caught running
agent code by the runner's notes, is a `GraderError` under `skip`.

The transcript: OpenClaw's own session events when the harness was OpenClaw and they
agree with the recorded calls (what the policy said and called, turn by turn), else the
events built from the recorded calls, else the prompt and final answer alone.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Literal

from openforge.errors import OpenforgeError
from openforge.sandbox.protocol import scrub_env
from openforge.types import Call, RewardResult
from pydantic import BaseModel, ConfigDict, Field

from openforge_claw import check_sandbox, grader_process
from openforge_claw.formats import openclaw_events, qwenclawbench_runner
from openforge_claw.grader_process import GraderError
from openforge_claw.judge import JudgeEndpoint, JudgeError
from openforge_claw.tasks import ClawTask, QwenClawBenchGrading

AUTO_PENALTY_THRESHOLD = 0.75  # below it, the judge's part of a hybrid score is dropped
PERFECT = 1.0 - 1e-9
QCB_RUNNER = "openforge_claw.formats.qwenclawbench_runner"
_TEXT_LIMIT = 200  # how much of a tool result the judge's transcript summary shows


class ScoringOptions(BaseModel):
    """The claw environment's options that decide how QwenClawBench tasks are scored."""

    model_config = ConfigDict(extra="forbid")

    judge: JudgeEndpoint | None = None
    scoring: Literal["benchmark", "automated"] = "benchmark"
    grader_timeout_s: float = Field(default=600.0, gt=0)
    # `skip`: a task whose grader runs the agent's code in its own process is not scored
    # (that code could write any result); `score`: scored as the benchmark does, labelled.
    agent_code_in_grader: Literal["skip", "score"] = "skip"


def unscorable(task: ClawTask, options: ScoringOptions) -> str | None:
    """Why `task` cannot be scored with these options (it is then skipped), or None."""
    spec = task.qwenclawbench
    if spec is None:
        return None
    if options.scoring == "automated" and spec.code is None:
        return "llm_judge task: it has no automated checks to score alone"
    if (options.scoring == "benchmark" and spec.grading_type != "automated"
            and options.judge is None):
        return (f"needs an LLM judge (grading_type {spec.grading_type}): set "
                f"environment_options.judge_base_url and judge_model, or "
                f"environment_options.scoring=automated to score its automated checks alone")
    how = loads_code_in_process(spec.code) if spec.code is not None else None
    if how and options.agent_code_in_grader == "skip":
        return (f"its grader runs the agent's code in its own process ({how}), where that "
                f"code could write any result: set environment_options.agent_code_in_grader="
                f"score to score it as the benchmark does")
    return None


# The calls by which Python runs a file's code in the running process; a grader's own code
# that makes one may run the agent's module there. The builtins count only by their bare
# name (`re.compile` loads nothing).
_LOADERS = frozenset({"spec_from_file_location", "exec_module", "load_module", "import_module",
                      "run_path", "run_module", "SourceFileLoader", "SourcelessFileLoader",
                      "ExtensionFileLoader", "CDLL", "PyDLL", "LoadLibrary"})
_BUILTIN_LOADERS = frozenset({"exec", "eval", "compile", "__import__"})


def _is_sys_path(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


@functools.lru_cache(maxsize=512)  # asked again each time a rollout of the task is scored
def loads_code_in_process(code: str) -> str | None:
    """How the grader's own code can run the agent's code in its own process, as `what at
    line N` (the first by line), or None: a call of one of Python's ways to run a file's
    code (`_LOADERS`, `exec`, ...), or a change to `sys.path` (after which a plain `import`
    finds the agent's module). A program the grader starts as a process of its own (its
    code a string here) is not its own code: such a program can end its grader, not write
    its result. Read from the source, so the decision does not depend on what the agent
    did; the runner's notes (`CODE`) catch what the source hides."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None  # it cannot run at all: the grader's own error when it does
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in _LOADERS | _BUILTIN_LOADERS:
                found.append((node.lineno, f"{func.id}()"))
            elif isinstance(func, ast.Attribute) and func.attr in _LOADERS:
                found.append((node.lineno, f"{func.attr}()"))
            elif isinstance(func, ast.Attribute) and _is_sys_path(func.value):
                found.append((node.lineno, f"sys.path.{func.attr}()"))
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(target) for target in targets):
                found.append((node.lineno, "an assignment to sys.path"))
    if not found:
        return None
    line, what = min(found)
    return f"{what} at line {line}"


# -- the transcript --------------------------------------------------------------------------

def transcript(task: ClawTask, workspace: Path, final_state: dict[str, Any],
               calls: list[Call] | None) -> tuple[list[dict[str, Any]], str]:
    """(the OpenClaw session events grade() reads, where they came from)."""
    built = openclaw_events.from_calls(calls, cwd=str(workspace)) if calls else None
    harness = final_state.get("harness_transcript")
    own = harness.get("session_events") if isinstance(harness, dict) else None
    if isinstance(own, list) and own:
        if built is None:
            return own, "openclaw"
        if openclaw_events.assistant_turns(own) == openclaw_events.assistant_turns(built):
            return own, "openclaw"
        return built, "recorded calls (openclaw's own transcript disagreed with them)"
    if built is not None:
        return built, "recorded calls"
    return (openclaw_events.from_answer(task.prompt, str(final_state.get("final_answer") or ""),
                                        cwd=str(workspace)), "final answer")


# -- the automated checks --------------------------------------------------------------------

def run_grader(code: str, events: list[dict[str, Any]], workspace: Path,
               timeout_s: float) -> dict[str, Any]:
    """The runner's result for `code` on `workspace` (see `qwenclawbench_runner`).

    grade() may import or run what the agent wrote, so it never runs as a plain process of
    the trusted side: under bubblewrap in the checks' sandbox (`check_sandbox`), else in a
    fresh sandbox of the attempt (`openforge.sandbox.verifier`, a plain process only where
    the attempt itself had no isolation, or outside a rollout)."""
    workspace = workspace.resolve()
    closed = _closed_to_us(workspace)
    if closed:
        # The grader could not even start in it (bwrap's chdir fails): the agent's doing,
        # scored 0 as the benchmark's grader, failing to read it, would be.
        return {"ok": False, "kind": "exception", "error": closed}
    job = {"code": code, "transcript": events, "workspace": str(workspace)}
    bwrap = check_sandbox.usable_bwrap()
    if bwrap is None:
        done = grader_process.run_verified(QCB_RUNNER, job, cwd=workspace, timeout_s=timeout_s,
                                           untrusted=workspace)
    else:
        home = Path(tempfile.mkdtemp(prefix="openforge-qcb-grader-"))
        env = scrub_env(dict(os.environ))
        env.update(HOME=str(home), TMPDIR=str(home), PYTHONDONTWRITEBYTECODE="1")
        try:
            done = grader_process.run(
                QCB_RUNNER, job, cwd=workspace, env=env, timeout_s=timeout_s,
                wrap=[bwrap, *check_sandbox.prefix(workspace, writable=[home])],
                untrusted=workspace)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    result = _result(done, timeout_s)
    ran = next((n for n in done.notes if n.startswith(qwenclawbench_runner.CODE)), None)
    return {**result, "agent_code": ran} if ran else result


def _closed_to_us(workspace: Path) -> str | None:
    """Why the grader, run as this user without capabilities, cannot enter `workspace` (the
    agent can chmod its own workspace), or None. By the mode bits that apply to this user,
    not `os.access`: as root that says yes whatever the bits, and the grader's sandbox
    drops root's power to ignore them."""
    try:
        st = workspace.stat()
    except OSError as exc:
        return f"the workspace cannot be read: {exc}"
    if st.st_uid == os.geteuid():
        need = stat.S_IRUSR | stat.S_IXUSR
    elif st.st_gid in (os.getegid(), *os.getgroups()):
        need = stat.S_IRGRP | stat.S_IXGRP
    else:
        need = stat.S_IROTH | stat.S_IXOTH
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & need != need:
        return (f"the agent left its workspace closed to the grader (mode "
                f"{stat.filemode(st.st_mode)})")
    return None


def _result(done: grader_process.Outcome, timeout_s: float) -> dict[str, Any]:
    """The runner's result; for a process that wrote none, whose failure that is.

    Once the grader has touched what the agent controls (the runner's notes: it opened the
    workspace, ran code from it, started a program), the agent can end the process (agent
    code that `os._exit`s, kills its parent, or a file that exhausts memory): a death after
    that is scored 0, with the reason, as a grader that raises is. Only a process that died
    before any of it failed through no doing of the agent's: `GraderError`."""
    if done.result is not None:
        return done.result
    if done.timed_out:
        return {"ok": False, "kind": "timeout",
                "error": f"the grader did not finish in {timeout_s:g}s"}
    ended = f"the grader process ended (exit code {done.returncode}) without a result"
    if done.notes:
        return {"ok": False, "kind": "died",
                "error": f"{ended} after it {'; '.join(done.notes)}: {done.output[-500:]}"}
    raise GraderError(f"{ended}, before it touched anything of the agent's: "
                      f"{done.output[-800:]}")


def mean_score(scores: dict[str, Any] | None) -> float:
    """The benchmark's average: the mean of the numeric values (booleans count)."""
    values = [float(v) for v in (scores or {}).values() if isinstance(v, bool | int | float)]
    return sum(values) / len(values) if values else 0.0


def as_floats(scores: dict[str, Any] | None) -> dict[str, float]:
    """The criteria whose value reads as a number (the benchmark's breakdown)."""
    out: dict[str, float] = {}
    for key, value in (scores or {}).items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def automated(spec: QwenClawBenchGrading, events: list[dict[str, Any]], workspace: Path,
              options: ScoringOptions) -> tuple[float, dict[str, float], str | None, str | None]:
    """(score, criteria, error, how the agent's code ran in the grader's process or None)
    of the task's automated checks."""
    assert spec.code is not None
    result = run_grader(spec.code, events, workspace, options.grader_timeout_s)
    ran = result.get("agent_code")
    if ran and options.agent_code_in_grader == "skip":
        # Its source showed no way to (`unscorable` skips those that do): whatever it says
        # now, the agent's code could have written it.
        raise GraderError(f"the grader ran the agent's code in its own process ({ran}), "
                          f"where that code could write any result: not scored (set "
                          f"environment_options.agent_code_in_grader=score to score it as "
                          f"the benchmark does)")
    if result.get("ok"):
        return mean_score(result.get("scores")), as_floats(result.get("scores")), None, ran
    if result.get("kind") == "grader_import":
        raise GraderError(f"the task's grader needs the Python module {result.get('module')!r}, "
                          f"which is not installed here: {result.get('error')} (the workspace "
                          f"is not on the grader's sys.path: a grader that imports the agent's "
                          f"module puts the workspace there itself)")
    # The benchmark scores a grader that raised (or never returned) as 0; so is the agent's
    # failure to provide a module the grader looked for in the workspace, and a grader
    # process that died after it touched the agent's work (`_result`).
    return 0.0, {}, f"{result.get('kind')}: {result.get('error')}", ran


# -- the judge -------------------------------------------------------------------------------

def summarize(events: list[dict[str, Any]]) -> str:
    """The transcript as the benchmark shows it to its judge: tool calls, the start of each
    tool result, and each user message's first content item."""
    lines: list[str] = []
    for event in events:
        if not isinstance(event, dict) or event.get("type") != "message":
            continue
        msg = event.get("message") or {}
        role, content = msg.get("role"), msg.get("content") or []
        if role == "assistant" and isinstance(content, list):
            for item in content:
                if isinstance(item, dict) and item.get("type") == "toolCall":
                    lines.append(f"Tool: {item.get('name')}"
                                 f"({json.dumps(item.get('arguments', {}))})")
        elif role == "toolResult" and content:
            lines.append(f"Result: {str(content[0])[:_TEXT_LIMIT]}")
        elif role == "user" and content:
            lines.append(f"User: {content[0]}")
    return "\n".join(lines)


def judge_prompt(task: ClawTask, spec: QwenClawBenchGrading, summary: str) -> str:
    return (
        "You grade an AI agent's work. Answer with one JSON object and nothing else: no "
        "tools, no files, no prose outside the JSON.\n\n"
        "Be strict: 1.0 is for genuinely excellent work; an acceptable, average completion "
        "scores about 0.6-0.7. Take points off for needless steps, verbose output and "
        "wasteful tool use.\n\n"
        f"## Task\n{task.prompt}\n\n## Expected Behavior\n{spec.expected_behavior}\n\n"
        f"## Agent Transcript (summarized)\n{summary}\n\n## Grading Rubric\n"
        f"{spec.judge_rubric}\n\n"
        "Score each criterion from 0.0 to 1.0, then answer exactly in this shape:\n"
        '{"scores": {"criterion_name": 0.0}, "total": 0.0, "notes": "brief justification"}')


def _json_objects(text: str) -> list[str]:
    """The top-level {...} spans of `text`, in order."""
    spans, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "{":
            if depth == 0:
                start = i
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
    return spans


def _first_object(candidates: list[str], want_scores: bool) -> dict[str, Any] | None:
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict) and (not want_scores or "scores" in value):
            return value
    return None


def parse_judge(text: str) -> dict[str, Any]:
    """The judge's verdict `{scores, total, notes}`, read as the benchmark reads it: a fenced
    JSON block, else the last JSON object that has `scores`, else the last JSON object,
    else a `total: X` in prose. Raises JudgeError when the answer holds no score."""
    fenced = re.search(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    objects = list(reversed(_json_objects(text)))
    found = ((_first_object([fenced.group(1)], False) if fenced else None)
             or _first_object(objects, True) or _first_object(objects, False))
    if found is None:
        prose = re.search(r"(?:total|overall|final)\s*(?:score)?[:\s]*(0\.\d+|1\.0+)", text,
                          re.IGNORECASE)
        found = {"scores": {}, "total": float(prose.group(1))} if prose else None
    if found is None:
        raise JudgeError(f"the judge's answer holds no score: {text[:200]!r}")
    scores: dict[str, float] = {}
    raw = found.get("scores", found.get("criteria_scores"))
    for key, value in (raw.items() if isinstance(raw, dict) else []):
        number: Any = value.get("score") if isinstance(value, dict) else value
        try:
            scores[str(key)] = float(number)
        except (TypeError, ValueError):
            continue
    total = next((found[k] for k in ("total", "score")
                  if isinstance(found.get(k), int | float)), None)
    if total is None and scores:
        total = sum(scores.values()) / len(scores)
    if total is None:
        raise JudgeError(f"the judge's answer holds no score: {text[:200]!r}")
    notes = next((found[k] for k in ("notes", "justification", "reasoning") if k in found), "")
    return {"scores": scores, "total": float(total), "notes": str(notes)}


def judged(task: ClawTask, spec: QwenClawBenchGrading, events: list[dict[str, Any]],
           judge: JudgeEndpoint) -> tuple[float, dict[str, float], dict[str, Any]]:
    """(score, criteria, the judge call as a record) from the judge."""
    prompt = judge_prompt(task, spec, summarize(events))
    answer = judge.ask(prompt)
    verdict = parse_judge(answer)
    record = {"model": judge.model, "base_url": judge.base_url, "prompt": prompt,
              "answer": answer, "notes": verdict["notes"]}
    return verdict["total"], verdict["scores"], record


# -- the verdict -----------------------------------------------------------------------------

def combine(spec: QwenClawBenchGrading, auto: float, llm: float) -> tuple[float, float]:
    """(penalised score, simple weighted mean) of a hybrid task."""
    weights = spec.weights or {"automated": 0.5, "llm_judge": 0.5}
    w_a, w_l = float(weights.get("automated", 0.5)), float(weights.get("llm_judge", 0.5))
    if w_a + w_l <= 0:
        w_a = w_l = 0.5
    total = w_a + w_l
    simple = (auto * w_a + llm * w_l) / total
    penalised = (auto * w_a + (llm if auto >= AUTO_PENALTY_THRESHOLD else 0.0) * w_l) / total
    return penalised, simple


def score(task: ClawTask, workspace: Path, final_state: dict[str, Any],
          calls: list[Call] | None, options: ScoringOptions) -> RewardResult:
    """The benchmark's verdict on one finished rollout of a QwenClawBench task."""
    spec = task.qwenclawbench
    if spec is None:
        raise OpenforgeError(f"task {task.id} is not a QwenClawBench task")
    reason = unscorable(task, options)
    if reason:
        raise OpenforgeError(f"task {task.id} cannot be scored: {reason}")
    events, source = transcript(task, workspace, final_state, calls)
    details: dict[str, Any] = {"grading_type": spec.grading_type, "transcript_source": source,
                               "scoring": ("automated-only" if options.scoring == "automated"
                                           and spec.grading_type != "automated"
                                           else "benchmark")}
    auto = llm = None
    if spec.code is not None:
        auto, criteria, error, ran = automated(spec, events, workspace, options)
        details.update(automated=auto, automated_breakdown=criteria)
        if error:
            details["grader_error"] = error
        if ran:  # scored as the benchmark does (agent_code_in_grader=score), and said so
            details["agent_code_in_grader"] = ran
    use_judge = options.scoring == "benchmark" and spec.grading_type != "automated"
    if use_judge:
        assert options.judge is not None
        llm, criteria, record = judged(task, spec, events, options.judge)
        details.update(llm_judge=llm, llm_judge_breakdown=criteria, judge_call=record)
    if use_judge and spec.grading_type == "hybrid":
        assert auto is not None and llm is not None
        value, simple = combine(spec, auto, llm)
        details["score_simple"] = simple
    elif use_judge:
        value = float(llm or 0.0)
    else:
        value = float(auto or 0.0)
    details["breakdown"] = {**{f"automated.{k}": v for k, v in
                               (details.get("automated_breakdown") or {}).items()},
                            **{f"llm_judge.{k}": v for k, v in
                               (details.get("llm_judge_breakdown") or {}).items()}}
    value = min(max(value, 0.0), 1.0)
    passed = value >= PERFECT
    details["category"] = None if passed else "wrong_final_state"
    details["task_category"] = task.category
    return RewardResult(score=value, passed=passed, details=details)
