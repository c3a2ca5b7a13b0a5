"""A text as what it changes in an earlier one: the bytes it shares with it at both ends
kept as two lengths, the bytes between them kept as they are.

A harness resends the whole conversation with every model call, so a call's request body
is the previous call's with a few messages added in the middle (before the tools and
options that follow the messages). The store keeps such a body as `delta(previous, body)`
(docs/run-folder.md, `request_base`):

    8 bytes: the shared prefix's and the shared suffix's lengths, little-endian uint32
    then: the bytes of `body` between them

and `apply(previous, delta) == body`. Only the two ends are looked for, not moved blocks:
that is what the bodies of one session share, and finding them costs one comparison of
each end, in C.
"""

from __future__ import annotations

import struct

_HEADER = struct.Struct("<II")
_CHUNK = 4096  # bytes compared at a time while the ends still match


def delta(base: bytes, text: bytes) -> bytes:
    """`text` against `base`: the lengths of the prefix and the suffix they share, then the
    bytes of `text` between them."""
    prefix = _common_prefix(base, text)
    # The suffix may not overlap the prefix in either text.
    limit = min(len(base), len(text)) - prefix
    suffix = _common_suffix(base, text, limit)
    return _HEADER.pack(prefix, suffix) + text[prefix:len(text) - suffix]


def apply(base: bytes, delta_: bytes) -> bytes:
    """The text that `delta(base, text)` was made from. ValueError if `delta_` does not fit
    `base` (a damaged delta, or another base)."""
    if len(delta_) < _HEADER.size:
        raise ValueError("a delta is at least 8 bytes")
    prefix, suffix = _HEADER.unpack_from(delta_)
    if prefix + suffix > len(base):
        raise ValueError(f"the delta keeps {prefix} + {suffix} bytes of a {len(base)}-byte base")
    return b"".join((base[:prefix], delta_[_HEADER.size:], base[len(base) - suffix:]))


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    start = 0
    while start < n:  # whole chunks while they match: one C comparison each
        end = min(start + _CHUNK, n)
        if a[start:end] != b[start:end]:
            break
        start = end
    else:
        return n
    # The first difference is in [start, end): halve that range until one byte is left.
    while end - start > 1:
        middle = (start + end) // 2
        if a[start:middle] == b[start:middle]:
            start = middle
        else:
            end = middle
    return start


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """How many bytes `a` and `b` share at their ends, at most `limit`."""
    la, lb = len(a), len(b)
    done = 0  # the last `done` bytes match
    while done < limit:
        step = min(_CHUNK, limit - done)
        if a[la - done - step:la - done] != b[lb - done - step:lb - done]:
            break
        done += step
    else:
        return limit
    # The difference nearest the end is within the next `step` bytes: halve.
    low, high = done, done + step  # `low` bytes match; `high` do not
    while high - low > 1:
        middle = (low + high) // 2
        if a[la - middle:la - low] == b[lb - middle:lb - low]:
            low = middle
        else:
            high = middle
    return low
