"""Trainers: the `local` GRPO/SFT trainer, the veRL integration, and the `demo` recipe.

Modules, one job each:

- `algos`        GRPO advantages, clipped policy loss, KL, loss aggregation (veRL's
                 `core_algos` when importable, else the same formulas);
- `batch`        Samples -> padded tensors; the policy's logprobs on response tokens;
- `policy`       `PolicyOptimizer`: model + optimizer, `sft_step`, `grpo_step`, checkpoints;
- `rollouts`     `RolloutCollector`: one gateway + engine + executor across training steps;
- `local`        the `local` trainer plugin (online GRPO, offline SFT/GRPO), `TrainingRun`;
- `metrics_log`  metrics.jsonl (+ TensorBoard when installed); `plot` the reward curve;
- `verl`, `verl_engine`  veRL's agent loop, the `LLMServerClient` engine, the launcher;
- `recipes`, `demo_tasks`, `recipe_model`  `openforge train --recipe demo`.

Nothing here is imported by `import openforge`: torch loads only when training.
"""
