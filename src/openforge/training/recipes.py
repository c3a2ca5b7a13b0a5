"""Training recipes for `openforge train --recipe NAME`: whole pipelines in one command.

`demo` (runs on a 2-core CPU in minutes and visibly learns):

1. **teacher**: a noisy scripted teacher (right on `teacher_accuracy` of each family's train
   tasks, a plausible mistake on the rest) runs every train task through the real gateway
   and the `mini` harness; the run is exported with `openforge export` (`sft` chat rows for
   inspection and other trainers, `samples` token rows that this recipe trains on);
2. **sft**: an untrained model (`model: recipe`, a Qwen3 with hidden 128 and 4 layers and the
   real Qwen3 tokenizer) clones all the teacher's demonstrations, mistakes included;
3. **eval**: mean reward on the validation tasks (the train tasks' commands, file names no
   train task uses: every choice of settings is made on these) and on the test tasks (commands
   no train task contains: `demo_tasks` says what they measure) at the SFT checkpoint;
4. **grpo**: GRPO on the train tasks, the `local` engine's weights updated in place after
   every step (the weight version is stamped on each recorded call);
5. **eval**: both again after the last GRPO step; the curve is printed and plotted, and
   `summary.json` holds every number, with the test gain's standard error (paired by task).

Point `model` at a real model folder (and `run.engine` at vLLM for the rollouts) and the same
recipe is the template for a real run. Every field below is settable with `--set`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console

from openforge.config import EngineConfig, RunConfig, build_config
from openforge.errors import OpenforgeError
from openforge.recipe import Recipe
from openforge.training import demo_tasks
from openforge.training.local import LocalTrainOptions, TrainingRun, grpo_loop, load_samples
from openforge.training.plot import text_curve, write_curve
from openforge.training.rollouts import RolloutCollector, StepRollouts
from openforge.types import SamplingParams, Task

# The splits evaluated at the SFT checkpoint and after GRPO (train is what GRPO trains on).
EvalSplit = Literal["validation", "test"]
EVAL_SPLITS: tuple[EvalSplit, ...] = ("validation", "test")


class DemoRecipe(BaseModel):
    """The knobs of the `demo` recipe (defaults: about 13 minutes on 2 CPU cores)."""

    model_config = ConfigDict(extra="forbid")

    output_dir: Path = Path("runs/train-demo")
    # The harness every rollout runs through: the teacher's demonstrations, GRPO and the
    # evaluations alike, so the policy trains on that harness's own traffic. `mini` (the
    # default), or `codex` (the real Codex CLI: the harness-native recipe, docs/training.md).
    harness: str = "mini"
    # None: `harness_options()`'s preset for `harness` (made for the 4-layer model's context).
    harness_options: dict[str, Any] | None = None
    model: str = "recipe"  # "recipe" (hidden 128, 4 layers), "tiny", or a model folder
    fresh: bool = True  # start over (delete output_dir); false resumes finished phases
    train_per_family: int = Field(default=10, ge=1)
    validation_per_family: int = Field(default=3, ge=1)
    test_per_family: int = Field(default=3, ge=1)
    # Families one generic command solves (the prompt names the file; the command need not):
    # a 4-layer model learns them from 40 demonstrations. The name-copying families
    # (count, delete, package, ...) are harder: docs/training.md has the measurements.
    families: list[str] = Field(
        default_factory=lambda: ["clean", "archive", "tally", "empty"])
    pool_size: int = Field(default=5, ge=1, le=len(demo_tasks.TRAIN_NAMES))
    # The teacher is noisy: per family it demonstrates the right command on this fraction of
    # the train tasks and a plausible mistake on the rest. Cloning all its demonstrations
    # (`sft_passed_only: false`) gives a policy that solves about this fraction, mistakes
    # included; GRPO, which sees the rewards, is what removes them.
    teacher_accuracy: float = Field(default=0.5, ge=0.0, le=1.0)
    sft_passed_only: bool = False
    # mini harness: one tool call and a final answer is all any task needs.
    max_steps: int = Field(default=3, ge=2)
    max_tokens: int = Field(default=48, ge=8)
    concurrency: int = Field(default=3, ge=1)
    # Enough epochs for the cloned policy to write well-formed tool calls (SFT loss ~0.03);
    # fewer leave it on the steep part of the curve, where validation reward swings with
    # the demonstrations' order (docs/training.md).
    sft_epochs: int = Field(default=24, ge=1)
    sft_batch_size: int = Field(default=8, ge=1)
    sft_learning_rate: float = 5e-3
    grpo_steps: int = Field(default=12, ge=0)
    grpo_learning_rate: float = 2e-3
    tasks_per_step: int = Field(default=6, ge=1)
    # GRPO's Adam starts from the SFT's variance estimates (zero momentum): see
    # PolicyOptimizer.adopt_second_moments. A fresh Adam's first steps move every weight by
    # about the learning rate, which breaks the tool-call format above lr 2e-4.
    grpo_adam_from_sft: bool = True
    grpo_ppo_epochs: int = Field(default=1, ge=1)
    grpo_mini_batches: int = Field(default=1, ge=1)
    grpo_train_embeddings: bool = True
    k: int = Field(default=4, ge=2)  # attempts per task in a GRPO group
    # Rollouts and evaluations sample at 0.7 (the trainer divides its logits by the same):
    # at 1.0 the 4-layer model's rare malformed tokens cost ~0.15 of reward at every
    # checkpoint and, once GRPO removes the teacher's mistake, take its place on validation
    # prompts (docs/training.md).
    temperature: float = 0.7
    eval_k: int = Field(default=3, ge=1)  # attempts per evaluated task at each evaluation
    # Both evaluations sample attempt j of a task with the same seed (common random
    # numbers): the gain then measures what GRPO changed in the weights, not sampling luck
    # (with unchanged weights it is exactly 0), and its spread over tasks is smaller.
    eval_common_seeds: bool = True
    # The splits evaluated at both checkpoints. `nox -s learn` gates on validation only and
    # skips test (0 at both checkpoints in every seed: docs/training.md), which saves two of
    # the four evaluations.
    eval_splits: list[EvalSplit] = Field(
        default_factory=lambda: list(EVAL_SPLITS), min_length=1)
    seed: int = 0
    use_verl: bool | None = None
    # Intra-op threads for training and the in-process engine. One is fastest on a small,
    # shared CPU: with two, every op's thread barrier waits on the busier core.
    torch_threads: int | None = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _teacher_knows_the_harness(self) -> DemoRecipe:
        if self.harness not in demo_tasks.SHELL_TOOLS:
            raise ValueError(f"harness {self.harness!r}: the demo teacher knows the shell tool "
                             f"of {', '.join(demo_tasks.SHELL_TOOLS)}")
        return self

    @model_validator(mode="after")
    def _adam_needs_the_same_parameters(self) -> DemoRecipe:
        if self.grpo_adam_from_sft and not self.grpo_train_embeddings:
            raise ValueError("grpo_adam_from_sft needs grpo_train_embeddings: true (the SFT's "
                             "Adam state covers the embeddings)")
        return self


# With its own base instructions and optional tools (sub-agents, goals, skills) Codex's
# prompt is 8,666 tokens for a small task: more than the 4-layer model's 4,096-token context.
# Replaced by one line and turned off, it is ~1,950 (docs/harnesses.md); the shell tool
# (`exec_command`), Codex's environment context and its Responses wire format stay as they are.
CODEX_INSTRUCTIONS = ("You are a coding agent in a workspace. Do the task with one shell "
                      "command, then answer Done.")
CODEX_FEATURES_OFF = {"multi_agent": False, "goals": False, "skills": False}


def harness_options(recipe: DemoRecipe) -> dict[str, Any]:
    """The rollouts' harness options: `recipe.harness_options`, else the preset."""
    if recipe.harness_options is not None:
        return recipe.harness_options
    if recipe.harness == "codex":
        return {"instructions": CODEX_INSTRUCTIONS,
                "config": {"features": CODEX_FEATURES_OFF}}
    if recipe.harness == "mini":
        return {"max_steps": recipe.max_steps, "max_tokens": recipe.max_tokens}
    return {}


def _run_config(recipe: DemoRecipe, model_dir: Path, engine: EngineConfig) -> RunConfig:
    return RunConfig(
        harness=recipe.harness, harness_options=harness_options(recipe),
        environment=demo_tasks.ENV_TARGET,
        environment_options={"train_per_family": recipe.train_per_family,
                             "validation_per_family": recipe.validation_per_family,
                             "test_per_family": recipe.test_per_family, "seed": recipe.seed,
                             "families": recipe.families, "pool_size": recipe.pool_size},
        engine=engine, concurrency=recipe.concurrency, timeout_s=120.0,
        sampling=SamplingParams(temperature=recipe.temperature, max_tokens=recipe.max_tokens),
    )


def _model_dir(name: str) -> Path:
    if name == "recipe":
        from openforge.training.recipe_model import ensure_recipe_model

        return ensure_recipe_model()
    from openforge.training.local import resolve_model_dir

    return resolve_model_dir(name)


class DemoPipeline:
    """The five phases of the `demo` recipe, each skipped when its output exists."""

    def __init__(self, recipe: DemoRecipe, console: Console) -> None:
        self.recipe = recipe
        self.console = console
        self.out = Path(recipe.output_dir).resolve()
        self.timings: dict[str, float] = {}
        self.tasks: dict[str, list[Task]] = {}

    def _options(self, phase: str, lr: float, **extra: Any) -> LocalTrainOptions:
        r = self.recipe
        return LocalTrainOptions(output_dir=self.out / phase, learning_rate=lr, seed=r.seed,
                                 temperature=r.temperature, use_verl=r.use_verl,
                                 keep_checkpoints=1, **extra)

    async def teacher(self, model_dir: Path) -> Path:
        from openforge.export import export_run

        samples_dir = self.out / "demos-samples"
        if (samples_dir / "data.parquet").exists():
            return samples_dir
        tasks = self.tasks["train"]
        script = demo_tasks.teacher_script(tasks, self.out / "teacher.yaml",
                                           self.recipe.teacher_accuracy, self.recipe.seed,
                                           self.recipe.harness)
        engine = EngineConfig(name="scripted", model=str(model_dir), options={"script": str(script)})
        work = self.out / "teacher"
        async with RolloutCollector(_run_config(self.recipe, model_dir, engine), work) as collector:
            step = await collector.collect(tasks, 1, "teacher")
        self.console.print(f"[teacher] {len(step.records)} demonstrations, pass rate "
                           f"{step.pass_rate:.2f} ({step.seconds:.0f}s)", markup=False)
        export_run(work, "sft", self.out / "demos-sft")
        export_run(work, "samples", samples_dir)
        return samples_dir

    def sft(self, model_dir: Path, demos: Path) -> Path:
        r = self.recipe
        opts = self._options("sft", r.sft_learning_rate, batch_size=r.sft_batch_size,
                             epochs=r.sft_epochs, checkpoint_every=10_000)
        run = TrainingRun(opts, model_dir, self.console, "sft")
        try:
            samples = load_samples(demos)
            if r.sft_passed_only:
                samples = [s for s in samples if (s.reward or 0.0) >= 1.0]
            if not samples:
                raise OpenforgeError(f"{demos}: no demonstrations to fine-tune on")
            # The export lists rollouts in the order they finished; sort them so that the
            # seeded shuffle (and so the SFT checkpoint) does not depend on that.
            samples.sort(key=lambda s: (s.task_id or "", len(s.prompt_ids), s.response_ids))
            from openforge.training.local import train_offline

            train_offline(run, samples, "sft", 0)
            run.checkpoint(force=True)
        finally:
            run.close()
        return run.model_dir

    async def evaluate(self, collector: RolloutCollector, tag: str) -> dict[str, StepRollouts]:
        """Mean reward on the validation and the test tasks at the current weights."""
        results: dict[str, StepRollouts] = {}
        for split in self.recipe.eval_splits:
            seed = self.recipe.seed if self.recipe.eval_common_seeds else None
            result = await collector.collect(self.tasks[split], self.recipe.eval_k,
                                             f"{split}-{tag}", seed=seed)
            self.console.print(f"[eval {tag}] {split} mean reward {result.mean_reward:.3f}, "
                               f"pass rate {result.pass_rate:.3f} over {len(result.records)} "
                               "attempts", markup=False)
            results[split] = result
        return results

    async def grpo(self, sft_dir: Path) -> tuple[dict[str, StepRollouts],
                                                  dict[str, StepRollouts],
                                                  list[tuple[float, float]]]:
        r = self.recipe
        opts = self._options("grpo", r.grpo_learning_rate, tasks_per_step=r.tasks_per_step,
                             micro_batch_size=8, ppo_epochs=r.grpo_ppo_epochs,
                             ppo_mini_batches=r.grpo_mini_batches,
                             train_embeddings=r.grpo_train_embeddings)
        run = TrainingRun(opts, sft_dir, self.console, "grpo")
        if r.grpo_adam_from_sft and run.policy.step == 0:
            run.policy.adopt_second_moments(sft_dir)
        engine = EngineConfig(name="local", model=str(sft_dir))
        try:
            async with RolloutCollector(_run_config(r, sft_dir, engine),
                                        self.out / "rollouts") as collector:
                before = await self.evaluate(collector, "sft")
                run.log.log({"phase": "eval", "step": 0, **_eval_metrics(before)})
                started = time.monotonic()
                await grpo_loop(run, collector, self.tasks["train"], r.k, r.grpo_steps, "grpo")
                self.timings["grpo"] = time.monotonic() - started
                after = await self.evaluate(collector, "final")
                run.log.log({"phase": "eval", "step": run.policy.step, **_eval_metrics(after)})
            run.checkpoint(force=True)
            from openforge.training.metrics_log import read_metrics

            train_curve = [(float(m["step"]), float(m["reward_mean"]))
                           for m in read_metrics(run.log.path) if m.get("phase") == "grpo"]
            curves = {"train reward (GRPO rollouts)": train_curve}
            for split in r.eval_splits:
                curves[f"{split} reward"] = [(0.0, before[split].mean_reward),
                                             (float(run.policy.step), after[split].mean_reward)]
            plot = write_curve(self.out / "reward_curve", curves, "openforge demo recipe")
            self.console.print(f"reward curve: {plot}")
        finally:
            run.close()
        return before, after, train_curve

    async def run(self) -> dict[str, Any]:
        r = self.recipe
        started = time.monotonic()
        if r.torch_threads is not None:
            import torch

            torch.set_num_threads(r.torch_threads)
        if r.fresh and self.out.exists():
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        env = demo_tasks.FamilyEnvironment(train_per_family=r.train_per_family,
                                           validation_per_family=r.validation_per_family,
                                           test_per_family=r.test_per_family, seed=r.seed,
                                           families=r.families, pool_size=r.pool_size)
        self.tasks = {split: list(env.tasks(split)) for split in demo_tasks.SPLITS}
        missing = [split for split in r.eval_splits if not self.tasks[split]]
        if missing:
            raise OpenforgeError(f"families {r.families} have no {' or '.join(missing)} tasks; "
                                 f"the test split needs one of {sorted(demo_tasks.HELD_OUT_TYPES)}")
        self.console.print(f"demo recipe: {len(self.tasks['train'])} train, "
                           f"{len(self.tasks['validation'])} validation, "
                           f"{len(self.tasks['test'])} test tasks -> {self.out}")
        model_dir = _model_dir(r.model)
        t = time.monotonic()
        demos = await self.teacher(model_dir)
        self.timings["teacher"] = time.monotonic() - t
        t = time.monotonic()
        sft_dir = await asyncio.to_thread(self.sft, model_dir, demos)
        self.timings["sft"] = time.monotonic() - t
        before, after, curve = await self.grpo(sft_dir)
        self.console.print("GRPO train reward per step:")
        for line in text_curve(curve):
            self.console.print(line)
        summary: dict[str, Any] = {"grpo_steps": r.grpo_steps}
        for split in r.eval_splits:
            gain, se = paired_gain(before[split], after[split])
            summary.update({f"{split}_reward_sft": before[split].mean_reward,
                            f"{split}_reward_final": after[split].mean_reward,
                            f"{split}_gain": gain, f"{split}_gain_se": se,
                            f"{split}_tasks": len(self.tasks[split])})
        summary["harness"] = r.harness
        summary["traffic"] = {"teacher": traffic(self.out / "teacher" / "store.sqlite"),
                              "rollouts": traffic(self.out / "rollouts" / "store.sqlite")}
        if "test" in r.eval_splits:
            summary["test_by_family"] = {
                family: [_family_mean(before["test"], family),
                         _family_mean(after["test"], family)]
                for family in sorted({t.data["family"] for t in self.tasks["test"]})}
        summary.update({"elapsed_s": time.monotonic() - started, "timings_s": self.timings,
                        "recipe": json.loads(r.model_dump_json())})
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        for split in r.eval_splits:
            self.console.print(
                f"{split} mean reward: SFT {summary[f'{split}_reward_sft']:.3f} -> GRPO "
                f"{summary[f'{split}_reward_final']:.3f} ({summary[f'{split}_gain']:+.3f} "
                f"+- {summary[f'{split}_gain_se']:.3f} s.e., {len(self.tasks[split])} tasks)",
                markup=False)
        for name, t in summary["traffic"].items():
            self.console.print(
                f"{name} traffic through {r.harness}: {t['calls']} calls, "
                f"{t['prompt_tokens_per_call']:.0f} prompt tokens per call, "
                f"{t['calls_per_sample']:.2f} calls per sample, branches opened "
                f"{t['branches_opened'] or 'none'}", markup=False)
        self.console.print(f"{summary['elapsed_s'] / 60:.1f} min in all", markup=False)
        return summary


def traffic(store_path: Path) -> dict[str, Any]:
    """What the harness's recorded traffic in a store came to as training data: calls,
    prompt tokens per call, calls per sample (the merge rate) and the branches opened, by
    reason."""
    from openforge.store import Store
    from openforge.trajectory import run_metrics

    with Store(store_path) as store:
        metrics = run_metrics(store)
        lengths = [len(c.prompt_ids) for c in store.iter_calls() if c.status == "ok"]
    return {"calls": len(lengths),
            "prompt_tokens_per_call": sum(lengths) / len(lengths) if lengths else 0.0,
            "calls_per_sample": metrics.calls_per_sample,
            "samples_per_session": metrics.samples_per_session,
            "branches_opened": dict(sorted(metrics.branches_opened.items()))}


def _eval_metrics(results: dict[str, StepRollouts]) -> dict[str, float]:
    return {f"{split}_{name}": value for split, result in results.items()
            for name, value in (("reward", result.mean_reward), ("pass_rate", result.pass_rate))}


def _task_means(step: StepRollouts) -> dict[str, float]:
    rewards: dict[str, list[float]] = {}
    for record in step.scored:
        rewards.setdefault(record.task_id, []).append(record.reward or 0.0)
    return {task: sum(values) / len(values) for task, values in rewards.items()}


def _family_mean(step: StepRollouts, family: str) -> float:
    means = [m for task, m in _task_means(step).items() if task.split("-")[0] == family]
    return sum(means) / len(means) if means else 0.0


def paired_gain(before: StepRollouts, after: StepRollouts) -> tuple[float, float]:
    """The mean per-task reward change and its standard error, over the tasks scored at both
    checkpoints (each task's attempts averaged first: the tasks are the independent units)."""
    b, a = _task_means(before), _task_means(after)
    diffs = [a[task] - b[task] for task in sorted(b.keys() & a.keys())]
    if not diffs:
        return 0.0, 0.0
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, 0.0
    var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean, (var / len(diffs)) ** 0.5


class DemoRecipeRunner(Recipe):
    """The `demo` recipe as registered through the builtin plugin (`register_recipes`)."""

    def run(self, config_path: Path | None, overrides: list[str] | tuple[str, ...],
            console: Console) -> dict[str, Any]:
        recipe = build_config(DemoRecipe, config_path, overrides)
        return asyncio.run(DemoPipeline(recipe, console).run())


def run_recipe(name: str, config_path: Path | None = None,
               overrides: list[str] | tuple[str, ...] = (),
               console: Console | None = None) -> dict[str, Any]:
    """`openforge train --recipe NAME [--config FILE] [--set key=value ...]`: the recipe a
    plugin registered as NAME (`register_recipes`)."""
    from openforge import plugins

    try:
        recipe = plugins.create("recipe", name)
    except plugins.UnknownPluginError:
        available = ", ".join(plugins.get_registry().names("recipe")) or "none"
        raise OpenforgeError(f"unknown recipe {name!r}; available: {available}") from None
    result: dict[str, Any] = recipe.run(config_path, overrides, console or Console())
    return result
