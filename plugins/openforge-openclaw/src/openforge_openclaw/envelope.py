"""OpenClaw's `agent exec --json` envelope -> the harness's account of the run.

`--json` reserves stdout for one JSON object: `{ok, status: ok|error|timeout, final,
payloads, usage, assistantTurns, toolSummary, model, provider, sessionId, error?}`.
Exit codes: 0 ok, 1 error (model or result error), 2 timeout; a signal is reported as
128 + signal by its startup wrapper.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from openforge.harness import HarnessOutput, ProcessOutput

# Errors that say the model endpoint could not be reached or failed on its side: the
# policy did nothing wrong, so the rollout is an infrastructure failure, not a 0.
_ENDPOINT_DOWN = re.compile(
    r"ECONNREFUSED|ECONNRESET|ETIMEDOUT|EHOSTUNREACH|fetch failed|socket hang up|"
    r"connection (?:refused|error|reset)|\b(?:500|502|503|504)\b|internal server error|"
    r"service unavailable|bad gateway", re.I)


class EnvelopeError(BaseModel):
    model_config = ConfigDict(extra="allow")

    message: str = ""
    kind: str | None = None
    type: str | None = None


class Envelope(BaseModel):
    """The fields of the envelope openforge reads (others are kept, untyped)."""

    model_config = ConfigDict(extra="allow")

    ok: bool = False
    status: str | None = None
    final: str | None = None
    payloads: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    assistantTurns: int | None = None  # noqa: N815 (OpenClaw's own field name)
    toolSummary: dict[str, Any] | None = None  # noqa: N815
    model: str | None = None
    provider: str | None = None
    error: EnvelopeError | str | None = None

    @property
    def error_message(self) -> str | None:
        if self.error is None:
            return None
        if isinstance(self.error, str):
            return self.error
        return self.error.message or self.error.kind or self.error.type

    @property
    def final_text(self) -> str | None:
        if self.final:
            return self.final
        texts = [p["text"] for p in self.payloads if isinstance(p.get("text"), str) and p["text"]]
        return "\n".join(texts) if texts else None

    @property
    def tool_calls(self) -> int:
        calls = (self.toolSummary or {}).get("calls")
        return calls if isinstance(calls, int) else 0


def parse_envelope(stdout: str) -> Envelope | None:
    """The envelope in `stdout`: the whole text, else the last line that is a JSON object."""
    text = stdout.strip()
    candidates = [text] + [line.strip() for line in reversed(text.splitlines())]
    for candidate in candidates:
        if not candidate.startswith("{"):
            continue
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict) and ("ok" in data or "status" in data):
            try:
                return Envelope.model_validate(data)
            except ValueError:
                continue
    return None


def model_requests(envelope: Envelope | None) -> int | None:
    """How many model requests OpenClaw made, by its own count (`assistantTurns`).

    OpenClaw omits the field when no round trip completed: then it made at most one
    (failed) request, which the gateway also records as failed or not at all.
    """
    if envelope is None:
        return None
    return envelope.assistantTurns if envelope.assistantTurns is not None else 0


def to_output(proc: ProcessOutput) -> HarnessOutput:
    """Map the finished `openclaw agent exec --json` process to a `HarnessOutput`."""
    env = parse_envelope(proc.stdout)
    transcript = env.model_dump(mode="json") if env is not None else None
    final = env.final_text if env is not None else None
    stderr_tail = proc.stderr.strip()[-2000:]
    if proc.timed_out:
        return HarnessOutput(status="timeout", final_answer=final, transcript=transcript,
                             error="openclaw did not finish before the rollout timeout")
    if env is None:
        code = proc.returncode
        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return HarnessOutput(status="crashed", error=f"openclaw {why} without a JSON result"
                             + (f": {stderr_tail}" if stderr_tail else ""))
    if env.status == "timeout" or proc.returncode == 2:
        return HarnessOutput(status="timeout", final_answer=final, transcript=transcript,
                             error=env.error_message or "openclaw reported a timeout")
    if env.ok and env.status in (None, "ok") and proc.returncode == 0:
        return HarnessOutput(status="completed", final_answer=final, transcript=transcript)
    message = env.error_message or f"openclaw status {env.status!r}, exit code {proc.returncode}"
    if _ENDPOINT_DOWN.search(message):
        return HarnessOutput(status="crashed", final_answer=final, transcript=transcript,
                             error=f"model endpoint failed: {message}"[:2000])
    return HarnessOutput(status="failed", final_answer=final, transcript=transcript,
                         error=message[:2000])
