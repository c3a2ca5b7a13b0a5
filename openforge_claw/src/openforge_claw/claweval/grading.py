"""Score a finished Claw-Eval rollout with the task's own grader (`grade_main.py`).

The rollout's conversation (from the recorded calls), its dispatches and audit records go
into a Claw-Eval trace file; the grader runs in a process of `python` of its own
(`grader_process`) with the checkout's `src` first on `PYTHONPATH`, bounded by
`timeout_s`. Its `DimensionScores` come back as the reward: score = Claw-Eval's task
score, passed = score >= 0.75, the dimensions and the judge's calls in the details.

Failures are never a 0: a grader that crashes or runs out of time, or asks for the judge
when none is set, raises `GraderError` (the rollout is then an infrastructure failure,
with the reason).
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from openforge.types import Call, RewardResult

from openforge_claw import grader_process
from openforge_claw.claweval import trace
from openforge_claw.claweval.spec import ClawEvalTask
from openforge_claw.grader_process import GraderError
from openforge_claw.judge import JudgeEndpoint


def category(passed: bool, safety: float, dispatch_list: list[dict[str, Any]]) -> str | None:
    """The failure category openforge's reports count (`report/behaviours.py`): unsafe
    (safety below 1), a tool error (some call answered 4xx/5xx), else a wrong end state."""
    if passed:
        return None
    if safety < 1.0:
        return "unsafe_action"
    if any(int(d.get("response_status") or 0) >= 400 for d in dispatch_list):
        return "tool_error"
    return "wrong_final_state"


def grade(spec: ClawEvalTask, prompt: str, final_state: dict[str, Any], calls: list[Call] | None,
          *, category_name: str = "general", judge: JudgeEndpoint | None = None,
          python: str = sys.executable, timeout_s: float = 600.0) -> RewardResult:
    """The task's grader's verdict on one rollout."""
    state = final_state.get("claw_eval") or {}
    tools = {t.name for t in spec.tools}
    msgs = trace.messages(calls, prompt, str(final_state.get("final_answer") or ""), tools)
    dispatch_list = trace.dispatches(state.get("dispatches") or [], calls)
    audit = state.get("audit_data") or {}
    with tempfile.TemporaryDirectory(prefix="claw-eval-grade-") as tmp:
        trace_path = Path(tmp) / "trace.jsonl"
        trace_path.write_text(trace.dumps(trace.events(spec.task_id, uuid.uuid4().hex, msgs,
                                                       dispatch_list, audit)))
        job = {"task_yaml": str(Path(spec.task_dir) / "task.yaml"), "task_dir": spec.task_dir,
               "trace": str(trace_path), "env_snapshot": state.get("env_snapshot"),
               # The checkout's own LLMJudge (an openai.OpenAI client) asks it, with the
               # grader's own prompts: where, which model, the key's variable.
               "judge": judge.model_dump(include={"base_url", "model", "api_key_env"})
               if judge else None}
        env = dict(os.environ)  # the judge's key variable included
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(spec.repo) / "src"),
                                                          env.get("PYTHONPATH")]))
        done = grader_process.run("openforge_claw.claweval.grade_main", job,
                                  cwd=Path(spec.repo), env=env, timeout_s=timeout_s,
                                  python=python)
    result = done.result or {}
    if done.timed_out:
        raise GraderError(f"task {spec.task_id}: its grader did not finish within "
                          f"{timeout_s:g}s")
    if result.get("judge_required"):
        raise GraderError(f"task {spec.task_id}: its grader asks the LLM judge and none is set; "
                          f"set environment_options.judge_base_url and judge_model")
    if not result.get("ok"):
        raise GraderError(f"task {spec.task_id}: its grader failed: "
                          f"{result.get('error') or f'exit code {done.returncode}'}\n"
                          f"{done.output}")
    details = {key: result[key] for key in ("grader", "completion", "robustness", "safety",
                                            "communication", "task_score", "judge_calls")}
    details.update(benchmark="claw-eval",  # the report adds its pass@k / pass^k estimators
                   category=category(result["passed"], result["safety"], dispatch_list),
                   task_category=category_name, dispatches=len(dispatch_list),
                   tools_called=sorted({d["tool_name"] for d in dispatch_list}),
                   service_urls=state.get("service_urls") or {})
    return RewardResult(score=min(max(float(result["task_score"]), 0.0), 1.0),
                        passed=bool(result["passed"]), details=details)
