"""Rollouts for online training: one gateway, engine and executor kept across all steps.

`RolloutCollector` starts the recording gateway once (the `local` engine loads the policy
once), runs `tasks x k` attempts per step through the same rollout stack as `openforge run`
(`openforge.attempts.RolloutStack`: sessions, executor, checked results, retries), turns each
scored attempt's recorded calls into `Sample`s, and swaps new weights into the engine between
steps, pausing the gateway (429 + Retry-After) while it does so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from openforge.attempts import RolloutStack
from openforge.config import RunConfig
from openforge.errors import OpenforgeError
from openforge.rollout import build_plugin
from openforge.runner import AttemptRecord, open_results_for_append
from openforge.trajectory import build_samples
from openforge.types import Sample, SamplingParams, Task


def attempt_seed(seed: int, task_id: str, attempt: int) -> int:
    """The sampling seed of attempt `attempt` of a task in a run seeded with `seed`: the
    same for the same (seed, task, attempt) in every process and run, and independent
    between them (a hash, not `seed + attempt`, so neighbouring seeds share no draws)."""
    digest = hashlib.sha256(f"{seed}/{task_id}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # below 2**63: every engine takes it


class TrainingError(OpenforgeError):
    """Training cannot go on (no usable rollouts, an engine that cannot take weights...)."""


@dataclass
class StepRollouts:
    """The attempts of one step and the samples built from them."""

    records: list[AttemptRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def scored(self) -> list[AttemptRecord]:
        return [r for r in self.records if r.is_scored]

    @property
    def mean_reward(self) -> float:
        scored = self.scored
        return sum(r.reward or 0.0 for r in scored) / len(scored) if scored else 0.0

    @property
    def pass_rate(self) -> float:
        scored = self.scored
        return sum(r.passed for r in scored) / len(scored) if scored else 0.0

    def summary(self) -> dict[str, float]:
        generated = sum(sum(s.response_mask) for s in self.samples)
        return {"reward_mean": self.mean_reward, "pass_rate": self.pass_rate,
                "rollouts": float(len(self.records)),
                "infra_failures": float(len(self.records) - len(self.scored)),
                "response_tokens": float(generated),
                "response_tokens_per_rollout": generated / max(len(self.scored), 1),
                "rollout_time_s": self.seconds}


class RolloutCollector:
    """Runs attempts through one long-lived gateway; use as `async with`."""

    def __init__(self, config: RunConfig, work_dir: Path, console: Console | None = None) -> None:
        from openforge.store import Store

        self.config = config
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.console = console or Console(quiet=True)
        self.store = Store(self.work_dir / "store.sqlite")
        self.gateway: Any = None
        self.executor: Any = None
        self.stack: RolloutStack | None = None

    async def __aenter__(self) -> RolloutCollector:
        from openforge.gateway.server import Gateway

        cfg = self.config
        self.executor = build_plugin("executor", cfg.executor, cfg.executor_options)
        self.executor.protect(self.work_dir)
        self.gateway = Gateway(cfg.gateway, cfg.engine, self.store)
        await self.gateway.start()
        self.stack = RolloutStack(self.gateway, self.executor, cfg)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.executor is not None:
            await self.executor.close()
        if self.gateway is not None:
            await self.gateway.stop()
        self.store.close()

    @property
    def engine(self) -> Any:
        return self.gateway.engine

    def push_weights(self, state_dict: dict[str, Any], version: int) -> str:
        """Load new weights into the engine; calls recorded from now on carry `version`."""
        load = getattr(self.engine, "load_state_dict", None)
        if load is None:
            raise TrainingError(f"engine '{self.config.engine.name}' cannot take new weights "
                                "in process; online training needs the `local` engine")
        self.gateway.pause(retry_after_s=1)
        try:
            return str(load(state_dict, version=version))
        finally:
            self.gateway.resume()

    async def collect(self, tasks: Sequence[Task], k: int, tag: str,
                      seed: int | None = None) -> StepRollouts:
        """Run every task k times (concurrency from the run config); samples of scored attempts.

        With `seed`, attempt j of task t samples with the seed `attempt_seed(seed, t, j)`:
        two collections with the same seed draw the same random numbers, so comparing two
        checkpoints on them measures what the weights changed, not sampling luck (common
        random numbers). An engine that honours `seed` (`local`, vLLM) then gives the same
        completions for the same weights."""
        started = time.monotonic()
        stack = self.stack
        assert stack is not None, "use RolloutCollector as `async with`"
        stack.guard(list(tasks))
        semaphore = asyncio.Semaphore(self.config.concurrency)

        def sampling(task: Task, attempt: int) -> SamplingParams | None:
            if seed is None:
                return None
            return self.config.sampling.model_copy(
                update={"seed": attempt_seed(seed, task.id, attempt)})

        async def one(task: Task, attempt: int) -> AttemptRecord:
            async with semaphore:
                return AttemptRecord.of(task, attempt, await stack.attempt(
                    task, attempt, tag, sampling=sampling(task, attempt)))

        records = list(await asyncio.gather(*(one(t, a) for t in tasks for a in range(k))))
        step = StepRollouts(records=records)
        self._log_attempts(tag, step)
        for record in step.scored:
            session = self.store.get_session(record.session_id)
            calls = self.store.list_calls(record.session_id)
            if session is None or not calls:
                continue
            built = build_samples(calls, session, record.reward or 0.0)
            # Text-only engines' ids are retokenizations: never train on them as if sampled.
            step.samples.extend(s for s in built.samples if s.exact_tokens)
        step.seconds = time.monotonic() - started
        return step

    def _log_attempts(self, tag: str, step: StepRollouts) -> None:
        """Every attempt's record to `attempts.jsonl` (its status, reward, tries and each
        try's infrastructure error), and one console line for the attempts left unscored,
        so a step's changed batch says why."""
        # Appended like a run's results.jsonl: a line torn by a crash is ended first.
        with open_results_for_append(self.work_dir / "attempts.jsonl") as log:
            for record in step.records:
                log.write(json.dumps({"tag": tag, **record.model_dump(
                    mode="json", exclude={"logs", "prompt"})}) + "\n")
        failed = [r for r in step.records if not r.is_scored]
        if failed:
            self.console.print(
                f"[{tag}] {len(failed)} of {len(step.records)} attempts not scored "
                f"({failed[0].status}: {failed[0].error}); every one's error is in "
                f"{self.work_dir / 'attempts.jsonl'}", markup=False)
