"""The in-sandbox entry point: `python -m openforge.rollout SPEC_JSON_PATH`.

Every executor runs this same program inside its sandbox. It builds the environment,
harness and reward named in the `RolloutSpec`, prepares the workspace, runs the harness
against the session URL with the time that is left, captures the final state, scores it,
and reports a `RolloutResult`: POSTed to `{gateway}/s/{token}/result` and also printed as
the last stdout line, prefixed `OPENFORGE_RESULT ` (the executor's fallback).

Plugin names are looked up in the registry; a name of the form `module:attr` is imported
directly (used by tests and benchmarks for throwaway harnesses).

The reward sees the environment's final state plus `final_answer`, `harness_status` and
`harness_transcript` (the harness's own account), unless the environment already set
those keys.

Statuses: the harness completed -> `ok`; failed on its own -> `harness_error` (both
scored); crashed, missing, or any setup failure -> `infra_error`; out of time -> `timeout`
(neither scored: the runner retries them).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from openforge.environment import Environment
from openforge.executors.process import die_with_parent, kill_tree
from openforge.harness import (
    Harness,
    HarnessContext,
    HarnessMissingError,
    HarnessOutput,
    ProcessOutput,
)
from openforge.reward import Reward
from openforge.types import Call, RolloutResult, RolloutSpec, RolloutStatus

RESULT_PREFIX = "OPENFORGE_RESULT "
SPEC_ENV = "OPENFORGE_SPEC"
# Seconds kept back from the harness for final state, reward and reporting.
_RESERVE_S = 10.0
_STATUS: dict[str, RolloutStatus] = {"completed": "ok", "failed": "harness_error",
                                     "crashed": "infra_error", "timeout": "timeout"}


class _Terminated(Exception):
    """The executor asked us to stop (SIGTERM)."""


def build_plugin(kind: str, name: str, options: dict[str, Any]) -> Any:
    """The plugin `name` of `kind`: a registered name, or `module:attr` imported directly."""
    if ":" in name:
        module_name, attr = name.split(":", 1)
        return getattr(importlib.import_module(module_name), attr)(**options)
    from openforge import plugins

    return plugins.create(kind, name, **options)


def _tail(path: Path, limit: int = 4000) -> str:
    if not path.exists():
        return ""
    text = path.read_text(errors="replace")
    return text[-limit:]


def run_harness(harness: Harness, ctx: HarnessContext, root: Path, timeout_s: float) -> ProcessOutput:
    """Run the harness's command in its own process group; kill the whole tree on the way out."""
    cmd = harness.command(ctx)
    env = dict(os.environ)
    env.update(cmd.env)
    out_path, err_path = root / "harness.stdout", root / "harness.stderr"
    started = time.monotonic()
    timed_out = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            cmd.argv, cwd=str(cmd.cwd or ctx.workspace), env=env, stdout=out, stderr=err,
            stdin=subprocess.PIPE if cmd.stdin is not None else subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent())
        try:
            if cmd.stdin is not None and proc.stdin:
                try:
                    proc.stdin.write(cmd.stdin.encode())
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            proc.wait(timeout=max(timeout_s, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also after a clean exit: background processes the harness left must go.
            kill_tree(proc.pid, proc.pid, None, grace_s=1.0)
            proc.wait()
    return ProcessOutput(returncode=proc.returncode, stdout=_tail(out_path, 200_000),
                         stderr=_tail(err_path, 20_000), timed_out=timed_out,
                         duration_s=time.monotonic() - started)


def execute(spec: RolloutSpec, root: Path) -> RolloutResult:
    """Run one attempt end to end and return its result (never raises for plugin failures)."""
    started = time.monotonic()
    deadline = started + spec.timeout_s
    base: dict[str, Any] = {"rollout_id": spec.rollout_id, "task_id": spec.task.id, "attempt": spec.attempt}

    def done(**fields: Any) -> RolloutResult:
        return RolloutResult(**base, duration_s=time.monotonic() - started, **fields)

    environment: Environment | None = None
    stage = "building the plugins"
    try:
        environment = build_plugin("environment", spec.environment, spec.environment_options)
        harness: Harness = build_plugin("harness", spec.harness, spec.harness_options)
        reward: Reward = build_plugin("reward", spec.reward, spec.reward_options)
        workspace = root / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        home = Path(os.environ["HOME"]) if os.environ.get("OPENFORGE_ROLLOUT_DIR") else root / "home"
        home.mkdir(parents=True, exist_ok=True)
        ctx = HarnessContext(task=spec.task, workspace=workspace, home=home,
                             base_url=spec.session_url, api_key=spec.session_token,
                             model=spec.model, timeout_s=spec.timeout_s)
        stage = "preparing the environment"
        environment.prepare(spec.task, workspace)
        ctx.mcp_servers = environment.mcp_servers(spec.task, workspace)
        stage = "checking the harness"
        harness.check()
        stage = "preparing the harness"
        harness.prepare(ctx)
        stage = "running the harness"
        reserve = min(_RESERVE_S, spec.timeout_s * 0.2)
        proc = run_harness(harness, ctx, root, deadline - time.monotonic() - reserve)
        stage = "parsing the harness output"
        output: HarnessOutput = harness.parse_output(ctx, proc)
        status = _STATUS[output.status]
        harness_output = output.model_dump(mode="json")
        harness_output["returncode"] = proc.returncode
        harness_output["stderr_tail"] = proc.stderr[-2000:]
        if status not in ("ok", "harness_error"):
            error = output.error or f"harness {output.status}"
            return done(status=status, error=error, final_answer=output.final_answer,
                        harness_output=harness_output)
        stage = "capturing the final state"
        final_state = dict(environment.final_state(spec.task, workspace))
        # Rewards that judge the answer rather than the workspace read it from here.
        final_state.setdefault("final_answer", output.final_answer)
        final_state.setdefault("harness_status", output.status)
        # The harness's own account of the conversation (e.g. OpenClaw's session events),
        # for rewards that grade a transcript in the harness's format.
        final_state.setdefault("harness_transcript", output.transcript)
        stage = "scoring"
        calls = fetch_calls(spec) if reward.wants_calls else None
        verdict = reward.score(spec.task, environment, workspace, final_state, calls)
        return done(status=status, reward=verdict, final_answer=output.final_answer,
                    error=output.error, harness_output=harness_output)
    except HarnessMissingError as exc:
        return done(status="infra_error", error=f"harness missing: {exc}")
    except _Terminated:
        return done(status="infra_error", error=f"terminated while {stage}")
    except Exception as exc:  # a plugin failed: infrastructure, never a 0 reward
        print(traceback.format_exc(), file=sys.stderr)  # the executor keeps the stderr tail
        return done(status="infra_error", error=f"{stage} failed: {type(exc).__name__}: {exc}"[:2000])
    finally:
        if environment is not None:
            try:
                environment.close()
            except Exception:
                pass


def fetch_calls(spec: RolloutSpec) -> list[Call]:
    """The session's recorded calls, read with its own token (for rewards that want them)."""
    url = f"{spec.gateway_url.rstrip('/')}/s/{spec.session_token}/calls"
    response = httpx.get(url, timeout=30.0)
    response.raise_for_status()
    return [Call.model_validate(c) for c in response.json()["calls"]]


def report(spec: RolloutSpec, result: RolloutResult, attempts: int = 3) -> bool:
    """POST the result to the gateway, with retries. False when it could not be delivered."""
    url = f"{spec.gateway_url.rstrip('/')}/s/{spec.session_token}/result"
    body = result.model_dump(mode="json")
    for i in range(attempts):
        try:
            response = httpx.post(url, json=body, timeout=10.0)
            if response.status_code < 300:
                return True
            if response.status_code < 500:
                return False  # the gateway rejected it; retrying will not help
        except httpx.HTTPError:
            pass
        time.sleep(0.2 * (2 ** i))
    return False


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # A Kubernetes Pod cannot read the orchestrator's disk: its spec comes in $OPENFORGE_SPEC.
    from_env = not args and bool(os.environ.get(SPEC_ENV))
    if len(args) != 1 and not from_env:
        print("usage: python -m openforge.rollout SPEC_JSON_PATH  (or the spec JSON in "
              f"${SPEC_ENV})", file=sys.stderr)
        return 2
    source = f"${SPEC_ENV}" if from_env else args[0]
    try:
        text = os.environ[SPEC_ENV] if from_env else Path(args[0]).read_text()
        spec = RolloutSpec.model_validate_json(text)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read rollout spec {source}: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    rollout_dir = os.environ.get("OPENFORGE_ROLLOUT_DIR")
    root = Path(rollout_dir) if rollout_dir else Path(tempfile.mkdtemp(prefix="openforge-rollout-"))
    try:
        result = execute(spec, root)
    finally:
        if not rollout_dir:  # ours to remove; an executor's directory is the executor's
            shutil.rmtree(root, ignore_errors=True)
    delivered = report(spec, result)
    if not delivered:
        print("warning: could not POST the result to the gateway; relying on stdout",
              file=sys.stderr)
    sys.stdout.write("\n" + RESULT_PREFIX + json.dumps(result.model_dump(mode="json")) + "\n")
    sys.stdout.flush()
    termination_log = os.environ.get("OPENFORGE_TERMINATION_LOG")
    if termination_log:  # in a Kubernetes Pod: a compact copy in the Pod's status
        from openforge.executors.k8s_result import write_termination_message

        write_termination_message(termination_log, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
