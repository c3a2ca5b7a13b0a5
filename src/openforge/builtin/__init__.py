"""The plugins that ship with openforge, registered exactly like external ones.

This module is declared under the `openforge` entry-point group in openforge's own
pyproject.toml. Implementations are imported only when used, so `openforge plugins` and
`openforge --help` stay fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from openforge.hookspecs import Register, hookimpl


def _lazy(target: str) -> Callable[..., Any]:
    """A factory that imports `module:attr` on first call and builds it."""
    module_name, attr = target.split(":")

    def factory(**options: Any) -> Any:
        return getattr(importlib.import_module(module_name), attr)(**options)

    factory.__qualname__ = factory.__name__ = attr
    return factory


@hookimpl
def register_harnesses(register: Register) -> None:
    register("mini", _lazy("openforge.builtin.mini:MiniHarness"),
             "A small ReAct-style agent on the official openai SDK, with shell and write_file tools.")


@hookimpl
def register_environments(register: Register) -> None:
    register("demo", _lazy("openforge.builtin.demo:DemoEnvironment"),
             "Small workspace tasks (files, commands, a failing script) with programmatic checkers.")


@hookimpl
def register_rewards(register: Register) -> None:
    register("checker", _lazy("openforge.builtin.checker:CheckerReward"),
             "The environment's own programmatic checker: 1.0 when it passes, else its partial score.")


@hookimpl
def register_executors(register: Register) -> None:
    register("local", _lazy("openforge.executors.local:LocalExecutor"),
             "One process group per rollout, isolated HOME and temp dir, hard timeout (bubblewrap when installed).")
    register("kubernetes", _lazy("openforge.executors.kubernetes:KubernetesExecutor"),
             "One bare Pod per attempt on a Kubernetes cluster (needs the openforge kubernetes extra).")


@hookimpl
def register_engines(register: Register) -> None:
    register("local", _lazy("openforge.gateway.engines.local:LocalEngine"),
             "A transformers model in this process (CPU or one GPU): ids and logprobs.")
    register("scripted", _lazy("openforge.gateway.engines.scripted:ScriptedEngine"),
             "Replies from a script file, tokenized with the session's tokenizer (tests, demos).")
    register("vllm", _lazy("openforge.gateway.engines.vllm:VLLMEngine"),
             "A vLLM server, token in / token out over HTTP.")
    register("litellm", _lazy("openforge.gateway.engines.litellm_engine:LiteLLMEngine"),
             "Hosted providers through litellm; text only, calls flagged exact_tokens=false.")


@hookimpl
def register_trainers(register: Register) -> None:
    register("local", _lazy("openforge.training.local:LocalTrainer"),
             "GRPO / SFT for a transformers model on one machine (CPU or one GPU), veRL's math.")
    register("verl", _lazy("openforge.training.verl:VerlTrainer"),
             "veRL PPO/GRPO on a GPU cluster; openforge runs each rollout (pip install 'openforge[verl]').")
