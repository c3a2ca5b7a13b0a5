"""The rollout supervisor: the trusted process that runs one attempt and scores it.

    python -m openforge.rollout [--sandbox MODE] [--dir DIR] [--protect PATH]...
                                [--pass-env NAME]... [--key-on-stdin] SPEC_JSON

Every executor runs this program *outside* the agent's sandbox. It builds the environment,
harness and reward named in the `RolloutSpec`, prepares the workspace (services the
environment starts are the supervisor's own children, outside the sandbox, reachable over
loopback), and launches only the harness command inside the agent's sandbox
(`openforge.sandbox.agent`: bubblewrap, namespaces or none). When the harness ends or its
time is up, every process of the sandbox is ended and shown to be gone; only then does the
supervisor remove what the agent left that the trusted side must not follow (links out of
the sandbox's view, FIFOs: `sandbox.scrub`, counted in the reward's details), parse the
harness's output, look in it for a result line the agent wrote (`sandbox.forgery`), check
the task's data for tampering, capture the final state and score it. No process of the
agent exists while scoring happens, so nothing the agent did can write the result.

The result is printed as the last line of stdout (`openforge.sandbox.protocol`: signed with
the per-attempt key the executor gives on stdin with `--key-on-stdin`).

A Kubernetes Pod runs this same `Supervisor` in its trusted sidecar container, with a
`launch` hook that hands the harness command to the Pod's agent container instead of a
sandbox here (`openforge.executors.k8s_sandbox`): the agent's sandbox is its container.

Directory layout (DIR, default: a fresh temp dir removed at the end): DIR holds the
supervisor's own files (the harness's captured stdout/stderr, the sandbox plan), never
mapped into the sandbox; `DIR/agent/` is the agent's part: `workspace/`, `home/` (its HOME
and XDG folders), `tmp/`. `--protect PATH` names folders no sandbox may see (the run's
directory); the folder holding DIR and the user's HOME are always protected.

Plugin names are looked up in the registry; a name of the form `module:attr` is imported
directly (used by tests and benchmarks for throwaway plugins). The reward sees the
environment's final state plus `final_answer`, `harness_status` and `harness_transcript`
(the harness's own account), unless the environment already set those keys.

The task's own tool servers (`Environment.mcp_servers`, named after `prepare`) go to the
harness in `HarnessContext.mcp_servers`; the harness starts them, so they run inside the
agent's sandbox and reach what `prepare` started over loopback, like the harness itself.

Statuses (`openforge.types`): the harness completed -> `ok`; failed on its own ->
`harness_error`; the task's data changed under the agent, or the agent's output holds a
result line ("forged result line") -> `violation` (scored 0, not scored by the reward); the
sandbox, the supervisor, the harness program or the engine failed, or a plugin could not be
found or imported -> `infra_error`; out of time -> `timeout`; but a harness that crashed or
ran out of time after the model answered it, with no engine failure to blame, ended by the
agent's own doing -> `harness_error`, scored (`openforge.attribution`); environment, harness-adapter
or reward code raised -> `plugin_error` (not scored, not retried: a bug to fix), with an
error that names the plugin, the stage and the method: "reward 'checker' raised
ZeroDivisionError: ... while scoring (score)".
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

from openforge import plugins
from openforge.attribution import agents_own_end
from openforge.environment import Environment
from openforge.errors import RolloutInfraError
from openforge.executors.process import (
    LeftoverError,
    become_subreaper,
    make_undumpable,
    own_descendants,
)
from openforge.harness import (
    Command,
    Harness,
    HarnessContext,
    HarnessMissingError,
    HarnessOutput,
    ProcessOutput,
)
from openforge.reward import Reward
from openforge.sandbox import bounded, forgery, ports, tamper, verifier
from openforge.sandbox.agent import AgentExit, run_agent
from openforge.sandbox.leftovers import make_folder
from openforge.sandbox.modes import ISOLATING, SandboxMode, SandboxUnavailable, resolve
from openforge.sandbox.protocol import MARKER_ENV, SANDBOX_ENV, result_line, scrub_env
from openforge.sandbox.relay import Relay
from openforge.sandbox.scrub import scrub_agent, tally
from openforge.sandbox.view import View, build_view, unmapped
from openforge.types import Call, RewardResult, RolloutResult, RolloutSpec, RolloutStatus

# Characters of the agent's stdout and stderr (each, the end) carried back in the result:
# the run folder keeps them per attempt (logs/).
AGENT_LOG_CHARS = 32 * 1024
# Seconds kept back from the harness for final state, reward and reporting.
_RESERVE_S = 10.0
_STATUS: dict[str, RolloutStatus] = {"completed": "ok", "failed": "harness_error",
                                     "crashed": "infra_error", "timeout": "timeout"}


# Runs the harness command in the agent's sandbox and returns once every process of it is
# gone: (command, env, stdout, stderr, timeout_s, view: what the agent is meant to see) ->
# how it ended, its output written to `stdout` and `stderr`. Without a hook a supervisor
# launches into a sandbox of its mode on this machine (`Supervisor.launch_here`); a Pod's
# supervisor hands the command to the Pod's agent container (`openforge.executors.k8s_sandbox`).
Launch = Callable[[Command, dict[str, str], Path, Path, float, View], AgentExit]


class _Terminated(Exception):
    """The executor asked us to stop (SIGTERM)."""


class _Stop(Exception):
    """End the attempt now with this status and error."""

    def __init__(self, status: RolloutStatus, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


def build_plugin(kind: str, name: str, options: dict[str, Any]) -> Any:
    """The plugin `name` of `kind`: a registered name, or `module:attr` imported directly."""
    if ":" in name:
        return resolve_name(name)(**options)
    return plugins.create(kind, name, **options)


def _plugin_failure(blame: str, stage: str, exc: BaseException) -> _Stop:
    """An exception from the code of plugin `blame` (e.g. "reward 'checker'"): a plugin bug,
    not retried, unless it says infrastructure (`RolloutInfraError`)."""
    print(traceback.format_exc(), file=sys.stderr)  # the executor keeps the stderr tail
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RolloutInfraError):
        return _Stop("infra_error", f"{stage} failed: {what}"[:2000])
    return _Stop("plugin_error", f"{blame} raised {what} while {stage}"[:2000])


def agent_layout(root: Path, agent: Path | None = None,
                 workspace: Path | None = None) -> dict[str, Path]:
    """The agent's part of the rollout directory (`root/agent` unless given, its workspace
    inside unless given), and its HOME / XDG / TMPDIR variables."""
    agent = agent or root / "agent"
    dirs = {"AGENT": agent, "WORKSPACE": workspace or agent / "workspace", "HOME": agent / "home",
            "XDG_CONFIG_HOME": agent / "home/.config", "XDG_CACHE_HOME": agent / "home/.cache",
            "XDG_DATA_HOME": agent / "home/.local/share",
            "XDG_STATE_HOME": agent / "home/.local/state", "TMPDIR": agent / "tmp"}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    agent.chmod(0o755)
    return dirs


def agent_env(dirs: dict[str, Path], command_env: dict[str, str], marker: str,
              pass_env: list[str] | None = None) -> dict[str, str]:
    """The harness's environment: the allowlist, its own HOME, the harness's own variables."""
    env = scrub_env(os.environ, pass_env or [])
    env.update({name: str(path) for name, path in dirs.items()
                if name not in ("AGENT", "WORKSPACE")})
    env[MARKER_ENV] = marker
    env["PYTHONUNBUFFERED"] = "1"
    env.update(command_env)
    return env


class Supervisor:
    """One attempt, from building the plugins to the verdict (see the module docstring)."""

    def __init__(self, spec: RolloutSpec, root: Path, mode: SandboxMode,
                 protected: list[Path] | None = None, pass_env: list[str] | None = None, *,
                 launch: Launch | None = None, sandbox: str | None = None,
                 agent_dir: Path | None = None, workspace: Path | None = None,
                 cgroups: list[str] | None = None, tmp_max: int | None = None) -> None:
        """`mode` builds the agent's sandbox here (and the sandboxes that run the agent's
        code while scoring), each started inside the rollout's `cgroups` (their
        `cgroup.procs` files: `sandbox.cgroups`), with a private /tmp and /dev/shm of
        `tmp_max` bytes each (None: the kernel's default, half the machine's memory). With
        `launch`, the agent runs elsewhere (a Pod's agent container): `sandbox` names that
        isolation in the result, `agent_dir` and `workspace` are the folders the agent
        shares with this process."""
        self.spec = spec
        self.root = root
        self.mode = mode
        self.cgroups = cgroups or []
        self.tmp_max = tmp_max
        self.launch = launch
        self.sandbox = sandbox or mode
        # Whether the agent's files are its own (else its writes to the task's data are checked).
        self.isolating = self.sandbox != "none"
        self.agent_dir, self.workspace = agent_dir, workspace
        self.pass_env = pass_env or []
        self.protected = [*(protected or []), root.parent, Path.home()]
        self.stage = "loading the plugins"
        # Who is to blame for an exception in each plugin's code.
        self.blame = {"environment": f"environment '{spec.environment}'",
                      "harness": f"harness '{spec.harness}'",
                      "reward": f"reward '{spec.reward}'"}

    def run(self) -> RolloutResult:
        """Run the attempt end to end; never raises for plugin or sandbox failures."""
        spec = self.spec
        started = time.monotonic()
        base: dict[str, Any] = {"rollout_id": spec.rollout_id, "task_id": spec.task.id,
                                "attempt": spec.attempt, "session_id": spec.session_id,
                                "sandbox": self.sandbox}
        self._environment: Environment | None = None
        self._relay: Relay | None = None
        try:
            fields = self._attempt(started)
            return RolloutResult(**base, duration_s=time.monotonic() - started, **fields)
        except _Stop as stop:
            return RolloutResult(**base, status=stop.status, error=stop.error,
                                 duration_s=time.monotonic() - started)
        except _Terminated:
            return RolloutResult(**base, status="infra_error", error=f"terminated while {self.stage}",
                                 duration_s=time.monotonic() - started)
        finally:
            if self._relay is not None:
                self._relay.close()
            if self._environment is not None:
                try:
                    self._environment.close()
                except Exception:  # noqa: BLE001 - the verdict stands; the log has it
                    print(traceback.format_exc(), file=sys.stderr)

    def _build(self) -> tuple[Environment, Harness, Reward]:
        spec = self.spec
        wanted = (("environment", spec.environment, spec.environment_options),
                  ("harness", spec.harness, spec.harness_options),
                  ("reward", spec.reward, spec.reward_options))

        def missing(kind: str, name: str, exc: Exception) -> _Stop:
            # Not installed where the supervisor runs (a Pod's image): infrastructure.
            return _Stop("infra_error", f"loading the plugins failed: {kind} '{name}': "
                                        f"{type(exc).__name__}: {exc}"[:2000])

        # Finding and importing them is the infrastructure's business; what their code does
        # from here on (their constructors included) is theirs.
        for kind, name, _ in wanted:
            try:
                plugins.options_model(kind, name)
            except Exception as exc:
                raise missing(kind, name, exc) from None
        built = []
        for kind, name, options in wanted:
            self.stage = f"building the {kind}"
            try:
                built.append(build_plugin(kind, name, options))
            except ImportError as exc:  # a dependency it imports when built
                raise missing(kind, name, exc) from None
            except Exception as exc:
                raise _plugin_failure(self.blame[kind], self.stage, exc) from None
            if kind == "environment":
                self._environment = built[0]
        return built[0], built[1], built[2]

    def _call(self, kind: str, stage: str, fn: Any, *args: Any) -> Any:
        """`fn(*args)`, code of the `kind` plugin: what it raises is that plugin's error."""
        self.stage = stage
        try:
            return fn(*args)
        except (_Terminated, _Stop):
            raise
        except Exception as exc:
            raise _plugin_failure(self.blame[kind], stage, exc) from None

    def _attempt(self, started: float) -> dict[str, Any]:
        spec = self.spec
        deadline = started + spec.timeout_s
        environment, harness, reward = self._build()
        dirs = agent_layout(self.root, self.agent_dir, self.workspace)
        workspace, home = dirs["WORKSPACE"], dirs["HOME"]
        ctx = HarnessContext(task=spec.task, workspace=workspace, home=home,
                             base_url=spec.session_url, api_key=spec.session_token,
                             model=spec.model, timeout_s=spec.timeout_s)
        self._call("environment", "preparing the environment (prepare)", environment.prepare,
                   spec.task, workspace)
        ctx.mcp_servers = self._call("environment", "listing the task's tool servers "
                                     "(mcp_servers)", environment.mcp_servers, spec.task, workspace)
        self.stage = "checking the harness (check)"
        try:
            harness.check()
        except HarnessMissingError as exc:
            raise _Stop("infra_error", f"harness missing: {exc}") from None
        except Exception as exc:
            raise _plugin_failure(self.blame["harness"], self.stage, exc) from None
        self._call("harness", "preparing the harness (prepare)", harness.prepare, ctx)
        command = self._call("harness", "building the harness command (command)",
                             harness.command, ctx)
        data = [Path(p) for p in self._call("environment", "listing the task's data (data_paths)",
                                            environment.data_paths, spec.task)]
        hidden = self._call("environment", "listing the task's hidden folders (hidden_paths)",
                            environment.hidden_paths, spec.task)
        programs = self._call("harness", "listing the harness's program paths (program_paths)",
                              harness.program_paths)
        before = tamper.digest(data) if not self.isolating else {}

        self.stage = "running the harness"
        # Without isolation the view is not mounted, but it still says what the agent was
        # meant to see: links out of it are removed before the trusted side reads anything.
        view = build_view(dirs["AGENT"], workspace=workspace, programs=programs, data=data,
                          protected=self.protected, hidden=hidden, tmpfs_size=self.tmp_max)
        if self.launch is None and self.isolating:
            for dropped in view.dropped:
                print(f"openforge.rollout: not mapped into the sandbox: {dropped}", file=sys.stderr)
            # bubblewrap starts the agent under this Python; either mode execs the harness's
            # program. One the view cannot map would fail as "No such file": say why instead.
            program = shutil.which(command.argv[0], path=command.env.get("PATH")) \
                if command.argv else None
            lost = unmapped(view, [*([sys.executable] if self.mode == "bwrap" else []),
                                   *([program] if program else [])])
            if lost:
                raise _Stop("infra_error", f"the sandbox cannot map what the agent runs on "
                            f"({', '.join(lost)}): {'; '.join(view.dropped) or 'not in the view'}."
                            " Keep the rollouts' folder (TMPDIR) and the run folders outside the "
                            "Python environment and the harness's install")
        marker = os.environ.get(MARKER_ENV) or f"{spec.rollout_id}-{os.getpid()}"
        env = agent_env(dirs, command.env, marker, self.pass_env)
        reserve = min(_RESERVE_S, spec.timeout_s * 0.2)
        out_path, err_path = self.root / "harness.stdout", self.root / "harness.stderr"
        command = command.model_copy(update={"cwd": command.cwd or workspace})
        timeout_s = deadline - time.monotonic() - reserve
        if self.mode in ISOLATING:
            self._relay = self._open_relay()
        launch = self.launch or self.launch_here
        try:
            exit_ = launch(command, env, out_path, err_path, timeout_s, view)
        except LeftoverError as exc:
            raise _Stop("infra_error", f"could not end the agent's processes: {exc}") from None
        if exit_.setup_error:  # the sandbox or the harness program could not start
            raise _Stop("infra_error", f"starting the harness failed: {exit_.setup_error}")
        # From here on no process of the agent exists: its session takes no more model calls
        # (nothing that runs while we score can add one), and what it left is made safe.
        self.stage = "sealing the session"
        seal_session(spec)
        removed = scrub_agent(dirs["AGENT"], view)
        proc = ProcessOutput(returncode=exit_.returncode, stdout=bounded.tail(out_path, 200_000),
                             stderr=bounded.tail(err_path, max(20_000, AGENT_LOG_CHARS)),
                             timed_out=exit_.timed_out, duration_s=exit_.duration_s)

        output: HarnessOutput = self._call("harness", "parsing the harness output (parse_output)",
                                           harness.parse_output, ctx, proc)
        status = _STATUS[output.status]
        recorded: list[Call] | None = None
        if output.status in ("crashed", "timeout") and spec.scoring_token and spec.session_id:
            # The agent can crash its harness or stall it at will: the gateway's record says
            # whether the infrastructure could be at fault (`openforge.attribution`).
            self.stage = "fetching the recorded calls"
            recorded = fetch_calls(spec)
            own = agents_own_end(output.status, recorded)
            if own is not None:
                status = "harness_error"
                output = output.model_copy(update={
                    "error": f"{output.error or 'harness ' + output.status}; {own}"})
        harness_output = output.model_dump(mode="json")
        harness_output.update(returncode=proc.returncode, stderr_tail=proc.stderr[-2000:],
                              ended_processes=exit_.ended, removed_files=removed[:20],
                              # The agent's own output, whatever became of the attempt.
                              stdout=proc.stdout[-AGENT_LOG_CHARS:],
                              stderr=proc.stderr[-AGENT_LOG_CHARS:])
        fields: dict[str, Any] = {"final_answer": output.final_answer,
                                  "harness_output": harness_output}
        violation = self._forged([out_path, err_path], fields) or \
            self._violation(data, before, fields)
        if violation is not None:
            return _noted(violation, removed)
        if status not in ("ok", "harness_error"):
            return {**fields, "status": status, "error": output.error or f"harness {output.status}"}
        # Scoring code that runs what the agent wrote runs it in a fresh sandbox of this
        # attempt (openforge.sandbox.verifier), without the session token.
        with verifier.active(self.mode, view, dirs["AGENT"], self.root,
                             agent_env(dirs, {}, marker, self.pass_env),
                             relay=self._relay, cgroups=self.cgroups) as checks:
            final_state = dict(self._call("environment",
                                          "capturing the final state (final_state)",
                                          environment.final_state, spec.task, workspace))
            # Rewards that judge the answer rather than the workspace read it from here.
            final_state.setdefault("final_answer", output.final_answer)
            final_state.setdefault("harness_status", output.status)
            # The harness's own account of the conversation (e.g. OpenClaw's session events),
            # for rewards that grade a transcript in the harness's format.
            final_state.setdefault("harness_transcript", output.transcript)
            self.stage = "fetching the recorded calls"
            calls = (recorded if recorded is not None else fetch_calls(spec)) \
                if reward.wants_calls else None
            verdict = self._call("reward", "scoring (score)", reward.score, spec.task,
                                 environment, workspace, final_state, calls)
        removed += checks.removed
        harness_output["removed_files"] = removed[:20]
        if not isinstance(verdict, RewardResult):
            raise _Stop("plugin_error", f"{self.blame['reward']} returned "
                                        f"{type(verdict).__name__}, not a RewardResult, while "
                                        "scoring (score)")
        # What the checks ran of the agent's could have changed the data too.
        violation = self._violation(data, before, fields)
        if violation is not None:
            return _noted(violation, removed)
        return _noted({**fields, "status": status, "reward": verdict, "error": output.error},
                      removed)

    def _open_relay(self) -> Relay:
        """The ports a sandbox of this attempt may reach (the gateway and this supervisor's
        own services, started by `prepare`), carried into its network namespace."""
        host, port = ports.gateway(self.spec.session_url)
        if self.launch is None and not ports.loopback(host):
            raise _Stop("infra_error", f"starting the harness failed: the gateway's host {host!r} "
                        "is not a loopback address, and an isolated sandbox reaches only "
                        "127.0.0.1: serve the gateway on 127.0.0.1 or use sandbox=none")
        if port < ports.UNPRIVILEGED:
            print(f"openforge.rollout: the gateway's port {port} is below "
                  f"{ports.UNPRIVILEGED}: the sandbox cannot reach it", file=sys.stderr)
        return Relay(ports.allowed(self.spec.session_url))

    def launch_here(self, command: Command, env: dict[str, str], stdout: Path, stderr: Path,
                    timeout_s: float, view: View) -> AgentExit:
        """Launch into a sandbox of this supervisor's mode, on this machine, in `view`."""
        return run_agent(self.mode, command, env=env, view=view, work_dir=self.root,
                         stdout=stdout, stderr=stderr, timeout_s=timeout_s, relay=self._relay,
                         # The supervisor's own children so far (services the environment
                         # started) are not the agent's.
                         trusted=own_descendants(), cgroups=self.cgroups)

    def _forged(self, outputs: list[Path], fields: dict[str, Any]) -> dict[str, Any] | None:
        """The verdict when the agent's own output holds a result line (`sandbox.forgery`):
        it tried to forge one, whether or not anything would have read it."""
        found = forgery.in_files(outputs)
        if not found:
            return None
        where = f"the agent's output ({', '.join(name for name, _ in found)})"
        return {**fields, **forgery.verdict(where, [line for _, lines in found for line in lines])}

    def _violation(self, data: list[Path], before: dict[str, str],
                   fields: dict[str, Any]) -> dict[str, Any] | None:
        """The verdict when the task's data changed under the agent (sandbox none only)."""
        if not data or self.isolating:
            return None
        changed = tamper.changes(before, tamper.digest(data))
        if not changed:
            return None
        # The agent did it: scored 0, labelled (docs/sandboxing.md).
        verdict = RewardResult(score=0.0, passed=False, details={
            "violation": "task data changed", "paths": changed[:20]})
        return {**fields, "status": "violation", "reward": verdict,
                "error": "violation: the agent changed the task's data: " + ", ".join(changed[:5])}


def _noted(fields: dict[str, Any], removed: list[str]) -> dict[str, Any]:
    """`fields`, with how many links and special files the agent left that were removed
    (`scrub.tally`) in its reward's details: what it tried stays visible where the reward is
    read, a Pod's compact result included."""
    counts = tally(removed)
    reward = fields.get("reward")
    if not counts or reward is None:
        return fields
    return {**fields, "reward": reward.model_copy(update={"details": {**reward.details, **counts}})}


def _scoring(spec: RolloutSpec, method: str, route: str) -> Any:
    """A scoring route of the spec's session, with its scoring credential (the JSON answer).

    The standard library's client, not httpx: importing httpx and building its client cost
    each rollout 0.24-0.35 CPU-s for two requests (urllib: 0.002). A connection that fails
    is tried three times; an answer that is an HTTP error or a redirect is raised at once."""
    url = f"{spec.gateway_url.rstrip('/')}/scoring/sessions/{spec.session_id}/{route}"
    request = urllib.request.Request(
        url, method=method, headers={"Authorization": f"Bearer {spec.scoring_token}"})
    for attempt in range(3):
        try:
            with _no_redirects().open(request, timeout=60.0) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError:
            raise
        except (OSError, http.client.HTTPException):  # refused, reset, timed out, cut short
            if attempt == 2:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("not reached")


class _Unfollowed(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is raised as an HTTPError


def _no_redirects() -> urllib.request.OpenerDirector:
    """urllib's client without its redirects (httpx's default too): the scoring credential
    goes to the gateway's address and nowhere a 3xx points."""
    return urllib.request.build_opener(_Unfollowed)


def seal_session(spec: RolloutSpec) -> None:
    """Close the session for model calls now that its agent has ended (when the spec has the
    credential to; specs without one come from tests and tools that score offline)."""
    if not spec.scoring_token or not spec.session_id:
        return
    try:
        _scoring(spec, "POST", "seal")
    except Exception as exc:  # noqa: BLE001 - any failure: never score an unsealed session
        raise _Stop("infra_error", f"sealing the session failed: {type(exc).__name__}: "
                                   f"{exc}"[:2000]) from None


def fetch_calls(spec: RolloutSpec) -> list[Call]:
    """The session's recorded calls, read on the trusted side with the scoring credential."""
    if not spec.scoring_token or not spec.session_id:
        raise _Stop("infra_error", "the reward wants the recorded calls, but the spec carries no "
                                   "scoring credential for its session")
    try:
        return [Call.model_validate(c) for c in _scoring(spec, "GET", "calls")["calls"]]
    except Exception as exc:  # noqa: BLE001 - the gateway did not answer: infrastructure
        raise _Stop("infra_error", f"fetching the recorded calls failed: {type(exc).__name__}: "
                                   f"{exc}"[:2000]) from None


def agents_own_crash(spec: RolloutSpec) -> str | None:
    """Why the end of the attempt, before anything was scored, was the agent's own doing
    (`attribution.agents_own_end` on the session's recorded calls), or None: the
    infrastructure's, or nothing to tell (no scoring credential: a resumed try keeps only
    its hash; a gateway that does not answer). For an executor that ended the attempt, or
    saw it end, for what the agent did (a Pod's agent container killed, a local rollout's
    folder past its disk limit)."""
    if not spec.scoring_token or not spec.session_id:
        return None
    try:
        calls = fetch_calls(spec)
    except Exception:  # noqa: BLE001 - the gateway did not answer: the infrastructure's
        return None
    return agents_own_end("crashed", calls, scored=False)


def execute(spec: RolloutSpec, root: Path, mode: SandboxMode = "none",
            protected: list[Path] | None = None, pass_env: list[str] | None = None,
            **launched: Any) -> RolloutResult:
    """Run one attempt in `root` (its directory) and return the result (`launched`: see
    `Supervisor`, for an agent that runs elsewhere)."""
    return Supervisor(spec, root, mode, protected, pass_env, **launched).run()


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m openforge.rollout",
                                     description="Run and score one rollout attempt.")
    parser.add_argument("spec", help="the RolloutSpec JSON file")
    parser.add_argument("--sandbox", default=os.environ.get(SANDBOX_ENV) or "auto",
                        help="auto, bwrap, namespaces or none")
    parser.add_argument("--dir", type=Path, help="the rollout directory (default: a temp dir)")
    parser.add_argument("--protect", type=Path, action="append", default=[],
                        help="a folder the agent's sandbox must not see (repeatable)")
    parser.add_argument("--pass-env", action="append", default=[],
                        help="an extra environment variable the agent may see (repeatable)")
    parser.add_argument("--key-on-stdin", action="store_true",
                        help="read the result key (hex) from stdin and sign the result with it")
    parser.add_argument("--cgroup", action="append", default=[],
                        help="the cgroup.procs file of a cgroup every sandbox of the attempt "
                             "starts in (repeatable; the local executor makes them)")
    parser.add_argument("--tmp-max", type=int, default=None, metavar="BYTES",
                        help="the size of each isolated sandbox's private /tmp and /dev/shm "
                             "(memory; default: the kernel's, half the machine's memory)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    key = bytes.fromhex(sys.stdin.readline().strip()) if args.key_on_stdin else None
    try:
        spec = RolloutSpec.model_validate_json(Path(args.spec).read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read rollout spec {args.spec}: {exc}", file=sys.stderr)
        return 2
    # Every orphan of the agent comes back to us (sandbox none), and a same-user agent
    # cannot read our memory, environment or descriptors (when we are not root).
    become_subreaper()
    make_undumpable()
    signal.signal(signal.SIGTERM, _on_sigterm)
    root = args.dir.resolve() if args.dir else make_folder("rollout")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    try:
        try:
            mode = resolve(args.sandbox)
        except SandboxUnavailable as exc:
            result = RolloutResult(rollout_id=spec.rollout_id, task_id=spec.task.id,
                                   attempt=spec.attempt, session_id=spec.session_id,
                                   status="infra_error", error=str(exc))
        else:
            result = execute(spec, root, mode, args.protect, args.pass_env,
                             cgroups=args.cgroup, tmp_max=args.tmp_max)
    finally:
        if not args.dir:  # ours to remove; an executor's directory is the executor's
            shutil.rmtree(root, ignore_errors=True)
    sys.stdout.write("\n" + result_line(result, key) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
