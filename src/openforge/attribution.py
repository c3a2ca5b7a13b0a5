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
- the engine or the gateway failed the session's last call: the harness died on it or
  waited for it;
- a timeout after any such failure: time went to the failures;
- otherwise the agent had the model's answers and acted on them: the end is its own, and
  the attempt is scored on its final state like any failed attempt (`harness_error`).

A call the engine refused as the request's own fault (a 4xx other than 429, passed on by
the gateway: a prompt beyond the engine's context window, parameters it rejects) is not a
failure of the infrastructure: the conversation the agent built, or a call it sent itself
with the session's token, made it. An agent that fills its context until the engine
refuses and its harness gives up has ended its own attempt.

A slow engine that answers is not a failure here: the time limit bounds the whole attempt,
the model's own generating included, and the policy decides how much it generates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from openforge.types import Call


def agents_own_end(harness_status: Literal["crashed", "timeout"],
                   calls: Sequence[Call], scored: bool = True) -> str | None:
    """Why the harness's `crashed` or `timeout` is the agent's own doing, or None when the
    recorded calls leave room for the infrastructure to be at fault (see the module).
    `scored`: the attempt is scored on its final state (else the caller says why not)."""
    answered = sum(call.status == "ok" for call in calls)
    failed = sum(_infrastructure_failed(call) for call in calls)
    if not answered:
        return None
    last = max(calls, key=lambda call: call.index)
    if _infrastructure_failed(last):
        return None
    if harness_status == "timeout" and failed:
        return None
    if harness_status == "timeout":
        why = f"ran out of time after the model answered {answered} call(s) and the " \
            "infrastructure failed none"
    elif last.status == "ok":
        why = f"crashed after the model answered {answered} call(s), the last one included"
    else:
        why = f"crashed after the model answered {answered} call(s) and the engine refused " \
            f"the last one as the request's own fault ({last.http_status})"
    verdict = "the agent's own attempt, scored" if scored else "the agent's own attempt"
    return f"the harness {why}: {verdict} (docs/sandboxing.md, 'Whose failure')"


def _infrastructure_failed(call: Call) -> bool:
    """Whether `call` failed for the engine's or the gateway's reasons, not the request's: a
    call recorded before the status was kept (None) counts as the infrastructure's."""
    if call.status == "ok":
        return False
    status = call.http_status
    return status is None or not (400 <= status < 500) or status == 429
