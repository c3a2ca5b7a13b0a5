"""The `local` executor: one rollout = one process group on this machine.

Per rollout: a fresh temporary directory holding `home/`, the XDG directories, `tmp/` and
the spec; an environment scrubbed down to an allowlist (no API keys, tokens or cloud
credentials of the user reach the harness); its own session/process group; a hard
timeout that kills the whole tree; PR_SET_PDEATHSIG so nothing outlives a crashed runner.

Sandboxing: with `sandbox="auto"` (default) the rollout runs under bubblewrap when `bwrap`
is installed (`apt-get install bubblewrap`): the whole file system read-only except the
rollout directory, a private /tmp, /proc and /dev, all namespaces unshared except the
network (the harness must reach the gateway on 127.0.0.1). `sandbox="none"` runs it as a
plain process group; `sandbox="bwrap"` requires bubblewrap.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from openforge.errors import OpenforgeError
from openforge.executor import Executor
from openforge.executors.process import MARKER_ENV, die_with_parent, kill_tree
from openforge.options import PluginOptions
from openforge.types import RolloutResult, RolloutSpec

RESULT_PREFIX = "OPENFORGE_RESULT "

_ALLOWED_EXACT = {"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL",
                  "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
                  "SSL_CERT_FILE", "SSL_CERT_DIR", "OPENFORGE_DEBUG"}
_ALLOWED_PREFIX = ("LC_", "OPENFORGE_")
# Anything that smells like a credential is dropped even when its prefix is allowed.
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


class LocalExecutorError(OpenforgeError):
    """The local executor was configured in a way it cannot honour."""


class LocalOptions(PluginOptions):
    """Options of the `local` executor (`executor_options` in the run config)."""

    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    """bwrap: bubblewrap or refuse; auto: bubblewrap when installed; none: process groups only."""
    grace_s: float = 2.0
    """Seconds between SIGTERM and SIGKILL."""
    kill_margin_s: float = 15.0
    """Extra seconds past the rollout timeout before the executor kills the rollout itself
    (the rollout enforces the harness timeout and needs a moment to report)."""
    keep_dirs: bool = False
    """Keep each rollout's folder (HOME, workspace) after it ends, for debugging."""
    base_dir: Path | None = None
    """Where rollout folders are made (default: the system temp dir)."""
    python: str = sys.executable
    """The interpreter that runs `python -m openforge.rollout`."""


def scrub_env(parent: dict[str, str]) -> dict[str, str]:
    """Keep only the allowlisted variables of `parent`, never a credential."""
    env = {}
    for name, value in parent.items():
        allowed = name in _ALLOWED_EXACT or name.startswith(_ALLOWED_PREFIX)
        if allowed and not _SECRET.search(name):
            env[name] = value
    env.setdefault("PATH", os.defpath)
    return env


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class LocalExecutor(Executor):
    """One process group per rollout, isolated HOME and temp dir, hard timeout (bubblewrap when installed)."""

    shares_filesystem = True  # rollouts run here: harness programs are installed once, here
    options_model = LocalOptions
    options: LocalOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = self.options
        bwrap = bwrap_path()
        if self.config.sandbox == "bwrap" and not bwrap:
            raise LocalExecutorError(
                "executor option sandbox=bwrap, but bubblewrap is not installed; "
                "install it (apt-get install bubblewrap) or use sandbox=auto")
        self.bwrap = bwrap if self.config.sandbox in ("auto", "bwrap") else None

    def describe_sandbox(self) -> str:
        """One line for the run's header saying how rollouts are isolated."""
        if self.bwrap:
            return f"sandbox: bubblewrap ({self.bwrap}): read-only /, private /tmp, own namespaces"
        why = "disabled by sandbox=none" if self.config.sandbox == "none" else \
            "bubblewrap not installed (apt-get install bubblewrap to enable)"
        return (f"sandbox: none ({why}); rollouts run as plain process groups with an isolated "
                "HOME and scrubbed environment, but can read and write your files")

    def _layout(self, spec: RolloutSpec) -> tuple[Path, dict[str, str]]:
        base = self.config.base_dir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"openforge-{spec.rollout_id[:40]}-",
                                     dir=str(base) if base else None)).resolve()
        dirs = {"HOME": root / "home", "XDG_CONFIG_HOME": root / "home/.config",
                "XDG_CACHE_HOME": root / "home/.cache", "XDG_DATA_HOME": root / "home/.local/share",
                "XDG_STATE_HOME": root / "home/.local/state", "TMPDIR": root / "tmp"}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        env = scrub_env(dict(os.environ))
        env.update({name: str(path) for name, path in dirs.items()})
        env["OPENFORGE_ROLLOUT_DIR"] = str(root)
        env[MARKER_ENV] = f"{spec.rollout_id}-{uuid.uuid4().hex[:8]}"
        env["PYTHONUNBUFFERED"] = "1"
        return root, env

    @staticmethod
    def _code_under_tmp(env: dict[str, str]) -> list[str]:
        """Python code paths under /tmp, which the sandbox's private /tmp would hide.

        A plugin installed with `pip install --target /tmp/x` and put on PYTHONPATH, or a
        virtual environment in /tmp, must stay importable inside the sandbox (read-only).
        """
        candidates = [*env.get("PYTHONPATH", "").split(os.pathsep), *sys.path, sys.prefix]
        found: list[str] = []
        for entry in candidates:
            if not entry:
                continue
            path = os.path.realpath(entry)
            if (path == "/tmp" or path.startswith("/tmp/")) and os.path.exists(path) \
                    and path not in found:
                found.append(path)
        return found

    def _argv(self, root: Path, spec_path: Path, env: dict[str, str]) -> list[str]:
        argv = [self.config.python, "-m", "openforge.rollout", str(spec_path)]
        if not self.bwrap:
            return argv
        binds: list[str] = []
        for path in self._code_under_tmp(env):
            binds += ["--ro-bind", path, path]
        return [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", *binds, "--bind", str(root), str(root),
                "--unshare-all", "--share-net", "--die-with-parent", "--new-session",
                "--chdir", str(root), *argv]

    async def run(self, spec: RolloutSpec) -> RolloutResult:
        started = time.monotonic()
        root, env = self._layout(spec)
        spec_path = root / "spec.json"
        spec_path.write_text(spec.model_dump_json())
        stdout_path, stderr_path = root / "rollout.stdout", root / "rollout.stderr"
        proc = None
        timed_out = False
        try:
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                # Files, not pipes: a grandchild holding a pipe open cannot stall us.
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(root, spec_path, env), stdin=asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=err, cwd=str(root), env=env,
                    start_new_session=True, preexec_fn=die_with_parent())
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that lands just as the wait completes, and then Ctrl-C would not stop the run.
            try:
                async with asyncio.timeout(spec.timeout_s + self.config.kill_margin_s):
                    await proc.wait()
            except TimeoutError:
                timed_out = True
        finally:
            # Runs on normal exit, timeout and cancellation alike: nothing survives us.
            if proc is not None:
                await asyncio.shield(asyncio.to_thread(
                    kill_tree, proc.pid, proc.pid, env[MARKER_ENV], self.config.grace_s))
                if proc.returncode is None:
                    try:
                        await asyncio.wait_for(asyncio.shield(proc.wait()), 5)
                    except TimeoutError:
                        pass
        result = self._collect(spec, stdout_path, stderr_path, proc.returncode if proc else None,
                               timed_out, time.monotonic() - started)
        if not self.config.keep_dirs:
            shutil.rmtree(root, ignore_errors=True)
        return result

    def _collect(self, spec: RolloutSpec, stdout_path: Path, stderr_path: Path,
                 returncode: int | None, timed_out: bool, duration: float) -> RolloutResult:
        base: dict[str, Any] = {"rollout_id": spec.rollout_id, "task_id": spec.task.id, "attempt": spec.attempt,
                "duration_s": duration}
        if timed_out:
            return RolloutResult(**base, status="timeout",
                                 error=f"rollout killed after the hard timeout of {spec.timeout_s:g}s")
        stdout = stdout_path.read_text(errors="replace") if stdout_path.exists() else ""
        for line in reversed(stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                try:
                    return RolloutResult.model_validate_json(line[len(RESULT_PREFIX):])
                except ValueError:
                    break
        stderr = stderr_path.read_text(errors="replace") if stderr_path.exists() else ""
        tail = (stderr.strip() or stdout.strip())[-1500:]
        return RolloutResult(**base, status="infra_error",
                             error=f"rollout process exited with code {returncode} and no result"
                                   + (f": {tail}" if tail else ""))
