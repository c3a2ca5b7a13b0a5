"""A slightly larger untrained Qwen3 for the `demo` recipe, built offline like the tiny one.

The embedded tiny model (hidden 64, 2 layers) is sized for tests of the plumbing. Learning to
copy a file name from the task into a tool call needs a little more room: this variant
(hidden 128, 4 layers) shares the tiny model's real Qwen3 tokenizer, so recorded token ids
mean the same thing to both, and it still trains on 2 CPU cores in minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from openforge.tinymodel import RENDERER_MARKER, default_cache_dir, ensure_tiny_model

RECIPE_MODEL_NAME = "demo-qwen3-h128-l4-v1"
_WEIGHT_FILES = ("model.safetensors", "config.json", "generation_config.json")


def ensure_recipe_model(cache_dir: Path | None = None) -> Path:
    """The folder of the recipe's untrained model, built (seeded, once) if not cached."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / RECIPE_MODEL_NAME
    if (target / RENDERER_MARKER).exists():
        return target
    import torch
    from transformers import AutoConfig, Qwen3Config, Qwen3ForCausalLM

    tiny = ensure_tiny_model(cache_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{RECIPE_MODEL_NAME}-", dir=root))
    try:
        for item in tiny.iterdir():
            if item.name not in _WEIGHT_FILES and not item.name.startswith("."):
                if item.is_dir():
                    shutil.copytree(item, staging / item.name)
                else:
                    shutil.copy2(item, staging / item.name)
        tiny_config = AutoConfig.from_pretrained(str(tiny))
        config = Qwen3Config(
            vocab_size=tiny_config.vocab_size, hidden_size=128, intermediate_size=384,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
            eos_token_id=tiny_config.eos_token_id, pad_token_id=tiny_config.pad_token_id)
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(str(staging))
        marker = json.loads((staging / RENDERER_MARKER).read_text())
        marker.update(name=RECIPE_MODEL_NAME, note="untrained demo-recipe model (random weights)")
        (staging / RENDERER_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / RENDERER_MARKER).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
