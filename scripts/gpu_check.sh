#!/usr/bin/env bash
# A few real veRL GRPO steps with vLLM on one GPU, through the openforge agent loop.
#
#   scripts/gpu_check.sh [MODEL_DIR]      (default: the tiny Qwen3 built offline)
#
# For a machine with one NVIDIA GPU; target: under 8 minutes. It installs veRL with its vLLM
# extra into a fresh venv (.venv-gpu-check), writes the dataset and agent-loop config with
# `openforge train --backend verl` (dry run), then runs veRL's main_ppo for 2 steps on the
# demo environment with the mini harness, small batches and short responses. It checks that
# veRL finished its steps and logged actor metrics. Set SKIP_INSTALL=1 to reuse the venv.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-$here/.venv-gpu-check}"
out="${OUT_DIR:-$here/runs/gpu-check}"
steps="${STEPS:-2}"

command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this check needs a GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # veRL's vllm extra pins its own torch / vLLM / transformers (the GPU stack).
  "$venv/bin/pip" install -q "verl[vllm]==0.9.1"
  "$venv/bin/pip" install -q -e "$here"
fi
py="$venv/bin/python"

model="${1:-}"
if [[ -z "$model" ]]; then
  model="$("$py" -c 'from openforge.tinymodel import ensure_tiny_model; print(ensure_tiny_model())')"
fi

rm -rf "$out"
mkdir -p "$out"
"$venv/bin/openforge" train --backend verl \
  --set steps="$steps" --set learning_rate=1e-6 \
  --set run.environment=demo --set run.harness=mini \
  --set run.harness_options.max_steps=2 --set run.harness_options.max_tokens=64 \
  --set run.sampling.max_tokens=64 --set run.engine.model="$model" \
  --set options.output_dir="$out" --set options.dry_run=true \
  --set options.n=4 --set options.train_batch_size=4 --set options.ppo_mini_batch_size=4 \
  --set options.micro_batch_size_per_gpu=2 --set options.max_prompt_length=2048 \
  --set options.max_response_length=512 --set options.gpu_memory_utilization=0.4 \
  --set options.num_workers=2 --set options.save_freq=-1 \
  --set 'options.extra_overrides=["trainer.val_before_train=false","actor_rollout_ref.rollout.enforce_eager=true"]'

log="$out/verl.log"
start=$(date +%s)
timeout 900 bash "$out/command.sh" 2>&1 | tee "$log"
echo "veRL ran $(( $(date +%s) - start ))s"
grep -q "actor/pg_loss" "$log" || { echo "gpu_check: FAILED: no actor metrics in $log" >&2; exit 1; }
grep -q "training/global_step:$steps" "$log" || { echo "gpu_check: FAILED: step $steps not reached" >&2; exit 1; }
echo "gpu_check: OK ($steps GRPO steps through the openforge agent loop)"
