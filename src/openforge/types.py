"""Pydantic models shared by every part of openforge.

These are the boundaries between the runner, the executors, the gateway, the store and
the trainers. Everything that crosses a process or a file is one of these models.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Task(BaseModel):
    """One unit of work an agent is asked to do.

    `prompt` is what the harness is given; `data` holds whatever the environment and the
    reward need (fixtures, expected answers, checker names). `split` is `train`, `test` or
    None when the environment does not split its tasks.
    """

    id: str
    prompt: str
    environment: str = ""
    split: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class SamplingParams(BaseModel):
    """How the policy samples. The gateway fills unset values from the request.

    A name it does not know is refused (`sampling.temprature` must not be dropped silently).
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class Session(BaseModel):
    """One harness run talking to the gateway: one rollout attempt.

    The `token` is both the path segment (`/s/<token>/v1`) and the API key; it grants access
    to this session alone.
    """

    id: str
    token: str
    run_id: str = ""
    rollout_id: str = ""
    task_id: str = ""
    model: str = ""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    weight_version: str | None = None
    status: Literal["open", "closed"] = "open"
    reward: float | None = None
    created_at: float = Field(default_factory=time.time)
    closed_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


CallStatus = Literal["ok", "failed"]
Dialect = Literal["chat", "completions", "responses", "messages"]


class Call(BaseModel):
    """One model call as the gateway recorded it, token by token.

    `prompt_ids` is exactly what the engine received and `completion_ids` / `logprobs`
    exactly what it produced (one logprob per generated id). `exact_tokens` is False for
    engines that only return text (hosted providers through litellm): their ids are a
    retokenization and must not be trained on as if sampled.
    """

    id: str
    session_id: str
    branch: int = 0
    branch_reason: str | None = None
    index: int = 0
    dialect: Dialect = "chat"
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] | None = None
    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    weight_version: str | None = None
    exact_tokens: bool = True
    status: CallStatus = "ok"
    error: str | None = None
    body_digest: str = ""
    retry_count: int = 0
    images: list[str] = Field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0


class RewardResult(BaseModel):
    """A reward's verdict on one finished rollout: `score` in [0, 1]."""

    score: float = Field(ge=0.0, le=1.0)
    passed: bool
    details: dict[str, Any] = Field(default_factory=dict)


class RolloutSpec(BaseModel):
    """Everything a sandbox needs to run one attempt of one task.

    Executors serialize it to JSON and hand it to `python -m openforge.rollout SPEC`.
    """

    run_id: str
    rollout_id: str
    attempt: int = 0
    task: Task
    harness: str
    harness_options: dict[str, Any] = Field(default_factory=dict)
    environment: str
    environment_options: dict[str, Any] = Field(default_factory=dict)
    reward: str
    reward_options: dict[str, Any] = Field(default_factory=dict)
    gateway_url: str
    session_token: str
    model: str = "policy"
    timeout_s: float = 300.0

    @property
    def session_url(self) -> str:
        """The OpenAI-style base URL the harness is pointed at (ends in /v1)."""
        return f"{self.gateway_url.rstrip('/')}/s/{self.session_token}/v1"


RolloutStatus = Literal["ok", "harness_error", "plugin_error", "infra_error", "timeout"]
SCORED_STATUSES: frozenset[str] = frozenset({"ok", "harness_error"})
INFRA_STATUSES: frozenset[str] = frozenset({"infra_error", "timeout"})
PLUGIN_STATUSES: frozenset[str] = frozenset({"plugin_error"})


class RolloutResult(BaseModel):
    """What came out of one attempt.

    `status` says whether the attempt is usable: `ok` (the harness ran to its end, whatever
    the agent achieved) and `harness_error` (the agent program failed on its own) are scored;
    `infra_error` and `timeout` are infrastructure failures: retried by the runner, labelled,
    and never scored as a 0 reward; `plugin_error` is an exception raised by plugin code
    (the environment, the reward, the harness adapter): a bug to fix, not retried, never
    scored, counted apart in every figure.
    """

    model_config = ConfigDict(extra="ignore")

    rollout_id: str
    task_id: str = ""
    attempt: int = 0
    status: RolloutStatus = "ok"
    reward: RewardResult | None = None
    final_answer: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    harness_output: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_infra_failure(self) -> bool:
        return self.status in INFRA_STATUSES

    @property
    def is_scored(self) -> bool:
        return self.status in SCORED_STATUSES


class Sample(BaseModel):
    """One training sequence: one branch of a session's calls, merged.

    `prompt_ids + response_ids` is the whole token sequence; `response_mask` is 1 on tokens
    the policy generated and 0 on observations (tool results, user turns, template tokens)
    that arrived between calls; `response_logprobs` is 0.0 on observations. `rollout_id`
    groups the samples of one attempt so trainers can normalize per rollout, not per row.
    """

    sample_id: str
    session_id: str
    rollout_id: str = ""
    task_id: str = ""
    branch: int = 0
    branch_reason: str | None = None
    call_ids: list[str] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    reward: float | None = None
    num_turns: int = 0
    weight_versions: list[str] = Field(default_factory=list)
    exact_tokens: bool = True
