"""Whose failure a harness's crash or timeout is: the infrastructure's or the agent's.

A harness that crashed or ran out of time says so itself (`HarnessOutput.status`), but the
agent can bring either about at will: a tool call that runs `kill -9 $PPID`, or one that
sleeps until the time is up. Were every such end an infrastructure failure (retried, then
never scored), a policy about to fail would learn to end its attempt that way and drop its
0 from the batch. So the supervisor decides from what the gateway recorded for the
session, which the agent cannot write:

- the model never answered the session (no call recorded `ok`): nothing the agent decided
  ran, so the crash or timeout is the infrastructure's (a harness that cannot start, an
  engine that is down);
- the engine failed the session's last call: the harness died on it or waited for it;
- a timeout after any failed call: time went to the failures;
- otherwise the agent had the model's answers and acted on them: the end is its own, and
  the attempt is scored on its final state like any failed attempt (`harness_error`).

A slow engine that answers is not a failure here: the time limit bounds the whole attempt,
the model's own generating included, and the policy decides how much it generates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from openforge.types import Call


def agents_own_end(harness_status: Literal["crashed", "timeout"],
                   calls: Sequence[Call]) -> str | None:
    """Why the harness's `crashed` or `timeout` is the agent's own doing, or None when the
    recorded calls leave room for the infrastructure to be at fault (see the module)."""
    answered = sum(call.status == "ok" for call in calls)
    failed = len(calls) - answered
    if not answered:
        return None
    last = max(calls, key=lambda call: call.index)
    if last.status != "ok":
        return None
    if harness_status == "timeout" and failed:
        return None
    if harness_status == "timeout":
        why = f"ran out of time after the model answered {answered} call(s) and failed none"
    else:
        why = f"crashed after the model answered {answered} call(s), the last one included"
    return f"the harness {why}: the agent's own attempt, scored (docs/sandboxing.md, " \
        "'Whose failure')"
