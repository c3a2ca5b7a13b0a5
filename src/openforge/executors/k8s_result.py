"""What a Pod's status says about its attempt: the result, or why there is none.

The result travels in exactly one place: the termination message of the Pod's `verifier`
container (at most 4 KiB, kept in the Pod status, so it costs no API call), written by
trusted code after the agent's container ended, as a result line of the sandbox protocol
(`openforge.sandbox.protocol`) signed with the attempt's key. Nothing the agent writes (its
own log, its own termination message, a file) is ever read as a result.

When there is no result, the Pod says why, and the Pod-level reason wins over container
exit codes: an eviction kills containers with 137, a deadline with 143, yet the cause is
the eviction or the deadline. Image-pull errors are told apart: a missing image or a
refused credential is permanent (another try cannot help), a registry's 429 / 5xx / time-out
is transient (the kubelet retries with back-off; the executor waits, up to a bound).
These functions only read; the executor decides what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from openforge.executors.k8s_sandbox import AGENT
from openforge.sandbox.protocol import ResultRefused, result_line
from openforge.sandbox.protocol import parse_result as parse_result_line
from openforge.sandbox.scrub import LINKS, SPECIAL_FILES
from openforge.types import RolloutResult

MAX_MESSAGE = 4096
# Reward details the supervisor adds (a violation, what it removed of the agent's), kept
# when a result too long for a termination message loses the reward's own.
_NOTES = ("violation", "where", "forged_lines", LINKS, SPECIAL_FILES)
Pod = dict[str, Any]

# Waiting reasons of a container that cannot start.
_NEVER_STARTS = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                           "CreateContainerError", "RunContainerError"})
_PULLING = frozenset({"ErrImagePull", "ImagePullBackOff"})
# What registries and runtimes say when the image will never come (containerd, CRI-O, Docker).
_PERMANENT_PULL = re.compile(
    r"not found|manifest unknown|name unknown|pull access denied|repository does not exist|"
    r"unauthorized|authentication required|denied|invalid reference format|"
    r"no match for platform|does not exist or no pull access", re.IGNORECASE)
# Pod-level reasons a kubelet or controller sets on a Pod it ends.
_POD_REASONS = {"Evicted": "evicted by its node", "DeadlineExceeded": "past activeDeadlineSeconds",
                "NodeLost": "its node was lost", "Shutdown": "its node shut down",
                "Terminated": "its node shut down", "UnexpectedAdmissionError": "refused by its node",
                "OutOfcpu": "refused by its node (out of cpu)",
                "OutOfmemory": "refused by its node (out of memory)",
                "NodeAffinity": "refused by its node (affinity)"}
# What the kubelet says when it evicts a Pod for going past a storage limit of the Pod's own
# (kubernetes pkg/kubelet/eviction/helpers.go: emptyDirMessageFmt and
# containerEphemeralStorageMessageFmt, with a trailing space), as opposed to its node running
# low ("The node was low on resource: ..."), which may be anyone's doing.
_VOLUME_OVER = re.compile(r'Usage of EmptyDir volume "(?P<volume>[^"]+)" exceeds the limit '
                          r'"[^"]+"\.\s*')
_CONTAINER_OVER = re.compile(r'Container (?P<container>\S+) exceeded its local ephemeral '
                             r'storage limit "[^"]+"\.\s*')
# DisruptionTarget condition reasons (Kubernetes 1.26+).
_DISRUPTIONS = {"PreemptionByScheduler": "preempted by the scheduler",
                "TerminationByKubelet": "ended by its node (pressure or shutdown)",
                "DeletionByTaintManager": "deleted because its node became unreachable",
                "EvictionByEvictionAPI": "evicted through the Eviction API (a drain?)",
                "DeletionByPodGC": "garbage-collected: its node no longer exists"}


@dataclass
class Cause:
    """Why an attempt has no result: `status` for the `RolloutResult`, and one line."""

    status: str  # infra_error or timeout
    message: str
    permanent: bool = False


# -- the result ----------------------------------------------------------------------------------


def compact_message(result: RolloutResult, key: bytes | None = None) -> str:
    """The result as one signed `OPENFORGE_RESULT SIG {json}` line of at most 4 KiB."""
    body = result.model_dump(mode="json", exclude={"harness_output"})
    line = result_line(body, key)
    if len(line.encode()) > MAX_MESSAGE:
        for name in ("final_answer", "error"):
            if body.get(name):
                body[name] = body[name][:500]
        if body.get("reward"):
            # The reward's own details go; what the supervisor noted of the agent stays.
            details = body["reward"]["details"]
            body["reward"]["details"] = {k: details[k] for k in _NOTES if k in details}
        line = result_line(body, key)
    return line if len(line.encode()) <= MAX_MESSAGE else ""


def parse_result(text: str, key: bytes | None = None) -> RolloutResult | None:
    """The result on the last non-empty line of `text`, if it is one signed with `key`."""
    try:
        return parse_result_line(text, key)
    except ResultRefused:
        return None


# -- container states ----------------------------------------------------------------------------


def statuses(pod: Pod) -> list[dict[str, Any]]:
    """Every container's status: init containers (sidecars included) first."""
    status = pod.get("status") or {}
    return list(status.get("initContainerStatuses") or []) + \
        list(status.get("containerStatuses") or [])


def container(pod: Pod, name: str) -> dict[str, Any]:
    """The status of the container `name` ({} before the kubelet reported it)."""
    return next((s for s in statuses(pod) if s.get("name") == name), {})


def terminated(pod: Pod, name: str) -> dict[str, Any]:
    return (container(pod, name).get("state") or {}).get("terminated") or {}


def started(pod: Pod) -> bool:
    """Whether any container of the Pod has started (the run timeout counts from then)."""
    return any("running" in (s.get("state") or {}) or "terminated" in (s.get("state") or {})
               for s in statuses(pod))


def waiting_reason(pod: Pod) -> str:
    for s in statuses(pod):
        waiting = (s.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in (None, "PodInitializing"):
            return str(waiting["reason"])
    return str((pod.get("status") or {}).get("phase") or "Pending")


def start_problem(pod: Pod) -> tuple[Cause, bool] | None:
    """(cause, transient) when a container cannot start: transient image pulls may recover."""
    for s in statuses(pod):
        waiting = (s.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason", ""), waiting.get("message", "")
        where = f"container {s.get('name')}: {reason}: {message}".rstrip(": ")
        if reason in _NEVER_STARTS:
            return Cause("infra_error", f"cannot start: {where}", permanent=True), False
        if reason in _PULLING:
            if _PERMANENT_PULL.search(message):
                return Cause("infra_error", f"image cannot be pulled: {where}", permanent=True), \
                    False
            return Cause("infra_error", f"image pull kept failing: {where}"), True
    return None


def unschedulable(pod: Pod) -> str | None:
    """The scheduler's message when it could not place the Pod."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "no node fits the Pod")
    return None


# -- why a Pod ended (or is ending) without a result ---------------------------------------------


def disruption(pod: Pod) -> str | None:
    """The DisruptionTarget condition, as one line, when a controller is ending the Pod."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            reason = str(cond.get("reason") or "")
            what = _DISRUPTIONS.get(reason, "being ended by the cluster")
            return f"{what} ({reason}: {cond.get('message') or ''})".replace(": )", ")")
    return None


def node_lost(pod: Pod) -> str | None:
    """The Pod itself says its node is lost: phase Unknown, or reason NodeLost."""
    status = pod.get("status") or {}
    if status.get("phase") == "Unknown":
        return "phase Unknown (its node stopped reporting)"
    if status.get("reason") == "NodeLost":
        return f"its node was lost: {status.get('message') or ''}".rstrip(": ")
    return None


def agents_storage_eviction(pod: Pod) -> str | None:
    """One line when the kubelet evicted the Pod because the agent's container went past a
    storage limit: of a volume it mounts writable (workspace, agent) or of its own ephemeral
    storage. Only the agent writes without bound there, so its doing, as what its container
    uses of memory is. None for any other end (its node's pressure included)."""
    status = pod.get("status") or {}
    message = (status.get("message") or "").strip()
    if status.get("reason") != "Evicted":
        return None
    volume = _VOLUME_OVER.fullmatch(message)
    container = _CONTAINER_OVER.fullmatch(message)
    if (volume and volume["volume"] in _agents_volumes(pod)) or \
            (container and container["container"] == AGENT):
        return f"the agent went past its storage limit: evicted by its node (Evicted: {message})"
    return None


def _agents_volumes(pod: Pod) -> set[str]:
    """The emptyDir volumes the agent's container mounts writable."""
    spec = pod.get("spec") or {}
    empty = {v.get("name") for v in spec.get("volumes") or [] if "emptyDir" in v}
    agent: dict[str, Any] = next(
        (c for c in spec.get("initContainers") or [] if c.get("name") == AGENT), {})
    return {m.get("name") for m in agent.get("volumeMounts") or [] if not m.get("readOnly")} \
        & empty


def pod_level_cause(pod: Pod) -> Cause | None:
    """Why a Pod ended, from the Pod, not its containers' exit codes: the Pod's reason, a
    disruption, an OOM kill (in a trusted container). What the agent's own container used,
    of memory or of its storage limits (`agents_storage_eviction`), is the agent's doing,
    judged by the executor on the session's recorded calls: None here."""
    status = pod.get("status") or {}
    reason, message = status.get("reason") or "", status.get("message") or ""
    if agents_storage_eviction(pod):
        return None
    if reason == "DeadlineExceeded":
        return Cause("timeout", f"past activeDeadlineSeconds, killed by the kubelet ({message})")
    if reason:
        what = _POD_REASONS.get(reason, "ended by the cluster")
        return Cause("infra_error", f"{what} ({reason}: {message})".replace(": )", ")"))
    if why := disruption(pod):
        return Cause("infra_error", why)
    for s in statuses(pod):
        term = (s.get("state") or {}).get("terminated") or {}
        if term.get("reason") == "OOMKilled" and s.get("name") != AGENT:
            return Cause("infra_error", f"container {s.get('name')} was OOMKilled: it needs a "
                         "higher memory limit (executor option limits.memory)")
    return None
