"""Pass rates with unbiased estimators: pass@k, pass^k, mean reward, per-task tables.

With `n` scored attempts of a task of which `c` passed:

- pass@k = 1 - C(n-c, k) / C(n, k): the chance that at least one of k attempts drawn
  without replacement passes;
- pass^k = C(c, k) / C(n, k): the chance that all k drawn attempts pass.

Both are exact (integer binomials via `math.comb`), so they do not drift for large n.
Only scored attempts (status `ok` or `harness_error`) are in `n`: infrastructure failures
and plugin errors are counted apart, and `headline` states every rate with its denominator
and what was left out, so no figure reads better than the run was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, Field

from openforge.types import StatusFlags


def _check(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or k < 1:
        raise ValueError(f"need n >= 0, c >= 0, k >= 1 (got n={n}, c={c}, k={k})")
    if c > n:
        raise ValueError(f"c={c} passed attempts exceed n={n} attempts")
    if k > n:
        raise ValueError(f"k={k} exceeds the n={n} attempts available")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n-c, k) / C(n, k)."""
    _check(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (all k attempts pass): C(c, k) / C(n, k)."""
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


class AttemptOutcome(StatusFlags, BaseModel):
    """One finished attempt as metrics see it."""

    task_id: str
    attempt: int = 0
    status: str = "ok"
    reward: float | None = None
    passed: bool = False


class TaskRow(BaseModel):
    """Per-task aggregate: scored attempts, passes, infra failures, plugin errors, mean
    reward, pass@k."""

    task_id: str
    n: int = 0
    passed: int = 0
    infra_failures: int = 0
    plugin_errors: int = 0
    mean_reward: float | None = None
    pass_at: dict[int, float] = Field(default_factory=dict)
    pass_hat: dict[int, float] = Field(default_factory=dict)


class MetricsSummary(BaseModel):
    """Run-level metrics. `pass_at[k]` averages per-task pass@k over the tasks with >= k scored attempts."""

    tasks: int = 0
    attempts: int = 0
    scored: int = 0
    passed: int = 0
    infra_failures: int = 0
    plugin_errors: int = 0
    mean_reward: float | None = None
    pass_at: dict[int, float] = Field(default_factory=dict)
    pass_hat: dict[int, float] = Field(default_factory=dict)
    rows: list[TaskRow] = Field(default_factory=list)

    def headline(self) -> str:
        """The run in one line: pass@1 with its denominator, and what was left out."""
        rate = "-" if 1 not in self.pass_at else f"{self.pass_at[1]:.3f}"
        mean = "-" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        return (f"pass@1 {rate} over {self.scored} scored of {self.attempts} attempts "
                f"({self.passed} passed, mean reward {mean}); left out: {self.plugin_errors} "
                f"plugin errors, {self.infra_failures} infrastructure failures")

    def progress(self) -> str:
        """The same figures, short, for the progress bar."""
        rate = f"{self.passed / self.scored:.0%}" if self.scored else "-"
        return (f"pass {rate} of {self.scored} scored  plugin errors {self.plugin_errors}  "
                f"infra failures {self.infra_failures}")


def task_row(task_id: str, outcomes: list[AttemptOutcome], max_k: int) -> TaskRow:
    """Aggregate one task's attempts; pass@k is defined for k up to its scored attempts."""
    scored = [o for o in outcomes if o.is_scored]
    n = len(scored)
    c = sum(1 for o in scored if o.passed)
    rewards = [o.reward for o in scored if o.reward is not None]
    row = TaskRow(
        task_id=task_id, n=n, passed=c,
        infra_failures=sum(1 for o in outcomes if o.is_infra_failure),
        plugin_errors=sum(1 for o in outcomes if o.is_plugin_failure),
        mean_reward=(sum(rewards) / len(rewards)) if rewards else None,
    )
    for k in range(1, min(max_k, n) + 1):
        row.pass_at[k] = pass_at_k(n, c, k)
        row.pass_hat[k] = pass_hat_k(n, c, k)
    return row


def summarize(outcomes: Iterable[AttemptOutcome], max_k: int,
              task_ids: Iterable[str] = ()) -> MetricsSummary:
    """Per-task rows and run-level curves for k = 1..max_k.

    `task_ids` lists tasks to include even when they have no attempt yet (shown with n = 0).
    """
    by_task: dict[str, list[AttemptOutcome]] = {t: [] for t in task_ids}
    all_outcomes = list(outcomes)
    for o in all_outcomes:
        by_task.setdefault(o.task_id, []).append(o)
    rows = [task_row(t, by_task[t], max_k) for t in by_task]
    summary = MetricsSummary(
        tasks=len(rows), attempts=len(all_outcomes),
        scored=sum(r.n for r in rows), passed=sum(r.passed for r in rows),
        infra_failures=sum(r.infra_failures for r in rows),
        plugin_errors=sum(r.plugin_errors for r in rows), rows=rows,
    )
    rewards = [o.reward for o in all_outcomes if o.is_scored and o.reward is not None]
    summary.mean_reward = sum(rewards) / len(rewards) if rewards else None
    for k in range(1, max_k + 1):
        eligible = [r for r in rows if k in r.pass_at]
        if eligible:
            summary.pass_at[k] = sum(r.pass_at[k] for r in eligible) / len(eligible)
            summary.pass_hat[k] = sum(r.pass_hat[k] for r in eligible) / len(eligible)
    return summary
