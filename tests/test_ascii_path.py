"""The ASCII fast path gives the `tokenizers` library's own ids, or steps aside.

Every check compares against the library on the same tokenizer: the tiny model's real
Qwen3 tokenizer, and byte-level BPE tokenizers trained here (offline) with GPT-2's
built-in split and with Llama 3's split pattern.
"""

from __future__ import annotations

import itertools
import logging
import random
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

import openforge.gateway.ascii_path as ascii_path
from openforge.gateway.ascii_path import AsciiPath
from openforge.gateway.model import load_model_bundle
from openforge.tinymodel import ensure_tiny_model

ASCII = "".join(chr(c) for c in range(128))
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def code_like(rng: random.Random, n: int) -> str:
    words = ["def", "return", "self", "x", "PASSED", "FAILED", "it's", "We'LL", "don't",
             "12", "3.14", "0x1f", "==", "->", "::", "()", "[1-2]", "#", "//", "'", '"']
    seps = [" ", "  ", "\n", "\r\n", "\t", "    ", ", ", ".", "\n\n", " \n"]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n))


CORPUS = [code_like(random.Random(seed), 40) for seed in range(200)] + \
    ["".join(random.Random(seed).choice(ASCII) for _ in range(80)) for seed in range(200)]


def trained(pre_tokenizer: Any, normalizer: Any = None, **bpe: Any) -> Tokenizer:
    """A byte-level BPE tokenizer trained on CORPUS, with an added special token."""
    tok = Tokenizer(models.BPE(**bpe))
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|end|>"])
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def split_then_bytes(pattern: str) -> Any:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=False)])


@pytest.fixture(scope="module")
def qwen3() -> Tokenizer:
    return Tokenizer.from_file(str(ensure_tiny_model() / "tokenizer.json"))


@pytest.fixture(scope="module")
def qwen3_path(qwen3: Tokenizer) -> AsciiPath:
    fast = AsciiPath.build(qwen3)
    assert fast is not None
    return fast


@pytest.fixture(scope="module")
def gpt2_style() -> Tokenizer:
    return trained(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))


@pytest.fixture(scope="module")
def llama3_style() -> Tokenizer:
    return trained(split_then_bytes(LLAMA3_SPLIT), normalizer=normalizers.NFC())


def library(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["qwen3", "gpt2_style", "llama3_style"])
def test_every_pair_of_ascii_characters_and_a_corpus_tokenize_as_the_library_does(
        name: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(name)
    fast = AsciiPath.build(tok)
    assert fast is not None
    texts = [a + b for a, b in itertools.product(ASCII, repeat=2)] + CORPUS
    mine = [fast.encode(t) for t in texts]
    assert all(ids is not None for ids in mine)
    assert mine == [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.sampled_from(list(ASCII) + ["'s", "'LL", "  ", "\r\n", "12", "abc",
                                                     " x", "\n\n  ", "'T "]), max_size=40))
def test_random_ascii_text_tokenizes_as_the_library_does(
        parts: list[str], qwen3_path: AsciiPath, qwen3: Tokenizer) -> None:
    text = "".join(parts)
    assert qwen3_path.encode(text) == library(qwen3, text)


def test_texts_it_does_not_take_are_none_and_the_tokenizer_still_gets_them_right(
        qwen3: Tokenizer, qwen3_path: AsciiPath) -> None:
    fast = qwen3_path
    declined = ["caf\u00e9 ok", "x<think>y</think>", "a<|im_end|>\n<|im_start|>assistant",
                "a" * (ascii_path.MAX_CHARS + 1)]
    assert [fast.encode(t) for t in declined] == [None] * len(declined)
    # The gateway's tokenizer takes special-token text as text (see gateway/model.py).
    as_text = Tokenizer.from_str(qwen3.to_str())
    as_text.encode_special_tokens = True
    tokenizer = load_model_bundle("tiny").tokenizer
    for text in declined:
        assert tokenizer.encode_long(text) == library(as_text, text)
        assert tokenizer.encode(text) == library(as_text, text)


def test_a_pattern_that_leaves_gaps_gives_way_to_the_library() -> None:
    # Split isolates matches and keeps what lies between them as pieces of their own.
    tok = trained(split_then_bytes(r"\p{L}+|\p{N}"))
    fast = AsciiPath.build(tok)
    assert fast is not None
    assert fast.encode("abc12") == library(tok, "abc12")
    assert fast.encode("ab - 12") is None


def test_a_pattern_that_matches_nothing_somewhere_gives_way_to_the_library() -> None:
    tok = trained(split_then_bytes(r"\p{L}*|\s+|[^\s\p{L}]+"))
    fast = AsciiPath.build(tok)
    assert fast is not None
    assert fast.encode("ab cd") is None  # an empty match before the space


@pytest.mark.parametrize("make", [
    lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=False),
                    normalizer=normalizers.Lowercase()),
    lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=True)),
    lambda: trained(pre_tokenizers.Whitespace()),
    lambda: trained(split_then_bytes(r"\b\w+")),
    lambda: trained(split_then_bytes(r"\p{L}+$|\s+|[^\s\p{L}]+")),
    lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=False), dropout=0.5),
], ids=["lowercase", "prefix-space", "not-byte-level", "word-boundary", "line-anchor", "dropout"])
def test_tokenizers_it_cannot_match_get_no_fast_path(make: Any) -> None:
    assert AsciiPath.build(make()) is None


def test_a_truncating_tokenizer_gets_no_fast_path(gpt2_style: Tokenizer) -> None:
    tok = Tokenizer.from_str(gpt2_style.to_str())
    tok.enable_truncation(8)
    assert AsciiPath.build(tok) is None


def test_the_check_against_the_library_refuses_a_wrong_translation(
        qwen3: Tokenizer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # As if the engine had put the tab among the letters: the probe texts show it.
    real = ascii_path._engine_members
    monkeypatch.setattr(ascii_path, "_engine_members", lambda escape: real(escape) + (
        ["\t"] if escape == r"\p{L}" else []))
    with caplog.at_level(logging.WARNING, logger="openforge.gateway.ascii_path"):
        assert AsciiPath.build(qwen3) is None
    assert "tokenizes" in caplog.text and "differently" in caplog.text


def test_the_engine_sets_are_asked_of_the_library(qwen3: Tokenizer) -> None:
    assert ascii_path._engine_members(r"\p{L}") == list(string.ascii_uppercase
                                                        + string.ascii_lowercase)
    assert ascii_path._engine_members(r"\p{N}") == list(string.digits)
    assert ascii_path._engine_members(r"\s") == [c for c in ASCII if c in "\t\n\x0b\x0c\r "]


def test_the_piece_memory_stays_bounded(qwen3: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ascii_path, "_PIECE_CACHE", 50)
    fast = AsciiPath.build(qwen3)
    assert fast is not None
    text = " ".join(f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(400))
    assert fast.encode(text) == library(qwen3, text)
    assert 0 < len(fast._pieces) <= 50


def test_the_gateways_tokenizer_uses_it_for_the_tiny_model() -> None:
    tokenizer = load_model_bundle("tiny").tokenizer
    assert tokenizer.ascii_path is not None
    text = "step 3 of task 7: 12 passed, 3 warnings\n" * 4
    assert tokenizer.encode_long(text) == tokenizer.ascii_path.encode(text)


def test_an_unforeseen_error_while_building_leaves_the_tokenizer_to_the_library(
        qwen3: Tokenizer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(escape: str) -> list[str]:
        raise RuntimeError("engine gone")

    monkeypatch.setattr(ascii_path, "_engine_members", broken)
    with caplog.at_level(logging.WARNING, logger="openforge.gateway.ascii_path"):
        assert AsciiPath.build(qwen3) is None
    assert "RuntimeError: engine gone" in caplog.text


@pytest.mark.parametrize("pattern", [
    r"(?m:a.)", r"(?<w>\p{L}+)|\s+", r"(?<=a)b", r"[a-z&&[^aeiou]]+", r"[[:alpha:]]+",
    r"\p{N}{1,3}+", r"^\s+", r"\p{L}+$", r"(?i:\p{L}+)", r"(?i:[a-z]+)", r"\b\w+", r"\p{L}+|\u00e9",
    "\u00e9+", r"(\p{L}+", r"\p{L}+)",
])
def test_split_patterns_outside_the_shared_subset_are_refused(pattern: str) -> None:
    # Each means something else in Oniguruma's Ruby syntax than in Python's re, or is
    # left unchecked: the tokenizer then has no fast path.
    with pytest.raises(ascii_path._NotApplicable):
        ascii_path._ascii_pattern(pattern)
