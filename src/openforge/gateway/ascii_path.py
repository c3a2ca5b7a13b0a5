"""ASCII text to token ids without the `tokenizers` pipeline's per-piece overhead, exactly.

Most of what a tool-using agent adds to a conversation is ASCII: command output, code,
logs. The Rust `tokenizers` library spends most of its time on such text outside the
model: each pre-token becomes a `NormalizedString` with per-byte alignment tables
(`python benchmarks/bench_gateway_phases.py` prints the tokenizer's share of a call).
This module gives the same ids for the same text from three steps that are each the
library's own, or checked against it:

1. **Pre-tokenizing** with Python's `re`, on the tokenizer's own split pattern. The pattern
   is kept as written except its character classes (`\\p{L}`, `\\s`, ...), which become
   the explicit sets of ASCII characters that the library's regex engine (Oniguruma) puts
   in them, found by asking that engine about each of the 128 characters. Alternation,
   greediness and look-ahead are the same in both engines (both backtrack, leftmost
   first); the classes are where engines differ (Unicode tables, `\\s` and the control
   characters), and on ASCII input they are now the same sets by construction.
2. **Byte-level mapping** of each piece, with the table the library's `ByteLevel`
   pre-tokenizer gives for each ASCII character.
3. **BPE** of each piece by the library's own model (`model.tokenize`), remembered per
   piece: the words of command output repeat.

It applies only where nothing else in the library's pipeline could act on the text:
ASCII text (Unicode normalization leaves it as it is), no added token's text in it
(those are split out before pre-tokenizing), a BPE model without dropout or byte
fallback, and a pre-tokenizer of the shape byte-level BPE tokenizers use (a regex
`Split` then `ByteLevel`, or `ByteLevel` with its own regex). Anything else is
`None` from `AsciiPath.build` or from `encode`, and the caller uses the library.

Before it is used, `build` checks it against the library on a probe corpus (every ASCII
character alone and next to the characters the pattern tells apart, contractions,
whitespace runs); one difference and the tokenizer gets no fast path. The tests compare
the two on random text too (`tests/test_ascii_path.py`).

Python's `re` holds the GIL while it scans: texts over `MAX_CHARS` go to the library,
which releases it, so no render thread stalls the event loop for long.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

log = logging.getLogger(__name__)

MAX_CHARS = 8192  # longer texts: the library (it releases the GIL while it works)
_PIECE_CACHE = 1 << 16  # pieces whose ids are remembered; a full cache starts over
_CACHED_PIECE_CHARS = 64  # longer pieces are tokenized each time (a run of letters)

# GPT-2's pattern: what `ByteLevel(use_regex=True)` splits with.
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# The class escapes whose ASCII members are asked of the library's engine.
_CLASS_ESCAPE = re.compile(r"\\(?:[pP]\{[A-Za-z_]+\}|[sSdDwWhH])")
# Escapes that mean one character, the same in both engines.
_CHAR_ESCAPES = {"r": "\r", "n": "\n", "t": "\t", "f": "\f", "v": "\v", "a": "\a", "e": "\x1b"}
_ASCII = [chr(c) for c in range(128)]


class AsciiPath:
    """A tokenizer's fast path for ASCII text; `build` makes one or says why not."""

    def __init__(self, model: Any, split: re.Pattern[str], byte_map: dict[int, str],
                 added: re.Pattern[str] | None) -> None:
        self._model = model
        self._split = split
        self._to_bytes = str.maketrans(byte_map)
        self._added = added
        self._pieces: dict[str, tuple[int, ...]] = {}

    @classmethod
    def build(cls, backend: Any) -> AsciiPath | None:
        """The fast path for `backend` (a `tokenizers.Tokenizer`), checked against it, or
        None (logged at debug level with the reason) where it does not apply."""
        try:
            path = cls._from_tokenizer(backend)
            mismatch = path._first_mismatch(backend)
        except _NotApplicable as why:
            log.debug("no ASCII fast path: %s", why)
            return None
        except Exception as exc:  # a tokenizer this module did not foresee: the library
            log.warning("no ASCII fast path: %s: %s", type(exc).__name__, exc)
            return None
        if mismatch is not None:
            log.warning("no ASCII fast path: it tokenizes %r differently from the "
                        "tokenizer; every text goes through the tokenizer", mismatch)
            return None
        return path

    @classmethod
    def _from_tokenizer(cls, backend: Any) -> AsciiPath:
        from tokenizers import pre_tokenizers

        if backend.truncation is not None or backend.padding is not None:
            raise _NotApplicable("the tokenizer truncates or pads")
        model = backend.model
        if type(model).__name__ != "BPE" or model.dropout or model.byte_fallback \
                or model.continuing_subword_prefix or model.end_of_word_suffix:
            raise _NotApplicable("not a plain byte-level BPE model")
        # Each component's own JSON (the whole tokenizer's holds the vocabulary: slow).
        normalizer = _state(backend.normalizer)
        if not _leaves_ascii_alone(normalizer):
            raise _NotApplicable(f"normalizer {normalizer}")
        pattern = _split_pattern(_state(backend.pre_tokenizer))
        try:
            split = re.compile(_ascii_pattern(pattern), re.ASCII)
        except re.error as exc:
            raise _NotApplicable(f"the split pattern in Python's re: {exc}") from None
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        byte_map = {ord(c): byte_level.pre_tokenize_str(c)[0][0] for c in _ASCII}
        contents = sorted({t.content for t in backend.get_added_tokens_decoder().values()
                           if t.content}, key=len, reverse=True)
        added = re.compile("|".join(map(re.escape, contents))) if contents else None
        return cls(backend.model, split, byte_map, added)

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text`, or None where this path does not apply to it."""
        if len(text) > MAX_CHARS or not text.isascii() \
                or (self._added is not None and self._added.search(text)):
            return None
        pieces = self._split.findall(text)
        if sum(map(len, pieces)) != len(text) or "" in pieces:
            # Characters no match covers (the library makes pieces of them), or an empty
            # match (after one, the two engines resume the scan differently).
            return None
        ids: list[int] = []
        known = self._pieces
        for piece in pieces:
            found = known.get(piece)
            if found is None:
                found = tuple(t.id for t in self._model.tokenize(piece.translate(self._to_bytes)))
                if len(piece) <= _CACHED_PIECE_CHARS:
                    if len(known) >= _PIECE_CACHE:
                        known.clear()
                    known[piece] = found
            ids.extend(found)
        return ids

    def _first_mismatch(self, backend: Any) -> str | None:
        """The first probe text this path tokenizes differently from `backend` (None: none)."""
        for text in _probe_texts(self._split.pattern):
            mine = self.encode(text)
            if mine is not None and mine != backend.encode(text, add_special_tokens=False).ids:
                return text
        return None


class _NotApplicable(Exception):
    pass


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


def _leaves_ascii_alone(normalizer: dict[str, Any] | None) -> bool:
    """Unicode normalization forms map ASCII to itself; other normalizers may not."""
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_leaves_ascii_alone(n) for n in normalizer.get("normalizers", []))
    return kind in ("NFC", "NFD", "NFKC", "NFKD")


def _split_pattern(pre: dict[str, Any] | None) -> str:
    """The regex a byte-level pre-tokenizer splits with (else _NotApplicable)."""
    if pre is None:
        raise _NotApplicable("no pre-tokenizer")
    steps: list[dict[str, Any]] = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" \
        else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"]:
        if not steps[0].get("use_regex", True) or steps[0].get("add_prefix_space"):
            raise _NotApplicable("ByteLevel without its split, or adding a prefix space")
        return _GPT2_PATTERN
    if kinds == ["Split", "ByteLevel"]:
        split, byte_level = steps
        pattern = split.get("pattern") or {}
        if split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in pattern:
            raise _NotApplicable("a Split pre-tokenizer other than an isolating regex")
        if byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
            raise _NotApplicable("ByteLevel splits again or adds a prefix space")
        return str(pattern["Regex"])
    raise _NotApplicable(f"pre-tokenizers {kinds}, not Split + ByteLevel or ByteLevel")


def _engine_members(escape: str) -> list[str]:
    """The ASCII characters the library's regex engine matches with `escape`."""
    from tokenizers import Regex, pre_tokenizers

    try:
        probe = pre_tokenizers.Split(Regex(escape), "removed")
    except Exception as exc:
        raise _NotApplicable(f"the engine does not take {escape!r}: {exc}") from None
    return [c for c in _ASCII if not probe.pre_tokenize_str(c)]


def _class_body(chars: list[str]) -> str:
    return "".join(f"\\x{ord(c):02x}" for c in chars)


# Group openers that mean the same in Oniguruma's Ruby syntax and Python's re. Others
# differ or are not checked: `(?m)` is "dot matches newline" in Ruby, multi-line in
# Python; named groups and look-behind are left out.
_GROUPS = ("(?:", "(?i:", "(?=", "(?!", "(?>")


def _ascii_pattern(pattern: str) -> str:
    """`pattern` for Python's `re` on ASCII input: each class escape replaced by the ASCII
    characters the library's engine puts in it. Only a subset whose meaning is the same in
    both engines is taken; anything else is _NotApplicable."""
    out: list[str] = []
    in_class = False
    ignore_case: list[bool] = []  # per open group: inside an `(?i:` group
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            match = _CLASS_ESCAPE.match(pattern, i)
            if match:
                if any(ignore_case):
                    raise _NotApplicable("a character class in a case-insensitive group")
                members = _class_body(_engine_members(match.group()))
                out.append(members if in_class else f"[{members}]" if members else "(?!)")
                i = match.end()
                continue
            nxt = pattern[i + 1:i + 2]
            if nxt in _CHAR_ESCAPES:
                out.append(f"\\x{ord(_CHAR_ESCAPES[nxt]):02x}")
            elif nxt and not nxt.isalnum() and nxt.isascii():
                out.append("\\" + nxt)
            else:
                raise _NotApplicable(f"the split pattern uses \\{nxt}")
            i += 2
            continue
        if in_class:
            if c == "[" or pattern.startswith("&&", i):
                raise _NotApplicable("a nested class or a class intersection")
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            if any(ignore_case):
                raise _NotApplicable("a character class in a case-insensitive group")
            in_class = True
            negated = pattern.startswith("^", i + 1)
            if pattern.startswith("]", i + 1 + negated):
                raise _NotApplicable("a class that starts with ]")
            out.append("[^" if negated else "[")
            i += 1 + negated
            continue
        if c == "(":
            opener = next((g for g in _GROUPS if pattern.startswith(g, i)), None)
            if opener is None and pattern.startswith("(?", i):
                raise _NotApplicable(f"the group {pattern[i:i + 4]!r}...")
            ignore_case.append(opener == "(?i:")
            opener = opener or "("
            out.append(opener)
            i += len(opener)
            continue
        if c == ")":
            if not ignore_case:
                raise _NotApplicable("an unbalanced )")
            ignore_case.pop()
        elif c in "^$":
            # Line anchors in Oniguruma's Ruby syntax, string anchors in Python's re.
            raise _NotApplicable(f"the split pattern anchors with {c}")
        elif c == "+" and out and out[-1].endswith("}"):
            # `x{1,3}+`: one or more of `x{1,3}` in Ruby, possessive in Python 3.11.
            raise _NotApplicable("a + after a {m,n} quantifier")
        elif not c.isascii():
            raise _NotApplicable("a character outside ASCII in the split pattern")
        out.append(c)
        i += 1
    if in_class or ignore_case:
        raise _NotApplicable("an unterminated class or group")
    return "".join(out)


def _probe_texts(pattern: str) -> list[str]:
    """Texts that exercise a split pattern on ASCII: every character alone, each next to
    every character the pattern names (and to a letter, digit, space, newline), the
    contractions in either case, runs of whitespace before a newline or a word."""
    named = {c for c in _ASCII if c in pattern} | set("aZ0 \n\r\t'.")
    texts = list(_ASCII)
    for c in _ASCII:
        for d in sorted(named):
            texts += [c + d, d + c]
    for word in ("s", "t", "re", "ve", "m", "ll", "d"):
        for w in (word, word.upper(), word.capitalize()):
            texts += [f"it'{w}", f"it'{w}x", f"'{w} '{w}", f"x'{w}'{w}"]
    for ws in (" ", "  ", "\t", " \t ", "\n", "\r\n", " \n ", "\n\n", "   \n\n  "):
        texts += [f"a{ws}b", f"a{ws}", f"{ws}b", f"1{ws}2", f".{ws}.", ws * 3 + "x"]
    texts += ["12345 67 8", "x = f(a, b)\n    return x  # ok\n", "$ ls -la ./src\n",
              "PASSED tests/test_a.py::test_b[1-2] 0.01s\n", "a\x00b\x1cc\x7fd", "\x0b\x0c \x1f"]
    return list(dict.fromkeys(texts))  # pairs of two named characters come twice
