"""The rollout stack: one attempt of one task, the same for `openforge run` and both trainers.

    session -> spec -> executor.run -> checked result -> store (result + reward) -> close -> retry?

`RolloutStack` holds a started gateway (its store) and an executor, and runs attempts through
them: `Runner` (openforge run), `RolloutCollector` (the local trainer) and the veRL agent loop
all call `RolloutStack.attempt`; none wires sessions, executors and retries on its own.

Per try: a fresh gateway session (a new token, a new scoring credential); a `RolloutSpec`
naming that session; the executor's result, accepted only when it is this attempt's
(`protocol.check_result`: the rollout, task, attempt and session it names), else the try is
an `infra_error` ("result refused"); the result and the reward written to the store, the
reward cleared when the attempt was not scored (so nothing else stands there); the session
closed, so its token stops working at once. Retries (`RETRIED_STATUSES`: infrastructure
failures and timeouts) get a new session, up to `max_infra_retries`, unless the executor
marks the failure `permanent` (an image that does not exist: another try would fail the
same way); `plugin_error` is not retried (a plugin bug would only repeat) and a `violation`
is scored 0, not retried.

An attempt's identity is (run id, task, attempt index), kept across its tries and across
processes. With `resume` (`openforge run --resume`), the stack first looks for what an
earlier process of the run left of the attempt: the sessions it opened and never closed
(its tries under way when it stopped). When the executor still has the last of them (a
Kubernetes Pod, alive or finished: `Executor.find_attempt`) and would take it over for this
very spec (`Executor.adoptable`), that try goes on with its own rollout id and open session,
so the sandbox's model calls keep landing and its result is collected; the other sessions
are closed, so their tokens stop working. The store is read once per run for them.

Without isolation (sandbox none) an agent can rewrite a task's data for the rollouts after
it. The supervisor catches a change during its own rollout (`violation`); the stack keeps,
in the runner's memory, a digest of every task's `data_paths` taken before the run's first
rollout (`guard`; a task first seen later, by a trainer, at its first rollout), and refuses
to score an attempt whose data no longer matches it (`infra_error`: the data was changed by
an earlier rollout, so any score would be against forged data).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

from openforge.config import RunConfig
from openforge.environment import Environment
from openforge.executor import Executor
from openforge.sandbox import tamper
from openforge.sandbox.protocol import ResultRefused, check_result
from openforge.types import RolloutResult, RolloutSpec, SamplingParams, Session, Task

# (task id, attempt index) -> the sessions an earlier process opened for it and left open.
_Unfinished = dict[tuple[str, Any], list[Session]]


@dataclass
class Attempt:
    """One attempt's outcome through the stack: its last try's result and session, and the
    infrastructure failures of the tries before it."""

    result: RolloutResult
    session: Session
    rollout_id: str
    session_ids: list[str] = field(default_factory=list)
    infra_errors: list[str] = field(default_factory=list)

    @property
    def tries(self) -> int:
        return len(self.session_ids)


def accept(result: RolloutResult, spec: RolloutSpec) -> RolloutResult:
    """`result` if it belongs to `spec`'s attempt, else an `infra_error` saying why not.

    An executor's own failure (a Pod that never started) may leave the session unnamed; a
    scored result must name it.
    """
    if not result.session_id and not result.is_scored and not result.reward:
        result = result.model_copy(update={"session_id": spec.session_id})
    try:
        return check_result(result, spec)
    except ResultRefused as exc:
        return RolloutResult(rollout_id=spec.rollout_id, task_id=spec.task.id,
                             attempt=spec.attempt, session_id=spec.session_id,
                             status="infra_error", sandbox=result.sandbox,
                             error=f"result refused: {exc}", duration_s=result.duration_s)


class RolloutStack:
    """A started gateway and an executor, running attempts for one `RunConfig`."""

    def __init__(self, gateway: Any, executor: Executor, config: RunConfig,
                 harness_options: dict[str, Any] | None = None,
                 environment: Environment | None = None, resume: bool = False) -> None:
        self.gateway = gateway
        self.executor = executor
        self.config = config
        # The run's harness options plus what `Harness.install` resolved (binary paths).
        self.harness_options = dict(config.harness_options if harness_options is None
                                    else harness_options)
        self._environment = environment
        # Data path -> its digest before the first rollout that could change it (sandbox none).
        self._baselines: dict[str, dict[str, str]] = {}
        self.resume = resume
        self._unfinished: dict[str, _Unfinished] = {}  # run id -> its unfinished tries

    @property
    def guards_data(self) -> bool:
        """Whether agents can write this machine's files (the local executor's sandbox none)."""
        return getattr(self.executor, "mode", None) == "none"

    def _data_paths(self, task: Task) -> list[Any]:
        if self._environment is None:
            from openforge.rollout import build_plugin

            cfg = self.config
            self._environment = build_plugin("environment", cfg.environment,
                                             cfg.environment_options)
        return list(self._environment.data_paths(task))

    def guard(self, tasks: list[Task]) -> None:
        """Take the digests of `tasks`' data now, before any of their rollouts (sandbox none)."""
        for task in tasks:
            self._baseline(task)

    def _baseline(self, task: Task) -> dict[str, str] | None:
        if not self.guards_data:
            return None
        baseline: dict[str, str] = {}
        for path in map(str, self._data_paths(task)):
            if path not in self._baselines:
                self._baselines[path] = tamper.digest([path])
            baseline.update(self._baselines[path])
        return baseline

    def _data_intact(self, task: Task, result: RolloutResult,
                     baseline: dict[str, str] | None) -> RolloutResult:
        """`result`, unless it was scored against data changed before its rollout."""
        if baseline is None or not result.is_scored or result.status == "violation":
            return result
        changed = tamper.changes(baseline, tamper.digest(self._data_paths(task)))
        if not changed:
            return result
        return result.model_copy(update={
            "status": "infra_error", "reward": None,
            "error": "the task's data changed after the run started (an agent without "
                     "isolation rewrote it); not scored: restore " + ", ".join(changed[:5])})

    @property
    def store(self) -> Any:
        return self.gateway.store

    def spec(self, task: Task, attempt: int, run_id: str, rollout_id: str,
             session: Session) -> RolloutSpec:
        cfg = self.config
        return RolloutSpec(
            run_id=run_id, rollout_id=rollout_id, attempt=attempt, task=task,
            harness=cfg.harness, harness_options=self.harness_options,
            environment=cfg.environment, environment_options=cfg.environment_options,
            reward=cfg.reward, reward_options=cfg.reward_options,
            # The worker that serves the session (with gateway.workers > 1, one of several).
            gateway_url=self.gateway.url_for(session),
            session_token=session.token, session_id=session.id,
            scoring_token=session.scoring_token, scoring_hash=session.scoring_hash,
            model=cfg.gateway.served_model_name, timeout_s=cfg.timeout_s)

    def _left_open(self, run_id: str, task: Task, attempt: int) -> list[Session]:
        """The sessions an earlier process of run `run_id` opened for this attempt and never
        closed, oldest first (read from the store once per run)."""
        if run_id not in self._unfinished:
            by_attempt: _Unfinished = {}
            for session in self.store.list_sessions(run_id):
                if session.status == "open":
                    key = (session.task_id, session.metadata.get("attempt"))
                    by_attempt.setdefault(key, []).append(session)
            self._unfinished[run_id] = by_attempt
        return self._unfinished[run_id].pop((task.id, attempt), [])

    async def resumable(self, task: Task, attempt: int, run_id: str) -> tuple[Session, int] | None:
        """(session, try index) of this attempt's last try when an earlier process left its
        sandbox behind and the executor can take it over; the other sessions it left open
        are closed (their tokens stop working)."""
        left = self._left_open(run_id, task, attempt)
        rollout_id = await self.executor.find_attempt(run_id, task.id, attempt) if left else None
        resumed = next((s for s in left if s.rollout_id == rollout_id), None)
        if resumed is not None and not await self.executor.adoptable(
                self.spec(task, attempt, run_id, resumed.rollout_id, resumed)):
            resumed = None  # made from another configuration: that try is over
        for session in left:
            if session is not resumed:
                self._close(session.id)
        return None if resumed is None else (resumed, int(resumed.metadata.get("try", 0)))

    async def attempt(self, task: Task, attempt: int, run_id: str, *,
                      sampling: SamplingParams | None = None,
                      metadata: dict[str, Any] | None = None) -> Attempt:
        """Run attempt `attempt` of `task`, retrying infrastructure failures."""
        cfg = self.config
        infra_errors: list[str] = []
        session_ids: list[str] = []
        outcome: Attempt | None = None
        baseline = self._baseline(task)
        resumed = await self.resumable(task, attempt, run_id) if self.resume else None
        first = resumed[1] if resumed else 0
        for try_no in range(first, max(first, cfg.max_infra_retries) + 1):
            if resumed is not None and try_no == first:
                session, rollout_id = resumed[0], resumed[0].rollout_id
            else:
                rollout_id = f"{task.id}.{attempt}.{try_no}.{secrets.token_hex(3)}"
                session = self.gateway.open_session(
                    run_id, rollout_id, task.id, sampling=sampling or cfg.sampling,
                    metadata={"prompt": task.prompt, "attempt": attempt, "try": try_no,
                              "harness": cfg.harness, "environment": cfg.environment,
                              # the whole task: exports carry it (veRL's extra_info.task_json)
                              "task": task.model_dump(mode="json"), **(metadata or {})})
            session_ids.append(session.id)
            spec = self.spec(task, attempt, run_id, rollout_id, session)
            try:
                result = await self.executor.run(spec)
            except asyncio.CancelledError:
                self._close(session.id)
                raise
            except Exception as exc:  # an executor bug must not end the run
                result = RolloutResult(rollout_id=rollout_id, task_id=task.id, attempt=attempt,
                                       session_id=session.id, status="infra_error",
                                       error=f"executor failed: {type(exc).__name__}: {exc}")
            result = self._data_intact(task, accept(result, spec), baseline)
            self.store.save_result(session.id, result)
            reward = result.reward if result.is_scored else None
            self.store.set_reward(session.id, reward.score if reward else None,
                                  reward.details if reward else None)
            self._close(session.id)
            if result.is_retried:
                infra_errors.append(f"{result.status}: {result.error}")
            outcome = Attempt(result=result, session=session, rollout_id=rollout_id,
                              session_ids=list(session_ids), infra_errors=list(infra_errors))
            if not result.is_retried or result.permanent:
                break  # done, or another try would fail the same way
        assert outcome is not None
        return outcome

    def _close(self, session_id: str) -> None:
        """Close the session in the gateway (drops its token cache) or, failing that, in the store."""
        if hasattr(self.gateway, "close_session"):
            self.gateway.close_session(session_id)
        else:
            self.store.close_session(session_id)
