"""Pydantic models shared by every part of openforge.

These are the boundaries between the runner, the executors, the gateway, the store and
the trainers. Everything that crosses a process or a file is one of these models.

Each builds its validator when first used (`defer_build`), not when imported: every
rollout's supervisor imports this module and validates only a few of them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    """Base of the models below: each builds its validator when first used (`defer_build`;
    a subclass's own `model_config` adds to this one)."""

    model_config = ConfigDict(defer_build=True)


class Task(_Model):
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


class SamplingParams(_Model):
    """How the policy samples. The gateway fills unset values from the request.

    A name it does not know is refused (`sampling.temprature` must not be dropped silently).
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class Session(_Model):
    """One harness run talking to the gateway: one rollout attempt.

    The `token` is both the path segment (`/s/<token>/v1`) and the API key; it grants model
    calls in this session alone and nothing else (no result, reward or admin route). The
    `scoring_token` is the trusted side's credential for reading the session's recorded calls
    (`GET /scoring/sessions/{id}/calls`); the agent never holds it. Both exist in clear only
    in the object `open` returns: the store keeps their SHA-256 (`token_hash`,
    `scoring_hash`), so a readable store leaks no credential.
    """

    id: str
    token: str = ""
    token_hash: str = ""
    scoring_token: str = ""
    scoring_hash: str = ""
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


class Call(_Model):
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
    # The HTTP status the gateway answered with: 200, or why the call failed (a 4xx the
    # engine gave the request itself, a 5xx for the engine's or the gateway's failure).
    # None for calls recorded before openforge kept it.
    http_status: int | None = None


class RewardResult(_Model):
    """A reward's verdict on one finished rollout: `score` in [0, 1]."""

    score: float = Field(ge=0.0, le=1.0)
    passed: bool
    details: dict[str, Any] = Field(default_factory=dict)


class RolloutSpec(_Model):
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
    # The session this attempt runs in: its result must name it (or it is refused).
    session_id: str = ""
    # The trusted side's credential for the session's recorded calls (rewards that want
    # them); never given to the agent. Empty: the reward gets no calls.
    scoring_token: str = ""
    # Its SHA-256, for an attempt taken over after a restart (the store keeps only the hash;
    # the sandbox still holds the credential): the Kubernetes executor checks the result's
    # signature with it (`protocol.scoring_result_key`). Never sent into a sandbox.
    scoring_hash: str = Field(default="", exclude=True)
    model: str = "policy"
    timeout_s: float = 300.0

    @property
    def session_url(self) -> str:
        """The OpenAI-style base URL the harness is pointed at (ends in /v1)."""
        return f"{self.gateway_url.rstrip('/')}/s/{self.session_token}/v1"


# -- attempt statuses: the one place they are defined -----------------------------------------
#
#   ok             the harness ran to its end (whatever the agent achieved)     scored
#   harness_error  the agent program failed on its own                          scored
#   violation      the agent broke the sandbox's rules (tampered with the task's  scored 0,
#                  data, wrote a result line): the agent did it, so it is        labelled
#                  scored, with reward 0
#   infra_error    the infrastructure failed (sandbox or supervisor died, engine not scored,
#                  down, harness missing)                                        retried
#   timeout        out of time                                                  not scored,
#                                                                                retried
#   plugin_error   environment, reward or harness-adapter code raised: a bug     not scored,
#                  that a retry would only repeat                                not retried
RolloutStatus = Literal["ok", "harness_error", "violation", "infra_error", "timeout",
                        "plugin_error"]
SCORED_STATUSES: frozenset[str] = frozenset({"ok", "harness_error", "violation"})
INFRA_STATUSES: frozenset[str] = frozenset({"infra_error", "timeout"})
RETRIED_STATUSES: frozenset[str] = INFRA_STATUSES
PLUGIN_STATUSES: frozenset[str] = frozenset({"plugin_error"})


class StatusFlags:
    """What a `status` means, for every model that has one (results, records, outcomes)."""

    if TYPE_CHECKING:  # declared by each model, in its own place among its fields
        status: str

    @property
    def is_infra_failure(self) -> bool:
        return self.status in INFRA_STATUSES

    @property
    def is_plugin_failure(self) -> bool:
        return self.status in PLUGIN_STATUSES

    @property
    def is_scored(self) -> bool:
        return self.status in SCORED_STATUSES

    @property
    def is_retried(self) -> bool:
        return self.status in RETRIED_STATUSES


class RolloutResult(StatusFlags, _Model):
    """What came out of one attempt (statuses: see `RolloutStatus` above).

    `session_id` names the session the attempt ran in: an executor refuses a result whose
    rollout, task, attempt or session differs from its spec. `sandbox` says how the agent
    was isolated: `bwrap`, `namespaces` or `none` (in a Pod: the mode inside it).
    `permanent` marks an infrastructure failure that another try cannot fix (an image that
    does not exist, a spec the cluster rejects): labelled like any infra failure, not retried.
    `limits_reached` counts how often the agent met its rollout's limits (the local
    executor's cgroup: `processes`, forks refused; `memory`, processes the OOM killer ended;
    `cpu`, 100 ms periods its processes waited out at `cpu_max`; its folder's watch: `disk`,
    1 when the rollout was ended for what its folder took).
    """

    model_config = ConfigDict(extra="ignore")

    rollout_id: str
    task_id: str = ""
    attempt: int = 0
    session_id: str = ""
    status: RolloutStatus = "ok"
    reward: RewardResult | None = None
    final_answer: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    sandbox: str = ""
    harness_output: dict[str, Any] = Field(default_factory=dict)
    permanent: bool = False
    limits_reached: dict[str, int] = Field(default_factory=dict)


class Sample(_Model):
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
