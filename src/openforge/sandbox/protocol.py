"""The sandbox protocol, defined once: how a rollout supervisor reports, and what it is told.

Every executor speaks it (local, Kubernetes) and the supervisor (`python -m openforge.rollout`)
writes it:

- **The result line.** The supervisor's last line of stdout is `OPENFORGE_RESULT [SIG ]JSON`:
  the `RolloutResult` as JSON, preceded by an HMAC-SHA256 of the JSON (hex) when the executor
  gave the supervisor a result key (on its stdin, never in argv, the environment or a file).
  An executor takes a result only from a supervisor that exited 0, only from the last
  non-empty line, only with a valid signature when it holds a key, and only when the result
  names the spec's rollout, task, attempt and session (`check_result`). Anything else is
  the supervisor dying: an infrastructure failure, never a pass.
- **The environment.** Only the variables named in `PASS_ENV` cross into a rollout
  (`scrub_env`): an allowlist of exact names, never a prefix, so nothing credential-like
  rides along under an innocent prefix (`LC_GITHUB_PAT`, `OPENFORGE_API_KEY`). The
  variables the executors, the supervisor and the gateway speak through are named below,
  once, each with who reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, BinaryIO

# Imported where used: a Pod's verifier imports this module and must start fast.
if TYPE_CHECKING:
    from openforge.types import RolloutResult, RolloutSpec

RESULT_PREFIX = "OPENFORGE_RESULT "

# The supervisor: the sandbox mode for the agent (auto, bwrap, namespaces, none).
SANDBOX_ENV = "OPENFORGE_SANDBOX"
# Process sweeps: a marker in every agent process's environment (a hint only: an agent can
# drop it).
MARKER_ENV = "OPENFORGE_SANDBOX_ID"
# `openforge serve`: the gateway's admin key (never on argv).
ADMIN_KEY_ENV = "OPENFORGE_ADMIN_KEY"
# A Kubernetes Pod's containers (openforge.executors.k8s_sandbox): where each finds its volumes.
# The supervisor's: the `RolloutSpec` JSON, mounted from the attempt's Secret (a Pod cannot
# read the orchestrator's disk).
SPEC_FILE_ENV = "OPENFORGE_SPEC_FILE"
# The supervisor's and the agent's: the workspace volume; the agent's volume (its HOME, the
# harness command, its output).
WORKSPACE_ENV = "OPENFORGE_WORKSPACE_DIR"
AGENT_DIR_ENV = "OPENFORGE_AGENT_DIR"
# The supervisor's and the verifier's: the volume only the trusted containers mount (the
# supervisor's socket).
TRUSTED_DIR_ENV = "OPENFORGE_TRUSTED_DIR"
# The supervisor's: the folders the Pod empties in the agent's container (a JSON list: the
# environment's hidden folders, as the executor found them), checked against its own.
HIDDEN_ENV = "OPENFORGE_HIDDEN_PATHS"
# The verifier's: where the kubelet reads its termination message (the result).
TERMINATION_LOG_ENV = "OPENFORGE_TERMINATION_LOG"
# A gateway worker process (openforge.gateway.workers): its config and admin key, from the
# parent gateway (never on argv).
GATEWAY_WORKER_SPEC_ENV = "OPENFORGE_GATEWAY_WORKER_SPEC"

# Exact names that reach a rollout; nothing else does.
PASS_ENV: frozenset[str] = frozenset({
    "PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "NO_COLOR",
    "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "SSL_CERT_FILE", "SSL_CERT_DIR",
    "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME", "LC_MONETARY",
    "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION",
    # Plugins' own (passed through): where programs are (openforge.npm, openforge-gui's
    # browser), and debugging output.
    SANDBOX_ENV, "OPENFORGE_CACHE", "OPENFORGE_NODE_BIN", "OPENFORGE_CHROMIUM", "OPENFORGE_DEBUG",
})
# A name like this is a credential: refused even when a user asks to pass it.
CREDENTIAL_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASS|PWD|CREDENTIAL|AUTH|COOKIE|SESSION|PAT|CERT_KEY|PRIVATE", re.I)


def looks_like_credential(name: str) -> bool:
    return bool(CREDENTIAL_NAME.search(name))


def scrub_env(parent: Mapping[str, str], extra_names: Iterable[str] = ()) -> dict[str, str]:
    """`parent` cut down to the allowlist (plus `extra_names`), never a credential-named variable."""
    wanted = PASS_ENV | set(extra_names)
    env = {name: value for name, value in parent.items()
           if name in wanted and (name in PASS_ENV or not looks_like_credential(name))}
    env.setdefault("PATH", os.defpath)
    return env


# -- the result line ------------------------------------------------------------------------


def output_file(path: str | os.PathLike[str]) -> BinaryIO:
    """A new (emptied) file for a process's captured stdout or stderr, opened for appending:
    a line another process writes into it through /proc/PID/fd/N stays where it was written,
    not overwritten by the owner's next write at its own offset, so that a result line the
    agent slipped in is seen (`sandbox.forgery`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    return open(os.open(path, flags, 0o666), "wb")


def new_result_key() -> bytes:
    """A fresh per-attempt key the executor hands the supervisor on stdin."""
    return os.urandom(32)


def scoring_result_key(spec: RolloutSpec) -> bytes | None:
    """The result key of an attempt whose supervisor cannot be handed one on stdin (a Pod's).

    Derived from the session's scoring credential, which only the trusted side holds (in a
    Pod: the Secret only the supervisor mounts): the SHA-256 of the credential, which the
    store also keeps (`scoring_hash`), so an executor that took the attempt over after a
    restart (the credential itself is gone with the old process) checks the same signature.
    None when the spec carries neither (tests and tools that score offline).
    """
    if spec.scoring_hash:
        return bytes.fromhex(spec.scoring_hash)
    if spec.scoring_token:
        return hashlib.sha256(spec.scoring_token.encode()).digest()
    return None


def _sign(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def result_line(result: RolloutResult | dict[str, object], key: bytes | None = None) -> str:
    """The line a supervisor prints last: `OPENFORGE_RESULT [SIG ]JSON` (`result` may be a
    result already dumped, and cut down: a Pod's termination message holds 4 KiB)."""
    body = json.dumps(result if isinstance(result, dict) else result.model_dump(mode="json"))
    return RESULT_PREFIX + (f"{_sign(key, body)} " if key else "") + body


class ResultRefused(ValueError):
    """The text holds no acceptable result; the message says why (for the attempt's error)."""


def parse_result(text: str, key: bytes | None = None) -> RolloutResult:
    """The result on the last non-empty line of `text`, or `ResultRefused`.

    Only the last line counts: a supervisor prints its result after every agent process is
    gone, so a result line followed by anything is not the supervisor's.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith(RESULT_PREFIX):
        raise ResultRefused("no result line at the end of the supervisor's output")
    from openforge.types import RolloutResult

    rest = lines[-1][len(RESULT_PREFIX):]
    if key is not None:
        signature, _, rest = rest.partition(" ")
        if not hmac.compare_digest(signature.encode(), _sign(key, rest).encode()):
            raise ResultRefused("the result line is not signed with this attempt's key")
    try:
        return RolloutResult.model_validate_json(rest)
    except ValueError as exc:
        raise ResultRefused(f"the result line is not a valid result: {str(exc).splitlines()[0]}") \
            from None


def check_result(result: RolloutResult, spec: RolloutSpec) -> RolloutResult:
    """`result` when it is the result of `spec`'s attempt, else `ResultRefused`."""
    expected = {"rollout_id": spec.rollout_id, "task_id": spec.task.id, "attempt": spec.attempt}
    if spec.session_id:
        expected["session_id"] = spec.session_id
    for field, want in expected.items():
        got = getattr(result, field)
        if got != want:
            raise ResultRefused(f"the result is for {field} {got!r}, this attempt is {want!r}")
    return result
