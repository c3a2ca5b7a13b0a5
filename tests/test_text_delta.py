"""`text_delta`: a text as the ends it shares with an earlier one and the bytes between."""

from __future__ import annotations

import random

import pytest

from openforge import text_delta


def _shared_ends(base: bytes, text: bytes) -> tuple[int, int]:
    """The longest shared prefix, then the longest shared suffix not overlapping it, one
    byte at a time (what `delta` finds by halving)."""
    prefix = 0
    while prefix < min(len(base), len(text)) and base[prefix] == text[prefix]:
        prefix += 1
    suffix = 0
    while (suffix < min(len(base), len(text)) - prefix
           and base[len(base) - 1 - suffix] == text[len(text) - 1 - suffix]):
        suffix += 1
    return prefix, suffix


def _pairs() -> list[tuple[bytes, bytes]]:
    rng = random.Random(7)
    body = b'{"model":"p","messages":[' + b",".join(
        b'{"role":"tool","content":"%s"}' % rng.randbytes(rng.randrange(1, 6000)).hex().encode()
        for _ in range(6)) + b'],"tools":[{"name":"shell"}],"stream":false}'
    cut = body.index(b'],"tools"')
    pairs = [
        (body, body),  # nothing new
        (body, body[:cut] + b',{"role":"user","content":"more"}' + body[cut:]),  # a message added
        (body, b"X" + body[1:]),  # differs at the first byte
        (body, body[:-1] + b"X"),  # differs at the last byte
        (body, body + b"tail"), (body + b"tail", body),  # one is the other's prefix
        (b"tail" + body, body), (body, b"tail" + body),  # ... or suffix
        (b"", body), (body, b""), (b"", b""),
        (b"aaaa", b"aaaaaa"), (b"aaaaaa", b"aaaa"), (b"abab", b"ab"),  # the ends could overlap
        (b"a" * 10_000, b"a" * 9_999 + b"b" + b"a" * 10_000),
    ]
    for _ in range(200):  # edits at random places, across chunk boundaries too
        text = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(text) + 1)
            text[at:at + rng.randrange(0, 9000)] = rng.randbytes(rng.randrange(0, 50))
        pairs.append((body, bytes(text)))
    return pairs


def test_a_delta_keeps_the_longest_shared_ends_and_applies_back_exactly() -> None:
    for i, (base, text) in enumerate(_pairs()):
        d = text_delta.delta(base, text)
        prefix, suffix = _shared_ends(base, text)
        header = (int.from_bytes(d[:4], "little"), int.from_bytes(d[4:8], "little"))
        assert header == (prefix, suffix), i
        assert d[8:] == text[prefix:len(text) - suffix], i
        assert text_delta.apply(base, d) == text, i


def test_a_delta_that_does_not_fit_its_base_is_a_value_error() -> None:
    d = text_delta.delta(b"0123456789", b"0123xx6789")
    assert text_delta.apply(b"0123456789", d) == b"0123xx6789"
    with pytest.raises(ValueError, match="4 \\+ 4 bytes of a 5-byte base"):
        text_delta.apply(b"01234", d)
    with pytest.raises(ValueError, match="at least 8 bytes"):
        text_delta.apply(b"0123456789", d[:7])
