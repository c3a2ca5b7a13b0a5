"""Throwaway plugins for executor / rollout / runner tests, loaded as `executor_plugins:Name`.

The rollout subprocess imports them through PYTHONPATH (the executor keeps PYTHONPATH).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.harness import Command, Harness, HarnessContext
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


class EmptyHarness(_Script):
    """Does nothing at all."""

    script = "pass"


class HangHarness(_Script):
    """Spawns a child and an escaped (setsid) child, records their pids, then hangs."""

    script = _HANG


class EnvDumpHarness(_Script):
    """Writes its environment to env.json and a marker into HOME."""

    script = _ENV_DUMP


class CrashHarness(_Script):
    """Dies from SIGKILL: a crash, not an agent failure."""

    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


class KillParentHarness(_Script):
    """Writes ok.txt, then SIGKILLs the process that started it (the rollout's launcher)."""

    script = "import os, signal; open('ok.txt', 'w').write('ok'); os.kill(os.getppid(), signal.SIGKILL)"


class FailHarness(_Script):
    """Exits 1 on its own: an agent failure, scored."""

    script = "import sys; print('gave up', file=sys.stderr); sys.exit(1)"


class ResultSink:
    """A real HTTP server on a free 127.0.0.1 port that accepts `POST /s/<token>/result`."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.results: dict[str, dict[str, Any]] = {}
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                parts = self.path.strip("/").split("/")
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if len(parts) == 3 and parts[0] == "s" and parts[2] == "result":
                    sink.results[parts[1]] = json.loads(body)
                    self.send_response(200)
                else:
                    self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MissingHarness(_Script):
    """A harness whose program is not installed."""

    script = "pass"

    def check(self) -> None:
        from openforge.harness import HarnessMissingError

        raise HarnessMissingError("the program 'nothing' is not installed; npm i -g nothing")
