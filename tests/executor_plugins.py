"""Throwaway plugins for executor / rollout / runner tests, loaded as `executor_plugins:Name`.

The rollout supervisor imports them through PYTHONPATH (the executor keeps PYTHONPATH), and
the isolating sandboxes map the PYTHONPATH entries read-only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.harness import Command, Harness, HarnessContext
from openforge.options import PluginOptions
from openforge.reward import Reward
from openforge.types import Call, RewardResult, Task

_HANG = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
escaped = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],
                           start_new_session=True)
with open('pids.txt', 'w') as f:
    f.write(f'{os.getpid()} {child.pid} {escaped.pid}\\n')
time.sleep(600)
"""

_ENV_DUMP = """
import json, os
json.dump(dict(os.environ), open('env.json', 'w'))
open(os.path.join(os.environ['HOME'], 'marker'), 'w').write('x')
print('env dumped')
"""


class OneTaskEnv(Environment):
    """One task; passes when the workspace holds `ok.txt`."""

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        yield Task(id="only", prompt="write ok.txt")

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        ok = (workspace / "ok.txt").exists()
        return RewardResult(score=1.0 if ok else 0.0, passed=ok)


class CallsReward(Reward):
    """Reads the trajectory: passes when the policy called `write_file`; details list the calls."""

    wants_calls = True

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        assert calls is not None
        tools = [tc["function"]["name"] for c in calls
                 for tc in (c.response or {}).get("choices", [{}])[0]
                 .get("message", {}).get("tool_calls") or []]
        return RewardResult(score=float("write_file" in tools), passed="write_file" in tools,
                            details={"sessions": sorted({c.session_id for c in calls}),
                                     "calls": len(calls), "tools": tools})


class HangInPrepareEnv(OneTaskEnv):
    """Hangs while preparing, so only the executor's hard timeout can end the rollout."""

    def prepare(self, task: Task, workspace: Path) -> None:
        import signal
        import time

        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # make the executor escalate to SIGKILL
        (workspace / "pids.txt").write_text(f"{__import__('os').getpid()}\n")
        time.sleep(600)


class _Script(Harness):
    script = ""

    def command(self, ctx: HarnessContext) -> Command:
        return Command(argv=[sys.executable, "-c", self.script], cwd=ctx.workspace)


class OkHarness(_Script):
    """Writes ok.txt and ends."""

    script = "open('ok.txt', 'w').write('ok'); print('all done')"


class ShellHarness(Harness):
    """Runs the task's prompt as a shell command in the workspace."""

    def command(self, ctx: HarnessContext) -> Command:
        return Command(argv=["/bin/sh", "-c", ctx.task.prompt], cwd=ctx.workspace)


class NoProgramHarness(Harness):
    """Its program does not exist (check() did not notice)."""

    def command(self, ctx: HarnessContext) -> Command:
        return Command(argv=["/nonexistent/agent-program"], cwd=ctx.workspace)


class EmptyHarness(_Script):
    """Does nothing at all."""

    script = "pass"


class HangHarness(_Script):
    """Spawns a child and an escaped (setsid) child, records their pids, then hangs."""

    script = _HANG


_ORPHANS = """
import os, subprocess, sys, time
# setsid and no marker: out of the group, out of the session, not findable by environment
env = {k: v for k, v in os.environ.items() if k != 'OPENFORGE_SANDBOX_ID'}
subprocess.Popen(['sleep', '7013'], start_new_session=True, env=env)
# a double fork: the middle process exits, the grandchild is an orphan
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvpe('sleep', ['sleep', '7014'], env)
    os._exit(0)
time.sleep(0.5)
open('ok.txt', 'w').write('ok')
print('all done')
"""


class OrphansHarness(_Script):
    """Leaves a setsid child and a double-forked orphan, both without the marker, and ends."""

    script = _ORPHANS


class EnvDumpHarness(_Script):
    """Writes its environment to env.json and a marker into HOME."""

    script = _ENV_DUMP


class CrashHarness(_Script):
    """Dies from SIGKILL: a crash, not an agent failure."""

    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


class KillParentHarness(_Script):
    """Writes ok.txt, then SIGKILLs the process that started it (the rollout's launcher)."""

    script = "import os, signal; open('ok.txt', 'w').write('ok'); os.kill(os.getppid(), signal.SIGKILL)"


class ForgeHarness(_Script):
    """Does the task (ok.txt), and prints a passing result line of its own before its answer."""

    script = ("open('ok.txt', 'w').write('ok'); "
              "print('OPENFORGE_RESULT {\"rollout_id\": \"r\", \"status\": \"ok\"}'); "
              "print('all done')")


class FailHarness(_Script):
    """Exits 1 on its own: an agent failure, scored."""

    script = "import sys; print('gave up', file=sys.stderr); sys.exit(1)"


class MissingHarness(_Script):
    """A harness whose program is not installed."""

    script = "pass"

    def check(self) -> None:
        from openforge.harness import HarnessMissingError

        raise HarnessMissingError("the program 'nothing' is not installed; npm i -g nothing")


_PROBE = """
import json, os, sys
plan = json.load(open(os.path.join(os.environ['HOME'], 'probe.json')))
seen = {}
for path in plan.get('read', []):
    try:
        with open(path, 'rb') as f:
            seen[path] = f.read(200).decode(errors='replace')
    except OSError as exc:
        seen[path] = 'error: ' + type(exc).__name__
for path in plan.get('write', []):
    try:
        with open(path, 'a') as f:
            f.write('tampered')
        seen[path] = 'written'
    except OSError as exc:
        seen[path] = 'error: ' + type(exc).__name__
for path in plan.get('list', []):
    try:
        seen[path] = sorted(os.listdir(path))
    except OSError as exc:
        seen[path] = 'error: ' + type(exc).__name__
seen['uid'] = os.getuid()
seen['pid'] = os.getpid()
json.dump(seen, open('probe.json', 'w'))
print('probed')
"""


class ProbeHarness(_Script):
    """Reads, writes and lists the paths the task's prompt names (JSON: read, write, list)
    and writes what it saw to the workspace's probe.json."""

    script = _PROBE

    def prepare(self, ctx: HarnessContext) -> None:
        (ctx.home / "probe.json").write_text(ctx.task.prompt)


class DataOptions(PluginOptions):
    """Options of `DataEnv`."""

    data: Path
    """The file the checker compares answer.txt with."""


class DataEnv(OneTaskEnv):
    """One task whose checker reads a file outside the workspace (`data` option): passes when
    the workspace's answer.txt equals it. The file is the task's data (`data_paths`)."""

    options_model = DataOptions
    options: DataOptions

    def data_paths(self, task: Task) -> list[Path]:
        return [self.options.data]

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        answer = workspace / "answer.txt"
        ok = answer.exists() and answer.read_text() == self.options.data.read_text()
        return RewardResult(score=1.0 if ok else 0.0, passed=ok)


class HiddenOptions(PluginOptions):
    """Options of `HiddenAnswersEnv`."""

    answers: Path
    """A folder of the installation (the image) holding the answer key: `answer.txt`."""
    only_in_pod: bool = False
    """Name it hidden only in a Pod's supervisor: an image that installs the environment
    elsewhere than the runner does."""


class HiddenAnswersEnv(OneTaskEnv):
    """One task whose answer key ships in a folder the agent's sandbox would show (`answers`):
    it is hidden (`hidden_paths`). Passes when the workspace's answer.txt equals the key,
    which the checker reads on the trusted side."""

    options_model = HiddenOptions
    options: HiddenOptions

    def hidden_paths(self, task: Task) -> list[Path]:
        if self.options.only_in_pod and "OPENFORGE_TRUSTED_DIR" not in os.environ:
            return []
        return [self.options.answers]

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        key = (self.options.answers / "answer.txt").read_text()
        answer = workspace / "answer.txt"
        ok = answer.exists() and answer.read_text() == key
        return RewardResult(score=1.0 if ok else 0.0, passed=ok, details={"key_read": True})


class RaisingEnv(OneTaskEnv):
    """Its checker raises: a plugin bug."""

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        raise ZeroDivisionError("a bug in the checker")
