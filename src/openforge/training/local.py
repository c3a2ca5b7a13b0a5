"""The `local` trainer: GRPO and SFT for a transformers model on one machine (CPU or one GPU).

`openforge train` (backend `local`, the default) does one of:

- **online GRPO** (`algorithm: grpo`, no `options.data`): each step runs `tasks x k`
  rollouts of `run` (harness, environment, reward, executor) through one long-lived
  gateway whose `local` engine serves the policy, builds samples from the recorded calls,
  takes one GRPO step, and loads the new weights into the engine (weight version = step);
- **offline** training on an exported parquet (`options.data`, written by
  `openforge export --format samples`): SFT (`algorithm: sft`) on the generated tokens
  of each sample, or GRPO on recorded rollouts grouped by task.

Every step appends its metrics to `<output_dir>/metrics.jsonl` (and TensorBoard when
installed), checkpoints go to `<output_dir>/checkpoints/step-N` (servable model folders), a
rerun with the same output directory resumes after the last checkpoint, and the reward
curve is written to `<output_dir>/reward_curve.{png,svg}`.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field
from rich.console import Console

from openforge.config import TrainConfig
from openforge.errors import OpenforgeError
from openforge.options import check_options
from openforge.trainer import Trainer
from openforge.training.metrics_log import MetricsLog, read_metrics
from openforge.training.plot import text_curve, write_curve
from openforge.training.policy import PolicyOptimizer, PolicyOptions, latest_checkpoint
from openforge.types import Sample, Task

CHECKPOINTS = "checkpoints"


class LocalTrainOptions(PolicyOptions):
    """`TrainConfig.options` for the local trainer (its `learning_rate` comes from the config)."""

    model_config = ConfigDict(extra="forbid")

    output_dir: Path = Path("runs/train")
    data: Path | None = None  # offline: an exported parquet (samples format)
    batch_size: int = Field(default=32, ge=1)  # offline: samples per optimizer step
    epochs: int = Field(default=1, ge=1)  # offline SFT: passes over the data
    tasks_per_step: int | None = Field(default=None, ge=1)  # online: tasks per step (None: all)
    checkpoint_every: int = Field(default=1, ge=1)
    keep_checkpoints: int = Field(default=2, ge=1)
    resume: bool = True
    tensorboard: bool = True


def parse_options(config: TrainConfig) -> LocalTrainOptions:
    data = {"learning_rate": config.learning_rate, **config.options}
    return check_options(LocalTrainOptions, data, "trainer 'local'")


def resolve_model_dir(model: str) -> Path:
    """`tiny` -> the built tiny model folder; otherwise a local model folder."""
    if model == "tiny":
        from openforge.tinymodel import ensure_tiny_model

        return ensure_tiny_model()
    path = Path(model).expanduser()
    if not (path / "config.json").exists():
        raise OpenforgeError(f"model {model!r}: not a model folder (no config.json); the local "
                             "trainer needs a local transformers model folder or 'tiny'")
    return path


def load_samples(path: Path) -> list[Sample]:
    """Samples from a `openforge export --format samples` parquet (file or its folder)."""
    from openforge.export import DATA_FILE, iter_rows

    path = Path(path)
    if path.is_dir():
        path = path / DATA_FILE
    if not path.exists():
        raise OpenforgeError(f"{path}: no such file; write it with "
                             "`openforge export RUN_DIR --format samples --out DIR`")
    samples: list[Sample] = []
    for row in iter_rows(path):
        if "response_mask" not in row:
            raise OpenforgeError(f"{path}: not a samples export (no response_mask column); "
                                 "export with --format samples")
        samples.append(Sample.model_validate(row))
    return samples


class TrainingRun:
    """Output folder, policy, metrics log and checkpoints of one training run."""

    def __init__(self, options: LocalTrainOptions, model_dir: Path, console: Console,
                 phase: str) -> None:
        self.options = options
        self.out = Path(options.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.console = console
        self.phase = phase
        resume_from = latest_checkpoint(self.out / CHECKPOINTS) if options.resume else None
        self.policy = PolicyOptimizer(resume_from or model_dir, options)
        self.resume_extra: dict[str, Any] = {}
        if resume_from is not None:
            self.resume_extra = self.policy.load_trainer_state(resume_from)
            console.print(f"resumed from {resume_from} (step {self.policy.step})")
        self.log = MetricsLog(self.out, tensorboard=options.tensorboard)

    @property
    def model_dir(self) -> Path:
        """Where the current weights can be loaded from (the last checkpoint, else the source)."""
        return latest_checkpoint(self.out / CHECKPOINTS) or self.policy.source_dir

    def record(self, metrics: dict[str, Any]) -> None:
        record = {"phase": self.phase, "step": self.policy.step, "time": time.time(), **metrics}
        self.log.log(record)
        shown = "  ".join(f"{k} {v:.3f}" for k, v in metrics.items()
                          if isinstance(v, float) and k in _SHOWN)
        self.console.print(f"[{self.phase}] step {self.policy.step}  {shown}", markup=False)

    def checkpoint(self, force: bool = False, extra: dict[str, Any] | None = None) -> Path | None:
        if not force and self.policy.step % self.options.checkpoint_every:
            return None
        root = self.out / CHECKPOINTS
        path = self.policy.save(root / f"step-{self.policy.step}", extra)
        done = sorted((p for p in root.iterdir() if p.name.startswith("step-")
                       and not p.name.endswith(".partial")),
                      key=lambda p: int(p.name.split("-")[1]) if p.name.split("-")[1].isdigit() else -1)
        for old in done[: -self.options.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def plot(self, key: str = "reward_mean", title: str = "reward") -> Path | None:
        points = [(float(r["step"]), float(r[key])) for r in read_metrics(self.log.path)
                  if r.get("phase") == self.phase and isinstance(r.get(key), (int, float))]
        if not points:
            return None
        for line in text_curve(points):
            self.console.print(line)
        return write_curve(self.out / "reward_curve", {key: points}, title)

    def close(self) -> None:
        self.log.close()


_SHOWN = ("reward_mean", "pass_rate", "sft_loss", "pg_loss", "entropy", "kl_ref", "ppo_kl",
          "groups_with_signal", "tokens")


def _chunks(samples: Sequence[Sample], size: int) -> Iterator[list[Sample]]:
    for i in range(0, len(samples), size):
        yield list(samples[i:i + size])


def train_offline(run: TrainingRun, samples: list[Sample], algorithm: str, steps: int) -> None:
    """SFT (epochs over the data) or GRPO (one step per batch of whole task groups)."""
    opts = run.options
    rng = random.Random(opts.seed)
    if algorithm == "sft":
        trainable = [s for s in samples if any(s.response_mask)]
        total = opts.epochs * -(-len(trainable) // opts.batch_size)
        while run.policy.step < total:
            epoch = run.policy.step // max(1, -(-len(trainable) // opts.batch_size))
            order = trainable[:]
            random.Random(opts.seed + epoch).shuffle(order)
            batches = list(_chunks(order, opts.batch_size))
            index = run.policy.step % len(batches)
            run.record(run.policy.sft_step(batches[index]))
            run.checkpoint()
        return
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(s.task_id or s.rollout_id, []).append(s)
    groups = list(by_task.values())
    while run.policy.step < steps:
        rng.shuffle(groups)
        batch: list[Sample] = []
        for group in groups:
            batch.extend(group)
            if len(batch) >= opts.batch_size:
                break
        rewards = [float(s.reward or 0.0) for s in batch]
        metrics = run.policy.grpo_step(batch)
        metrics["reward_mean"] = sum(rewards) / len(rewards) if rewards else 0.0
        run.record(metrics)
        run.checkpoint()


async def grpo_loop(run: TrainingRun, collector: Any, tasks: list[Task], k: int, steps: int,
                    tag: str) -> None:
    """GRPO with fresh rollouts of the current policy at every step, until `steps` steps.

    `collector` is a started `RolloutCollector` whose `local` engine serves the policy; the
    new weights are loaded into it after each step, stamped with the step number. Each
    step's attempts sample with seeds derived from `options.seed` and the step, so a run
    repeated with the same seed on the same machine draws the same rollouts.
    """
    from openforge.training.rollouts import TrainingError

    opts = run.options
    collector.push_weights(run.policy.state_dict(), run.policy.step)
    while run.policy.step < steps:
        step_seed = opts.seed * 1_000_003 + run.policy.step
        chosen = tasks if opts.tasks_per_step is None else random.Random(step_seed).sample(
            tasks, min(opts.tasks_per_step, len(tasks)))
        rollouts = await collector.collect(chosen, k, f"{tag}-step{run.policy.step}",
                                           seed=step_seed)
        if not rollouts.samples:
            raise TrainingError(f"step {run.policy.step}: no usable rollouts (all "
                                f"{len(rollouts.records)} attempts failed); see "
                                f"{collector.work_dir}")
        started = time.monotonic()
        metrics = await asyncio.to_thread(run.policy.grpo_step, rollouts.samples)
        metrics["train_time_s"] = time.monotonic() - started
        version = collector.push_weights(run.policy.state_dict(), run.policy.step)
        run.record({**rollouts.summary(), **metrics, "weight_version": version})
        run.checkpoint()


async def train_online(run: TrainingRun, config: TrainConfig, tasks: list[Task], steps: int,
                       tag: str) -> None:
    """Start a gateway + engine on the policy's current weights and run `grpo_loop`."""
    from openforge.training.rollouts import RolloutCollector

    engine = config.run.engine.model_copy(update={"model": str(run.model_dir)})
    run_config = config.run.model_copy(update={"engine": engine})
    async with RolloutCollector(run_config, run.out / "rollouts", run.console) as collector:
        await grpo_loop(run, collector, tasks, config.run.k, steps, tag)


class LocalTrainer(Trainer):
    """GRPO / SFT on one machine; see the module docstring."""

    options_model = LocalTrainOptions

    def train(self, config: Any) -> None:
        console = Console()
        options = parse_options(config)
        if config.algorithm not in ("grpo", "sft"):
            raise OpenforgeError(f"algorithm {config.algorithm!r}: the local trainer does grpo or sft")
        model_dir = resolve_model_dir(config.run.engine.model)
        run = TrainingRun(options, model_dir, console, config.algorithm)
        try:
            if options.data is not None:
                train_offline(run, load_samples(options.data), config.algorithm, config.steps)
            elif config.algorithm == "sft":
                raise OpenforgeError("sft needs demonstrations: set options.data to a samples "
                                     "export (openforge export RUN --format samples --out DIR)")
            else:
                from openforge.rollout import build_plugin

                env = build_plugin("environment", config.run.environment,
                                   config.run.environment_options)
                try:
                    from openforge.runner import select_tasks

                    tasks = select_tasks(config.run, list(env.tasks(config.run.split or "train")))
                finally:
                    env.close()
                asyncio.run(train_online(run, config, tasks, config.steps, "train"))
            run.checkpoint(force=True)
            plot = run.plot()
            if plot is not None:
                console.print(f"reward curve: {plot}")
            console.print(f"metrics: {run.log.path}")
        finally:
            run.close()
