"""Result lines the trusted side did not write: an attempt to forge a result, labelled as one.

A result is only ever taken from the supervisor's signed last line (`protocol`), so a line
the agent wrote is never taken as a result. Writing one is still the agent breaking the
sandbox's rules, and the attempt says so: `violation`, scored 0, not retried (why:
docs/sandboxing.md, "Statuses"), the error starting "violation: forged result line in
WHERE". Each place is checked by whoever reads it:

- the agent's own output (the harness's stdout and stderr, captured by the supervisor): the
  supervisor, once the agent has ended (a Pod's supervisor too: it is the same code);
- the supervisor's stdout before its own last line (the agent can open it through /proc
  without isolation): the local executor;
- the agent container's termination message: the Kubernetes executor.

A line counts when it begins with the result prefix, as a result line must: harness
programs print their own text or JSON events, and what the agent's tools print goes to the
model, not to the harness's stdout.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.sandbox.protocol import RESULT_PREFIX
from openforge.types import RewardResult, RolloutResult

FORGED = "forged result line"
# Characters of each forged line kept in the result (the details and the error).
_SHOWN = 300
# Bytes of a line read at most when looking for result lines in the agent's output, and
# the result lines kept of a file (a forgery is found with the first).
_LINE_MAX = 64 << 10
_LINES_KEPT = 1000


def result_lines(text: str) -> list[str]:
    """The lines of `text` that begin like a result line."""
    return [line for line in text.splitlines() if line.startswith(RESULT_PREFIX)]


def in_files(paths: Iterable[Path]) -> list[tuple[str, list[str]]]:
    """(file name, its result lines) for each of `paths` that has any, read line by line,
    each at most `_LINE_MAX` bytes of it, the first `_LINES_KEPT` of them (the agent writes
    these files: neither a line of gigabytes nor millions of lines are held in memory)."""
    prefix = RESULT_PREFIX.encode()
    found = []
    for path in paths:
        lines: list[str] = []
        try:
            with open(path, "rb") as f:
                at_start = True  # of a line: the rest of a long line is no line of its own
                while len(lines) < _LINES_KEPT and (chunk := f.readline(_LINE_MAX)):
                    if at_start and chunk.startswith(prefix):
                        lines.append(chunk.decode(errors="replace").rstrip("\n"))
                    at_start = chunk.endswith(b"\n")
        except OSError:
            continue
        if lines:
            found.append((path.name, lines))
    return found


def verdict(where: str, lines: list[str]) -> dict[str, Any]:
    """The result fields of an attempt in which `lines` were found in `where`."""
    shown = [line[:_SHOWN] for line in lines[:3]]
    details = {"violation": FORGED, "where": where, "forged_lines": len(lines), "lines": shown}
    return {"status": "violation", "reward": RewardResult(score=0.0, passed=False, details=details),
            "error": f"violation: {FORGED} in {where}: {shown[0]}"}


def mark(result: RolloutResult, where: str, lines: list[str]) -> RolloutResult:
    """`result` as a violation for `lines` found in `where` (what it was stays in the error)."""
    fields = verdict(where, lines)
    if result.status == "violation" and result.error:
        fields["error"] += f"; also {result.error}"
    return result.model_copy(update=fields)
