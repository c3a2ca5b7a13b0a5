"""The `claw` training recipe: `openforge train --recipe claw [--config F] [--set k=v ...]`.

It writes two train configs into `output_dir` and launches the one `backend` names:

- `verl.yaml` (`backend: verl`): GRPO with veRL for a Qwen-family model (default
  Qwen/Qwen3-4B-Instruct-2507) on the claw train split, rollouts through the harness
  (default OpenClaw) with the `claw-grader` reward, `n` rollouts per task; veRL's own files
  (datasets, Hydra overrides, command.sh) go to `output_dir/verl/`;
- `local.yaml` (`backend: local`): the same loop for small models on one machine with the
  built-in local trainer (default model `tiny`, the `mini` harness).

`launch: false` only writes (and, for veRL, prepares) the configs. Every field below is
settable with `--set`, e.g. `--set backend=local --set local_model=Qwen/Qwen3-0.6B`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from openforge.config import EngineConfig, RunConfig, TrainConfig, build_config
from openforge.recipe import Recipe
from openforge.types import SamplingParams
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console


class ClawRecipeConfig(BaseModel):
    """The knobs of the `claw` recipe."""

    model_config = ConfigDict(extra="forbid")

    output_dir: Path = Path("runs/train-claw")
    backend: Literal["verl", "local"] = "verl"
    launch: bool = True
    # veRL: a Qwen-family model served by vLLM inside veRL.
    model: str = "Qwen/Qwen3-4B-Instruct-2507"
    harness: str = "openclaw"
    harness_options: dict[str, Any] = Field(default_factory=dict)
    environment_options: dict[str, Any] = Field(default_factory=dict)  # e.g. path=your tasks
    reward: str = "claw-grader"
    n: int = Field(default=8, ge=2)  # rollouts per task (GRPO group)
    train_batch_size: int = Field(default=16, ge=1)  # tasks per step
    steps: int = Field(default=200, ge=1)
    learning_rate: float = 1e-6
    max_prompt_length: int = 16384  # claw conversations are long (tool outputs)
    max_response_length: int = 4096
    n_gpus_per_node: int = Field(default=8, ge=1)
    nnodes: int = Field(default=1, ge=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    timeout_s: float = 600.0
    concurrency: int = Field(default=16, ge=1)
    temperature: float = 1.0
    # local trainer: small models on one machine.
    local_model: str = "tiny"
    local_harness: str = "mini"
    local_k: int = Field(default=4, ge=2)
    local_steps: int = Field(default=20, ge=1)
    local_learning_rate: float = 1e-5
    local_tasks_per_step: int = Field(default=4, ge=1)
    local_max_tokens: int = Field(default=256, ge=16)
    local_concurrency: int = Field(default=2, ge=1)


def verl_config(r: ClawRecipeConfig) -> TrainConfig:
    run = RunConfig(harness=r.harness, harness_options=r.harness_options, environment="claw",
                    environment_options=r.environment_options, split="train", reward=r.reward,
                    engine=EngineConfig(name="verl", model=r.model), k=r.n,
                    concurrency=r.concurrency, timeout_s=r.timeout_s,
                    sampling=SamplingParams(temperature=r.temperature,
                                            max_tokens=r.max_response_length))
    return TrainConfig(backend="verl", run=run, algorithm="grpo", steps=r.steps,
                       learning_rate=r.learning_rate, options={
                           "output_dir": str(r.output_dir / "verl"), "model_path": r.model,
                           "n": r.n, "train_batch_size": r.train_batch_size,
                           "ppo_mini_batch_size": r.train_batch_size,
                           "max_prompt_length": r.max_prompt_length,
                           "max_response_length": r.max_response_length,
                           "n_gpus_per_node": r.n_gpus_per_node, "nnodes": r.nnodes,
                           "tensor_parallel_size": r.tensor_parallel_size,
                           "num_workers": r.concurrency, "experiment_name": "openforge-claw",
                           "dry_run": not r.launch})


def local_config(r: ClawRecipeConfig) -> TrainConfig:
    run = RunConfig(harness=r.local_harness,
                    harness_options={"max_steps": 8, "max_tokens": r.local_max_tokens}
                    if r.local_harness == "mini" else {},
                    environment="claw", environment_options=r.environment_options,
                    split="train", reward=r.reward,
                    engine=EngineConfig(name="local", model=r.local_model), k=r.local_k,
                    concurrency=r.local_concurrency, timeout_s=r.timeout_s,
                    sampling=SamplingParams(temperature=r.temperature,
                                            max_tokens=r.local_max_tokens))
    return TrainConfig(backend="local", run=run, algorithm="grpo", steps=r.local_steps,
                       learning_rate=r.local_learning_rate,
                       options={"output_dir": str(r.output_dir / "local"),
                                "tasks_per_step": r.local_tasks_per_step})


def write_configs(r: ClawRecipeConfig) -> dict[str, Path]:
    r.output_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, config in (("verl", verl_config(r)), ("local", local_config(r))):
        path = r.output_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        paths[name] = path
    return paths


class ClawRecipe(Recipe):
    """Train claw agents: veRL config for a Qwen model, or the local trainer for small models."""

    def run(self, config_path: Path | None, overrides: list[str] | tuple[str, ...],
            console: Console) -> dict[str, Any]:
        from openforge import plugins

        r = build_config(ClawRecipeConfig, config_path, overrides)
        paths = write_configs(r)
        console.print(f"claw recipe: wrote {paths['verl']} and {paths['local']}", markup=False)
        config = verl_config(r) if r.backend == "verl" else local_config(r)
        summary: dict[str, Any] = {"backend": r.backend, "configs": {k: str(v) for k, v in
                                                                     paths.items()},
                                   "launched": r.launch}
        if r.backend == "verl" or r.launch:
            # veRL with launch false: dry run, writes its datasets and command.sh only.
            plugins.create("trainer", r.backend).train(config)
        return summary
