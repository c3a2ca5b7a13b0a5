"""The plugin module named in pyproject.toml's `openforge` entry point.

Each `register_<kind>s` hook receives `register(name, factory)`; `factory(**options)`
builds the plugin object. The first line of the factory's docstring is what
`openforge plugins` shows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.harness import Command, Harness, HarnessContext
from openforge.hookspecs import hookimpl
from openforge.options import PluginOptions
from openforge.reward import Reward
from openforge.types import Call, RewardResult, Task


class OneShotOptions(PluginOptions):
    """Options of the `one-shot` harness (`harness_options` in the run config)."""

    max_tokens: int = 64
    """max_tokens of the one model call."""


class OneShotHarness(Harness):
    """Asks the policy once through the OpenAI chat API and prints its answer."""

    wire_api = "chat"
    # openforge validates `harness_options` against this model when it builds the harness:
    # `self.options` is the validated OneShotOptions, and a misspelt option is refused.
    options_model = OneShotOptions
    options: OneShotOptions

    def command(self, ctx: HarnessContext) -> Command:
        # The agent program is a separate process, exactly like a real harness binary:
        # it only knows the endpoint and the key it is given.
        return Command(
            argv=[sys.executable, "-m", "openforge_example.agent", ctx.task.prompt,
                  str(self.options.max_tokens)],
            env={"OPENAI_BASE_URL": ctx.base_url, "OPENAI_API_KEY": ctx.api_key,
                 "EXAMPLE_MODEL": ctx.model},
            cwd=ctx.workspace,
        )


class ArithmeticEnvironment(Environment):
    """Three arithmetic questions; the answer is a number."""

    QUESTIONS = {"add": ("What is 17 + 25?", "42"), "mul": ("What is 6 * 7?", "42"),
                 "sub": ("What is 100 - 58?", "42")}

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for task_id, (prompt, answer) in self.QUESTIONS.items():
            yield Task(id=task_id, prompt=prompt, environment="arithmetic",
                       data={"answer": answer})


class ExactAnswerReward(Reward):
    """1.0 when the harness's final answer contains the expected number."""

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        answer = str(final_state.get("final_answer") or "")
        passed = task.data["answer"] in answer
        return RewardResult(score=1.0 if passed else 0.0, passed=passed,
                            details={"expected": task.data["answer"], "got": answer[-200:]})


@hookimpl
def register_harnesses(register):
    register("one-shot", OneShotHarness)


@hookimpl
def register_environments(register):
    register("arithmetic", ArithmeticEnvironment)


@hookimpl
def register_rewards(register):
    register("exact-answer", ExactAnswerReward)
