"""A rollout's result as a Kubernetes Pod reports it.

The rollout supervisor writes a compact copy of its `RolloutResult` to the termination message
(at most 4 KiB, kept in the Pod status, so it costs no extra API call) and prints the full one
as the last log line (`openforge.sandbox.protocol`). This module writes the compact copy (in
the Pod) and turns a finished Pod's status back into a `RolloutResult`. Which of these
channels the agent cannot write is the Pod's design (docs/sandboxing.md, "Kubernetes").
"""

from __future__ import annotations

import json
from typing import Any

from openforge.sandbox.protocol import RESULT_PREFIX, ResultRefused
from openforge.sandbox.protocol import parse_result as parse_result_line
from openforge.types import RolloutResult

MAX_MESSAGE = 4096
IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                          "ErrImageNeverPull", "CreateContainerConfigError",
                          "CreateContainerError", "RunContainerError"})


def compact_message(result: RolloutResult) -> str:
    """The result as one `OPENFORGE_RESULT {json}` line of at most 4 KiB."""
    body = result.model_dump(mode="json", exclude={"harness_output"})
    line = RESULT_PREFIX + json.dumps(body)
    if len(line.encode()) > MAX_MESSAGE:
        for key in ("final_answer", "error"):
            if body.get(key):
                body[key] = body[key][:500]
        if body.get("reward"):
            body["reward"]["details"] = {}
        line = RESULT_PREFIX + json.dumps(body)
    return line if len(line.encode()) <= MAX_MESSAGE else ""


def write_termination_message(path: str, result: RolloutResult) -> None:
    """Write the compact result where the kubelet reads the termination message."""
    message = compact_message(result)
    if not message:
        return
    try:
        with open(path, "w") as f:
            f.write(message)
    except OSError:
        pass  # not in a Pod (or no such mount): the gateway and the log carry the result


def parse_result(text: str) -> RolloutResult | None:
    """The result on the last non-empty line of `text`, if that line is a valid one."""
    try:
        return parse_result_line(text)
    except ResultRefused:
        return None


def container_state(pod: dict[str, Any]) -> dict[str, Any]:
    """The `state` of the Pod's first container ({} before the kubelet reported one)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return (statuses[0].get("state") or {}) if statuses else {}


def waiting_error(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the container can never start (bad image, bad config)."""
    waiting = container_state(pod).get("waiting") or {}
    reason = waiting.get("reason", "")
    if reason in IMAGE_ERRORS:
        return reason, waiting.get("message", "")
    return None


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it could not place the Pod."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "no node fits the Pod")
    return None
