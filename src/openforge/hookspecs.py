"""The whole plugin surface of openforge, on one page.

A plugin is a Python module (usually in its own distribution) that implements one or more
of these hooks and is declared under the `openforge` entry-point group::

    [project.entry-points.openforge]
    my_harness = "my_package.plugin"

Every hook has the same shape: it receives a `register(name, factory)` callable and calls
it once per thing it provides. `factory(**options)` must return an instance of the kind's
base class; its docstring's first line is what `openforge plugins` shows. Names are unique
per kind across all installed plugins: two plugins registering the same name is an error.

The built-in plugins (harness `mini`, environment `demo`, reward `checker`, executor
`local`, the engines, the local trainer and the `demo` recipe) are registered through this
very mechanism, from `openforge.builtin.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("openforge")
hookimpl = pluggy.HookimplMarker("openforge")

Register = Callable[..., Any]


@hookspec
def register_harnesses(register: Register) -> None:
    """Register agent harnesses: programs that run one agent headlessly on one task.

    A harness (subclass of `openforge.harness.Harness`) declares the wire API it speaks
    (`chat`, `responses` or `messages`), checks that its program is installed (and says how
    to install it when it is not), writes its own configuration into the rollout's isolated
    HOME, builds the command line and environment that point it at the session URL with the
    session token as API key, and parses the program's final output into a `HarnessOutput`.

    Example::

        @hookimpl
        def register_harnesses(register):
            register("codex", CodexHarness)
    """


@hookspec
def register_environments(register: Register) -> None:
    """Register environments: task sources plus workspace preparers.

    An environment (subclass of `openforge.environment.Environment`) yields `Task`s, prepares
    the workspace a rollout starts in (files, local mock services, a browser), and captures
    the final state that rewards read once the harness has finished.
    """


@hookspec
def register_rewards(register: Register) -> None:
    """Register rewards: scorers of finished rollouts.

    A reward (subclass of `openforge.reward.Reward`) reads the task, the environment's final
    state and, when it wants, the recorded trajectory, and returns a
    `RewardResult(score in [0, 1], passed, details)`. Judge-model calls a reward makes are not
    training data and must not go through the session's gateway URL.
    """


@hookspec
def register_executors(register: Register) -> None:
    """Register executors: where and how rollouts run in isolation.

    An executor (subclass of `openforge.executor.Executor`) takes a `RolloutSpec`, runs
    `python -m openforge.rollout SPEC` in a sandbox of its own (a process group with its own
    HOME, a Kubernetes Pod, ...), enforces the hard timeout, leaves nothing behind, and
    returns a `RolloutResult`. Infrastructure failures are reported with status
    `infra_error` or `timeout`, never as a reward of 0.
    """


@hookspec
def register_engines(register: Register) -> None:
    """Register engines: where the gateway gets tokens from.

    An engine (subclass of `openforge.gateway.engines.base.Engine`) turns prompt token ids
    into completion token ids with one logprob each (`local`, `vllm`, `scripted`), or, for
    text-only providers (`litellm`), a completion whose ids are flagged `exact_tokens=False`.
    """


@hookspec
def register_trainers(register: Register) -> None:
    """Register trainers: backends that turn recorded samples into better weights.

    A trainer (subclass of `openforge.trainer.Trainer`) consumes `Sample`s in the shared
    format (`local` GRPO/SFT on one machine, `verl` on GPU clusters) and is launched by
    `openforge train --backend NAME`.
    """


@hookspec
def register_recipes(register: Register) -> None:
    """Register training recipes: whole pipelines run by `openforge train --recipe NAME`.

    A recipe (subclass of `openforge.recipe.Recipe`) reads its own knobs from the config file
    and `--set key=value` overrides in `run(config_path, overrides, console)`, runs every
    phase, and returns a JSON-ready summary (the built-in `demo` recipe is registered so).
    """
