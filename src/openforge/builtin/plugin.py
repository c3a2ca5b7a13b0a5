"""The plugins that ship with openforge, registered exactly like external ones.

This module is declared under the `openforge` entry-point group in openforge's own
pyproject.toml (as `builtin`). Implementations are imported only when used, so `openforge plugins` and
`openforge --help` stay fast.
"""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_harnesses(register: Register) -> None:
    register("mini", lazy("openforge.builtin.mini:MiniHarness"),
             "A small ReAct-style agent on the official openai SDK, with shell and write_file tools.")


@hookimpl
def register_environments(register: Register) -> None:
    register("demo", lazy("openforge.builtin.demo:DemoEnvironment"),
             "Small workspace tasks (files, commands, a failing script) with programmatic checkers.")
    register("tasks", lazy("openforge.builtin.tasks:TasksEnvironment"),
             "Your task set from JSONL / YAML / JSON files, a folder, or a `datasets` dataset; "
             "checked by a command, a file comparison or a Python function.")


@hookimpl
def register_rewards(register: Register) -> None:
    register("checker", lazy("openforge.builtin.checker:CheckerReward"),
             "The environment's own programmatic checker: 1.0 when it passes, else its partial score.")


@hookimpl
def register_executors(register: Register) -> None:
    register("local", lazy("openforge.executors.local:LocalExecutor"),
             "One process group per rollout, isolated HOME and temp dir, hard timeout (bubblewrap when installed).")
    register("kubernetes", lazy("openforge.executors.kubernetes:KubernetesExecutor"),
             "One bare Pod per attempt on a Kubernetes cluster (needs the openforge kubernetes extra).")


@hookimpl
def register_engines(register: Register) -> None:
    register("local", lazy("openforge.gateway.engines.local:LocalEngine"),
             "A transformers model in this process (CPU or one GPU): ids and logprobs.")
    register("scripted", lazy("openforge.gateway.engines.scripted:ScriptedEngine"),
             "Replies from a script file, tokenized with the session's tokenizer (tests, demos).")
    register("vllm", lazy("openforge.gateway.engines.vllm:VLLMEngine"),
             "A vLLM server, token in / token out over HTTP.")
    register("litellm", lazy("openforge.gateway.engines.litellm_engine:LiteLLMEngine"),
             "Hosted providers through litellm; text only, calls flagged exact_tokens=false.")


@hookimpl
def register_trainers(register: Register) -> None:
    register("local", lazy("openforge.training.local:LocalTrainer"),
             "GRPO / SFT for a transformers model on one machine (CPU or one GPU), veRL's math.")
    register("verl", lazy("openforge.training.verl:VerlTrainer"),
             "veRL PPO/GRPO on a GPU cluster; openforge runs each rollout (pip install 'openforge[verl]').")


@hookimpl
def register_recipes(register: Register) -> None:
    register("demo", lazy("openforge.training.recipes:DemoRecipeRunner"),
             "SFT then GRPO of a small model on the demo tasks, on 2 CPU cores in minutes.")
