"""The tiny untrained Qwen3: a real Qwen3 tokenizer and random weights, built offline."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import openforge.tinymodel as tinymodel
from openforge.tinymodel import TINY_MODEL_NAME, ensure_tiny_model


def test_build_in_a_fresh_cache(tmp_path, capsys):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = ensure_tiny_model(tmp_path)
    assert path == tmp_path / TINY_MODEL_NAME
    assert "building the tiny untrained Qwen3 model (offline, once)" in capsys.readouterr().err
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.encode("hello world") == [14990, 1879]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                      "<tool_call>", "</think>"]) == [151643, 151644, 151645,
                                                                     151657, 151668]
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    # As in Qwen3: tool-call and think markers survive skip_special_tokens.
    ids = tok.encode("<think>x</think><tool_call>y</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call>y</tool_call>"
    config = AutoConfig.from_pretrained(path)
    assert (config.model_type, config.vocab_size, config.hidden_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.tie_word_embeddings) == ("qwen3", 151936, 64, 2, 4, 2, 16, True)
    assert json.loads((path / "openforge.json").read_text())["renderer"] == "qwen3"
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.inference_mode():
        logits = model(torch.tensor([[14990, 1879]])).logits
    assert logits.shape == (1, 2, 151936)
    # Seeded: rebuilding anywhere gives the same weights as the shared cache copy.
    shared = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    assert torch.equal(model.model.embed_tokens.weight, shared.model.embed_tokens.weight)
    # Cached: the second call builds nothing.
    assert ensure_tiny_model(tmp_path) == path
    assert "building" not in capsys.readouterr().err


def test_concurrent_builders_end_with_one_complete_folder(tmp_path, monkeypatch):
    builds: list[Path] = []
    gate = threading.Barrier(4)

    def slow_build(folder: Path) -> None:  # the real build is covered above; this is the race
        builds.append(folder)
        gate.wait(timeout=10)
        (folder / "weights").write_text(str(folder))

    monkeypatch.setattr(tinymodel, "_build", slow_build)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_tiny_model(tmp_path)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    target = tmp_path / TINY_MODEL_NAME
    assert results == [target] * 4 and len(builds) == 4
    assert (target / ".complete").exists()
    assert (target / "weights").read_text() in {str(b) for b in builds}
    assert sorted(p.name for p in tmp_path.iterdir()) == [TINY_MODEL_NAME]  # no staging left


def test_incomplete_folder_is_rebuilt(tmp_path, monkeypatch):
    target = tmp_path / TINY_MODEL_NAME
    target.mkdir()
    (target / "junk").write_text("half a build")  # a builder killed before the rename
    monkeypatch.setattr(tinymodel, "_build", lambda folder: (folder / "weights").write_text("ok"))
    assert ensure_tiny_model(tmp_path) == target
    assert (target / "weights").read_text() == "ok" and not (target / "junk").exists()


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "c"))
    assert tinymodel.default_cache_dir() == tmp_path / "c"
