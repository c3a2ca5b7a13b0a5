"""veRL integration (`pip install 'openforge[verl]'`, veRL 0.9.x): agent loop and launcher.

**Agent loop** (`OpenforgeAgentLoop`, an `AgentLoopBase`): veRL calls `run()` once per dataset
row and rollout. It opens a session on a recording gateway shared by all loops of the
worker (one per event loop; its engine is `VerlEngine` over veRL's `LLMServerClient`), runs
the rollout through the same rollout stack as `openforge run` (`openforge.attempts`: checked
results, infrastructure retries), and returns the recorded trajectory as `list[AgentLoopOutput]`: one output per
branch of the session (`trajectory.build_samples`), each with the rollout's `reward_score`,
the response mask (1 on generated tokens) and the engine's logprobs. A list needs veRL's v1
trainer (`trainer.use_v1=true`, its default), whose GRPO uses the last output of a session for
the group statistics and gives its advantage to the others.

**Launcher** (`VerlTrainer`, `openforge train --backend verl --config FILE`): writes the
dataset parquet from the environment's tasks, the agent-loop YAML and the openforge run
config into `options.output_dir`, then runs `python -m verl.trainer.main_ppo` with the Hydra
overrides listed in `VerlOptions` (every knob it sets is a field there, with its meaning).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from openforge.config import RunConfig
from openforge.errors import OpenforgeError
from openforge.export import ground_truth_text
from openforge.options import check_options
from openforge.trainer import Trainer
from openforge.types import Sample, SamplingParams, Task

AGENT_NAME = "openforge_agent"
AGENT_LOOP_TARGET = "openforge.training.verl.OpenforgeAgentLoop"

try:  # the agent loop class only exists where veRL imports
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
    )
except Exception:  # noqa: BLE001 - any import failure means "no veRL here"
    AgentLoopBase = object  # type: ignore[assignment,misc]
    AgentLoopMetrics = AgentLoopOutput = None  # type: ignore[assignment,misc]


# -- the gateway shared by the agent loops of one veRL worker ---------------------------------


class _SharedRollouts:
    """Gateway + store + executor (one rollout stack) for every agent loop on one event loop."""

    def __init__(self, config: RunConfig, gateway: Any, store: Any, executor: Any,
                 work_dir: Path | None = None) -> None:
        from openforge.attempts import RolloutStack

        self.config = config
        self.gateway = gateway
        self.store = store
        self.executor = executor
        if work_dir is not None:
            executor.protect(work_dir)
        self.stack = RolloutStack(gateway, executor, config)

    @property
    def engine(self) -> Any:
        return self.gateway.engine


_SHARED: dict[int, _SharedRollouts] = {}
_SHARED_LOCKS: dict[int, asyncio.Lock] = {}


async def shared_rollouts(config: RunConfig, client: Any, model_path: str,
                          work_dir: Path) -> _SharedRollouts:
    """The worker's gateway (started on first use); its engine uses `client`."""
    from openforge.gateway.model import load_model_bundle
    from openforge.gateway.server import Gateway
    from openforge.rollout import build_plugin
    from openforge.store import Store
    from openforge.training.verl_engine import VerlEngine

    key = id(asyncio.get_running_loop())
    lock = _SHARED_LOCKS.setdefault(key, asyncio.Lock())
    async with lock:
        shared = _SHARED.get(key)
        if shared is None:
            work_dir.mkdir(parents=True, exist_ok=True)
            bundle = await asyncio.to_thread(load_model_bundle, model_path, config.engine.renderer)
            store = Store(work_dir / f"store-{uuid.uuid4().hex[:8]}.sqlite")
            engine = VerlEngine(bundle, client=client)
            gateway = Gateway(config.gateway, config.engine, store, engine=engine, bundle=bundle)
            await gateway.start()
            executor = build_plugin("executor", config.executor, config.executor_options)
            shared = _SHARED[key] = _SharedRollouts(config, gateway, store, executor, work_dir)
        shared.engine.client = client  # the worker's client; the same object in practice
        return shared


def pause_gateways(retry_after_s: int = 5) -> None:
    """Answer model calls with 429 + Retry-After on every shared gateway (weight sync)."""
    for shared in _SHARED.values():
        shared.gateway.pause(retry_after_s)


def resume_gateways() -> None:
    for shared in _SHARED.values():
        shared.gateway.resume()


async def close_shared_rollouts() -> None:
    """Stop this event loop's gateway (tests, worker shutdown)."""
    shared = _SHARED.pop(id(asyncio.get_running_loop()), None)
    if shared is not None:
        await shared.executor.close()
        await shared.gateway.stop()
        shared.store.close()


# -- rows and outputs -----------------------------------------------------------------------


def task_row(task: Task, index: int, split: str) -> dict[str, Any]:
    """One veRL dataset row for `task` (the Task travels whole in extra_info.task_json)."""
    return {
        "data_source": task.environment or "openforge",
        "prompt": [{"role": "user", "content": task.prompt}],
        "ability": "agent",
        "reward_model": {"style": "rule",
                         "ground_truth": ground_truth_text(task.data.get("ground_truth"))},
        "extra_info": {"index": index, "split": split, "task_id": task.id,
                       "task_json": task.model_dump_json()},
        "agent_name": AGENT_NAME,
    }


def row_task(row: dict[str, Any]) -> Task:
    """The Task of a dataset row (written by `task_row`, or any row with a user prompt)."""
    extra = row.get("extra_info") or {}
    if isinstance(extra, dict) and extra.get("task_json"):
        return Task.model_validate_json(extra["task_json"])
    messages = row.get("raw_prompt") or row.get("prompt") or []
    users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ValueError("dataset row has neither extra_info.task_json nor a user message")
    task_id = str(extra.get("task_id", extra.get("index", uuid.uuid4().hex[:8])))
    return Task(id=task_id, prompt=str(users[-1]))


def clip_sample(sample: Sample, prompt_length: int, response_length: int) -> tuple[Sample, bool]:
    """Fit a sample into veRL's fixed prompt / response widths; True when it was cut.

    The response is cut at the end (as an over-long generation would be); a prompt that does
    not fit keeps its last `prompt_length` tokens, and the sample is flagged.
    """
    cut = len(sample.response_ids) > response_length or len(sample.prompt_ids) > prompt_length
    if not cut:
        return sample, False
    return sample.model_copy(update={
        "prompt_ids": sample.prompt_ids[-prompt_length:],
        "response_ids": sample.response_ids[:response_length],
        "response_mask": sample.response_mask[:response_length],
        "response_logprobs": sample.response_logprobs[:response_length],
    }), True


def to_outputs(samples: list[Sample], reward: float, fallback_prompt: list[int],
               steps: tuple[int, int], prompt_length: int, response_length: int,
               extra: dict[str, Any], elapsed_s: float) -> list[Any]:
    """The trajectory's samples as veRL `AgentLoopOutput`s (one per branch, all rewarded).

    A rollout without any recorded call (the harness failed before asking the model) still
    yields one output, with a single masked token, so that its reward counts in its group.
    """
    outputs = []
    if not samples:
        samples = [Sample(sample_id="empty", session_id="", prompt_ids=fallback_prompt or [0],
                          response_ids=[fallback_prompt[-1] if fallback_prompt else 0],
                          response_mask=[0], response_logprobs=[0.0])]
    for sample in samples:
        fitted, cut = clip_sample(sample, prompt_length, response_length)
        outputs.append(AgentLoopOutput(
            prompt_ids=list(fitted.prompt_ids), response_ids=list(fitted.response_ids),
            response_mask=list(fitted.response_mask),
            response_logprobs=list(fitted.response_logprobs), reward_score=float(reward),
            num_turns=2 * fitted.num_turns + 1,
            metrics=AgentLoopMetrics(generate_sequences=elapsed_s),
            extra_fields={**extra, "min_global_steps": steps[0], "max_global_steps": steps[1],
                          "openforge_truncated": cut, "openforge_branch": fitted.branch}))
    return outputs


class OpenforgeAgentLoop(AgentLoopBase):  # type: ignore[misc,valid-type]
    """veRL agent loop that runs one openforge rollout per call (see the module docstring).

    YAML kwargs: `run_config` (path of an openforge run config: harness, environment,
    reward, executor, gateway, sampling.max_tokens) and `work_dir` (stores of the recorded
    calls; default: a temp dir).
    """

    def __init__(self, *args: Any, run_config: str | None = None, work_dir: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.pop("tools", None)
        super().__init__(*args, **kwargs)
        from openforge.config import load_run_config

        self.run_config = load_run_config(Path(run_config)) if run_config else RunConfig()
        self.work_dir = Path(work_dir) if work_dir else Path("/tmp/openforge-verl")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[Any]:
        from openforge.trajectory import build_samples

        started = time.monotonic()
        cfg = self.run_config
        model_path = str(self.config.actor_rollout_ref.model.path)
        shared = await shared_rollouts(cfg, self.server_manager, model_path, self.work_dir)
        task = row_task(kwargs)
        sampling = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                                  top_p=float(sampling_params.get("top_p", 1.0)),
                                  max_tokens=cfg.sampling.max_tokens)
        attempt = await shared.stack.attempt(task, 0, "verl", sampling=sampling)
        result, session = attempt.result, attempt.session
        reward = result.reward.score if result.is_scored and result.reward is not None else 0.0
        calls = shared.store.list_calls(session.id)
        samples = build_samples(calls, session, reward).samples if calls else []
        if not result.is_scored:
            # An infrastructure failure or a plugin error: never a reward. veRL cannot drop
            # a row: keep the trajectory out of the loss (mask 0) instead.
            samples = [s.model_copy(update={"response_mask": [0] * len(s.response_mask)})
                       for s in samples]
        steps = shared.engine.global_steps(session.id)
        extra = {"openforge_session_id": session.id, "openforge_task_id": task.id,
                 "openforge_status": result.status, "openforge_error": result.error,
                 "openforge_passed": bool(result.reward and result.reward.passed)}
        prompt_ids = list(shared.gateway.bundle.tokenizer.encode(task.prompt))
        return to_outputs(samples, reward, prompt_ids, steps,
                          int(self.rollout_config.prompt_length),
                          int(self.rollout_config.response_length), extra,
                          time.monotonic() - started)


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any] | None = None, **_: Any) -> float:
    """veRL reward hook; only consulted when a loop left `reward_score` unset (never here)."""
    return 1.0 if (extra_info or {}).get("openforge_passed") else 0.0


# -- the launcher ----------------------------------------------------------------------------


class VerlOptions(BaseModel):
    """`TrainConfig.options` for `--backend verl`; each field becomes the Hydra override named."""

    model_config = ConfigDict(extra="forbid")

    output_dir: Path = Path("runs/verl")
    model_path: str | None = None  # actor_rollout_ref.model.path (default: run.engine.model)
    rollout_engine: str = "vllm"  # actor_rollout_ref.rollout.name
    n: int = Field(default=8, ge=1)  # actor_rollout_ref.rollout.n: rollouts per task (GRPO group)
    train_batch_size: int = Field(default=16, ge=1)  # data.train_batch_size: tasks per step
    ppo_mini_batch_size: int = Field(default=16, ge=1)  # actor.ppo_mini_batch_size
    micro_batch_size_per_gpu: int = Field(default=2, ge=1)  # actor/rollout/ref log-prob micro batch
    max_prompt_length: int = 4096  # data.max_prompt_length = rollout.prompt_length
    max_response_length: int = 8192  # data.max_response_length = rollout.response_length
    kl_loss_coef: float = 0.0  # actor.use_kl_loss (when > 0), actor.kl_loss_coef (low_var_kl)
    clip_ratio_low: float = 0.2  # actor.clip_ratio_low
    clip_ratio_high: float = 0.28  # actor.clip_ratio_high
    loss_agg_mode: str = "token-mean"  # actor.loss_agg_mode
    gpu_memory_utilization: float = 0.5  # rollout.gpu_memory_utilization
    tensor_parallel_size: int = 1  # rollout.tensor_model_parallel_size
    n_gpus_per_node: int = 1  # trainer.n_gpus_per_node
    nnodes: int = 1  # trainer.nnodes
    num_workers: int = 8  # rollout.agent.num_workers: agent-loop workers (each one gateway)
    save_freq: int = 20  # trainer.save_freq
    test_freq: int = -1  # trainer.test_freq
    loggers: list[str] = Field(default_factory=lambda: ["console"])  # trainer.logger
    project_name: str = "openforge"  # trainer.project_name
    experiment_name: str = "openforge-grpo"  # trainer.experiment_name
    extra_overrides: list[str] = Field(default_factory=list)  # appended verbatim, win last
    dry_run: bool = False  # write the files and print the command, do not launch


def write_dataset(tasks: list[Task], path: Path, split: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([task_row(t, i, split) for i, t in enumerate(tasks)]), path)
    return path


def hydra_overrides(opts: VerlOptions, config: Any, files: dict[str, Path]) -> list[str]:
    """The Hydra overrides for veRL's main_ppo (GRPO through the openforge agent loop)."""
    model = opts.model_path or config.run.engine.model
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    out = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={files['train']}",
        # No held-out tasks: veRL still wants a val dataset, but validation never runs.
        f"data.val_files={files.get('val', files['train'])}",
        "data.prompt_key=prompt",
        "data.return_raw_chat=true",
        f"data.train_batch_size={opts.train_batch_size}",
        f"data.max_prompt_length={opts.max_prompt_length}",
        f"data.max_response_length={opts.max_response_length}",
        f"actor_rollout_ref.model.path={model}",
        f"{actor}.optim.lr={config.learning_rate}",
        f"{actor}.ppo_mini_batch_size={opts.ppo_mini_batch_size}",
        f"{actor}.ppo_micro_batch_size_per_gpu={opts.micro_batch_size_per_gpu}",
        f"{actor}.use_kl_loss={'true' if opts.kl_loss_coef > 0 else 'false'}",
        f"{actor}.kl_loss_coef={opts.kl_loss_coef}",
        f"{actor}.kl_loss_type=low_var_kl",
        f"{actor}.clip_ratio_low={opts.clip_ratio_low}",
        f"{actor}.clip_ratio_high={opts.clip_ratio_high}",
        f"{actor}.loss_agg_mode={opts.loss_agg_mode}",
        f"{rollout}.name={opts.rollout_engine}",
        f"{rollout}.n={opts.n}",
        f"{rollout}.calculate_log_probs=true",
        f"{rollout}.gpu_memory_utilization={opts.gpu_memory_utilization}",
        f"{rollout}.tensor_model_parallel_size={opts.tensor_parallel_size}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={opts.micro_batch_size_per_gpu}",
        f"{rollout}.agent.num_workers={opts.num_workers}",
        f"{rollout}.agent.agent_loop_config_path={files['agent_loops']}",
        f"{rollout}.agent.default_agent_loop={AGENT_NAME}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={opts.micro_batch_size_per_gpu}",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={config.steps}",
        f"trainer.n_gpus_per_node={opts.n_gpus_per_node}",
        f"trainer.nnodes={opts.nnodes}",
        f"trainer.save_freq={opts.save_freq}",
        f"trainer.test_freq={opts.test_freq if 'val' in files else -1}",
        "trainer.logger=[" + ",".join(opts.loggers) + "]",
        f"trainer.project_name={opts.project_name}",
        f"trainer.experiment_name={opts.experiment_name}",
        f"trainer.default_local_dir={Path(opts.output_dir).resolve() / 'checkpoints'}",
    ]
    if "val" not in files:
        out.append("trainer.val_before_train=false")
    return out + list(opts.extra_overrides)


class VerlTrainer(Trainer):
    """`openforge train --backend verl`: dataset + agent-loop config, then veRL's main_ppo."""

    options_model = VerlOptions

    def prepare(self, config: Any) -> tuple[list[str], VerlOptions]:
        """Write the files veRL needs; returns the command line and the options."""
        from openforge.rollout import build_plugin

        if config.algorithm != "grpo":
            raise OpenforgeError(f"algorithm {config.algorithm!r}: the verl backend runs grpo; "
                                 "use --backend local for sft")
        opts = check_options(VerlOptions, config.options, "trainer 'verl'")
        out = Path(opts.output_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        run = config.run
        env = build_plugin("environment", run.environment, run.environment_options)
        try:
            train = list(env.tasks(run.split or "train"))
            # Only tasks the environment marks `test` are held out; one that does not split
            # its tasks returns them all for any split, and those are not a validation set.
            val = [t for t in env.tasks("test") if t.split == "test"]
        finally:
            env.close()
        if not train:
            raise OpenforgeError(f"environment '{run.environment}' yielded no training tasks")
        run_file = out / "openforge_run.yaml"
        run_file.write_text(yaml.safe_dump(run.model_dump(mode="json"), sort_keys=False))
        loops = out / "agent_loops.yaml"
        loops.write_text(yaml.safe_dump([{"name": AGENT_NAME, "_target_": AGENT_LOOP_TARGET,
                                          "run_config": str(run_file),
                                          "work_dir": str(out / "rollouts")}], sort_keys=False))
        files = {"train": write_dataset(train, out / "train.parquet", "train"), "agent_loops": loops}
        if val:
            files["val"] = write_dataset(val, out / "val.parquet", "test")
        else:
            (out / "val.parquet").unlink(missing_ok=True)  # from an earlier run with a split
            print("no held-out tasks (the environment has no `test` split): veRL's validation "
                  "is off")
        command = [sys.executable, "-m", "verl.trainer.main_ppo",
                   *hydra_overrides(opts, config, files)]
        (out / "command.sh").write_text(" ".join(shlex.quote(c) for c in command) + "\n")
        (out / "overrides.json").write_text(json.dumps(command[3:], indent=1) + "\n")
        return command, opts

    def train(self, config: Any) -> None:
        command, opts = self.prepare(config)
        print(f"veRL command written to {Path(opts.output_dir).resolve() / 'command.sh'}")
        if opts.dry_run:
            print(" ".join(shlex.quote(c) for c in command))
            return
        try:
            import verl  # noqa: F401
        except ImportError:
            raise OpenforgeError("veRL is not installed: pip install 'openforge[verl]' "
                                 "(or set options.dry_run=true to only write the files)") from None
        code = subprocess.call(command)
        if code != 0:
            raise OpenforgeError(f"veRL exited with code {code}; its log is above")
