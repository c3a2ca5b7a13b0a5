"""What openforge keeps of one Claw-Eval task: the parts of `task.yaml` a rollout needs.

Claw-Eval (github.com/claw-eval/claw-eval) scores a task with the task's own `grader.py`
alone; `scoring_components` and `safety_checks` in `task.yaml` only document what the
grader does, so they are not kept here. Everything else a rollout needs is: the task's
tools and the mock-service URLs behind them (`tools`, `tool_endpoints`), the services to
start (`services`), the files the agent starts with (`sandbox_files`, falling back to
`environment.fixtures`; prompt `attachments`), the files and commands the grader reads
after the agent (`sandbox_grader_files`, `env_snapshot_files`, `env_snapshot_commands`,
`local_grader_files`).

`needs` lists what a task requires beyond this machine; a task with an unmet need is
skipped with its reason, never scored (see `Need`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Claw-Eval runs every task in a container whose working directory is /workspace; prompts,
# snapshot commands and verify scripts name paths under it.
CONTAINER_WORKSPACE = "/workspace"

NeedKind = Literal["fixture", "real_web", "simulated_user", "judge"]


class Need(BaseModel):
    """Something a task requires that a run may not have.

    - `real_web`: a service that searches or fetches the live web (`web_real*`, SERP key);
    - `simulated_user`: a multi-turn task whose user is simulated by a model
      (`user_agent.enabled`); openforge's harnesses take one prompt;
    - `judge`: the task's grader asks Claw-Eval's LLM judge (run with a judge endpoint);
    - `fixture`: a file the task names is not in the checkout (Claw-Eval ships its videos
      and some large PDFs on Hugging Face, not on GitHub).

    A task is reported under its first need in this order: fixture, real_web,
    simulated_user, judge (`claweval.SKIP_REASONS`).
    """

    kind: NeedKind
    detail: str = ""


class ToolSpec(BaseModel):
    """A tool of the task, offered to the agent (name, description, JSON schema)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                  "properties": {}})


class ToolEndpoint(BaseModel):
    """Where a tool call goes: the mock service URL as the task names it (fixed port)."""

    tool_name: str
    url: str
    method: str = "POST"


class ServiceDef(BaseModel):
    """A mock service of the task, as `task.yaml` declares it."""

    model_config = ConfigDict(extra="ignore")

    name: str
    command: str
    port: int
    health_check: str
    health_check_method: str = "POST"
    ready_timeout: float = 10.0
    reset_endpoint: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class ClawEvalTask(BaseModel):
    """One Claw-Eval task, as loaded from a checkout (`formats/claw_eval.py`)."""

    model_config = ConfigDict(extra="forbid")

    repo: str  # the checkout's root (holds src/claw_eval, mock_services/, tasks/)
    task_dir: str
    task_id: str
    language: str = "zh"
    tools: list[ToolSpec] = Field(default_factory=list)  # only those with an endpoint
    sandbox_tools: list[str] = Field(default_factory=list)  # e.g. Bash: the harness's own
    tool_endpoints: list[ToolEndpoint] = Field(default_factory=list)
    services: list[ServiceDef] = Field(default_factory=list)
    sandbox_files: list[str] = Field(default_factory=list)
    attachments: list[str] = Field(default_factory=list)
    sandbox_grader_files: list[str] = Field(default_factory=list)
    local_grader_files: list[str] = Field(default_factory=list)
    env_snapshot_files: list[str] = Field(default_factory=list)
    env_snapshot_commands: list[str] = Field(default_factory=list)
    env_snapshot_timeout_s: float = 10.0
    max_turns: int = 20
    needs: list[Need] = Field(default_factory=list)

    def need(self, kind: NeedKind) -> Need | None:
        return next((n for n in self.needs if n.kind == kind), None)
