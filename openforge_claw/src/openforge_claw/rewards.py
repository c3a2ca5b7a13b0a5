"""The claw rewards: `claw-grader` (programmatic) and `claw-judge` (rubric, LLM judge).

`claw-judge` asks a judge model, through litellm and never through the session's gateway
URL, to score the rollout against the task's rubric. The judge call is recorded apart
from the policy's calls: in the reward details (`judge_call`, which lands in
results.jsonl) and, with the option `log`, appended to a JSONL judge log. It never enters
the trace store's calls, so it never becomes training data.

Options of `claw-judge`: `model` (litellm model name, required), `api_base`, `api_key_env`
(the variable holding the key), `mode` (`judge`: the judge's score alone, safety still
applies; `hybrid` (default): QwenClawBench's w_a s_a + w_l s_l 1[s_a >= 0.75] with the
task's `judge_weights`, default 0.5 / 0.5), `log`, `max_tokens`, `timeout_s`.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Literal

from openforge.environment import Environment
from openforge.errors import OpenforgeError
from openforge.reward import Reward
from openforge.types import Call, RewardResult, Task
from pydantic import BaseModel, ConfigDict

from openforge_claw.environment import ClawEnvironment, claw_task
from openforge_claw.grading import grade
from openforge_claw.judge import JudgeError

JUDGE_SYSTEM = (
    "You grade an AI agent's work on a task against a rubric. Read the task, the rubric and "
    "the evidence (the agent's final answer, the final workspace files and the final state "
    "of the services it used). Answer with one JSON object and nothing else: "
    '{"score": <number from 0 to 1>, "reason": "<one sentence>"}.'
)
_SESSION_URL = re.compile(r"/s/[^/]+/v1")
_EVIDENCE_LIMIT = 12_000


class GraderReward(Reward):
    """Claw-Eval's programmatic score: safety x (0.8 completion + 0.2 robustness), pass >= 0.75."""

    wants_calls = True  # trajectory checks (tool_called, ...) read the session's calls

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        if isinstance(environment, ClawEnvironment):  # a benchmark task: its own grader
            return environment.score(task, workspace, final_state, calls)
        return grade(claw_task(task), workspace, final_state, calls)


class JudgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    api_base: str | None = None
    api_key_env: str | None = None
    mode: Literal["judge", "hybrid"] = "hybrid"
    log: str | None = None
    max_tokens: int = 400
    timeout_s: float = 120.0


def evidence(final_state: dict[str, Any]) -> str:
    files = {name: entry.get("content", f"<{entry.get('size')} bytes>")
             for name, entry in (final_state.get("files") or {}).items()}
    services = {name: snap.get("state") for name, snap in
                (final_state.get("services") or {}).items()}
    text = json.dumps({"final_answer": final_state.get("final_answer"), "files": files,
                       "services": services}, indent=1, default=str)
    return text[:_EVIDENCE_LIMIT]


def parse_score(text: str) -> float:
    """The score in a judge's answer: a JSON object's `score`, else `score: X`."""
    for match in re.finditer(r"\{.*?\}", text, re.DOTALL):
        try:
            value = json.loads(match.group(0)).get("score")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int | float):
            return min(max(float(value), 0.0), 1.0)
    found = re.search(r"score\W+([01](?:\.\d+)?)", text, re.IGNORECASE)
    if found:
        return float(found.group(1))
    raise JudgeError(f"the judge's answer holds no score: {text[:200]!r}")


class JudgeReward(Reward):
    """A judge model scores the rollout against the task's rubric (litellm); hybrid with the grader."""

    wants_calls = True  # the judge reads the transcript; the grader part its trajectory checks

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        try:
            self.config = JudgeOptions.model_validate(options)
        except ValueError as exc:
            raise OpenforgeError("claw-judge options: " + str(exc).splitlines()[0] + "; e.g. "
                                 "--set reward_options.model=openai/gpt-4o-mini") from None
        if self.config.api_base and _SESSION_URL.search(self.config.api_base):
            raise OpenforgeError("claw-judge: api_base is a session URL of the gateway; judge "
                                 "calls must not become training data, point it elsewhere")

    def ask(self, messages: list[dict[str, str]]) -> str:
        try:
            import litellm
        except ImportError:
            raise JudgeError("claw-judge needs litellm: pip install 'openforge-claw[judge]'") from None
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages,
                                  "max_tokens": self.config.max_tokens, "temperature": 0.0,
                                  "timeout": self.config.timeout_s}
        if self.config.api_base:
            kwargs["api_base"] = self.config.api_base
        if self.config.api_key_env:
            # A local judge server may need no key; a hosted one answers 401 without it.
            kwargs["api_key"] = os.environ.get(self.config.api_key_env) or "none"
        try:
            response = litellm.completion(**kwargs)
        except Exception as exc:  # any provider failure: the reward could not be computed
            raise JudgeError(f"the judge {self.config.model} failed: "
                             f"{type(exc).__name__}: {str(exc)[:300]}") from None
        return str(response.choices[0].message.content or "")

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        ct = claw_task(task)
        if ct.qwenclawbench is not None or ct.claw_eval is not None:
            raise JudgeError(f"task {ct.id} is a {ct.format} task: score it with --reward "
                             f"claw-grader and environment_options.judge_base_url / judge_model "
                             f"(the benchmark's own grader, judge prompts and weighting)")
        if not ct.rubric:
            raise JudgeError(f"task {ct.id} has no rubric for the judge; use --reward claw-grader")
        graded = grade(ct, workspace, final_state, calls)
        messages = [{"role": "system", "content": JUDGE_SYSTEM},
                    {"role": "user", "content": f"Task:\n{ct.prompt}\n\nRubric:\n{ct.rubric}\n\n"
                                                f"Evidence:\n{evidence(final_state)}"}]
        started = time.time()
        answer = self.ask(messages)
        judged = parse_score(answer)
        record = {"task_id": ct.id, "model": self.config.model, "messages": messages,
                  "answer": answer, "score": judged, "started_at": started,
                  "finished_at": time.time()}
        if self.config.log:
            with open(self.config.log, "a") as log:
                log.write(json.dumps(record) + "\n")
        automated = graded.score
        safety = float(graded.details.get("safety", 1.0))
        if self.config.mode == "judge":
            score = safety * judged
        else:
            weights = ct.judge_weights or {"automated": 0.5, "llm_judge": 0.5}
            w_a, w_l = weights.get("automated", 0.5), weights.get("llm_judge", 0.5)
            gate = 1.0 if automated >= 0.75 else 0.0
            score = safety * (w_a * automated + w_l * judged * gate) / max(w_a + w_l, 1e-9)
        score = min(max(score, 0.0), 1.0)
        passed = score >= ct.grader.pass_threshold
        details = {**graded.details, "automated": automated, "judge": judged,
                   "judge_call": record}
        if passed:
            details["category"] = None
        elif details.get("category") is None:
            details["category"] = "wrong_final_state"
        return RewardResult(score=score, passed=passed, details=details)
