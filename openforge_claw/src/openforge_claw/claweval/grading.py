"""Score a finished Claw-Eval rollout with the task's own grader (`grade_main.py`).

The rollout's conversation (from the recorded calls), its dispatches and audit records go
into a Claw-Eval trace file; the grader runs in a subprocess of `python` with the
checkout's `src` first on `PYTHONPATH`, bounded by `timeout_s`. Its `DimensionScores` come
back as the reward: score = Claw-Eval's task score, passed = score >= 0.75, the dimensions
and the judge's calls in the details.

Failures are never a 0: a grader that crashes or runs out of time, or asks for the judge
when none is set, raises `GradingError` (the rollout is then an infrastructure failure,
with the reason).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from openforge.errors import OpenforgeError
from openforge.types import Call, RewardResult
from pydantic import BaseModel, ConfigDict

from openforge_claw.claweval import trace
from openforge_claw.claweval.grade_main import JUDGE_REQUIRED_EXIT
from openforge_claw.claweval.spec import ClawEvalTask

_ERROR_TAIL = 1500


class GradingError(OpenforgeError):
    """The grader could not score the rollout (crash, timeout, judge needed)."""


class JudgeConfig(BaseModel):
    """Claw-Eval's LLM judge: any OpenAI-compatible endpoint (`judge.client` is an
    `openai.OpenAI`), the model name, and the variable that holds its key (if any)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    model: str
    api_key_env: str | None = None


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
          *, category_name: str = "general", judge: JudgeConfig | None = None,
          python: str = sys.executable, timeout_s: float = 600.0) -> RewardResult:
    """The task's grader's verdict on one rollout."""
    state = final_state.get("claw_eval") or {}
    tools = {t.name for t in spec.tools}
    msgs = trace.messages(calls, prompt, str(final_state.get("final_answer") or ""), tools)
    dispatch_list = trace.dispatches(state.get("dispatches") or [], calls)
    audit = state.get("audit_data") or {}
    with tempfile.TemporaryDirectory(prefix="claw-eval-grade-") as tmp:
        folder = Path(tmp)
        trace_path = folder / "trace.jsonl"
        trace_path.write_text(trace.dumps(trace.events(spec.task_id, uuid.uuid4().hex, msgs,
                                                       dispatch_list, audit)))
        job = {"task_yaml": str(Path(spec.task_dir) / "task.yaml"), "task_dir": spec.task_dir,
               "trace": str(trace_path), "env_snapshot": state.get("env_snapshot"),
               "judge": judge.model_dump() if judge else None,
               "result": str(folder / "result.json")}
        (folder / "job.json").write_text(json.dumps(job, ensure_ascii=False))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(spec.repo) / "src"),
                                                          env.get("PYTHONPATH")]))
        try:
            proc = subprocess.run([python, "-m", "openforge_claw.claweval.grade_main",
                                   str(folder / "job.json")], cwd=spec.repo, env=env,
                                  capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise GradingError(f"task {spec.task_id}: its grader did not finish within "
                               f"{timeout_s:g}s") from None
        result_path = folder / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if proc.returncode == JUDGE_REQUIRED_EXIT or result.get("judge_required"):
        raise GradingError(f"task {spec.task_id}: its grader asks the LLM judge and none is set; "
                           f"set environment_options.judge_base_url and judge_model")
    if not result.get("ok"):
        tail = (proc.stderr or proc.stdout).strip()[-_ERROR_TAIL:]
        raise GradingError(f"task {spec.task_id}: its grader failed: "
                           f"{result.get('error') or f'exit code {proc.returncode}'}\n{tail}")
    details = {key: result[key] for key in ("grader", "completion", "robustness", "safety",
                                            "communication", "task_score", "judge_calls")}
    details.update(category=category(result["passed"], result["safety"], dispatch_list),
                   task_category=category_name, dispatches=len(dispatch_list),
                   tools_called=sorted({d["tool_name"] for d in dispatch_list}),
                   service_urls=state.get("service_urls") or {})
    return RewardResult(score=min(max(float(result["task_score"]), 0.0), 1.0),
                        passed=bool(result["passed"]), details=details)
