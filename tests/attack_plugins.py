"""The adversarial suite's environment and the attacks a scripted policy runs through `mini`.

`AttackEnv` has one task per attack (prompt `ATTACK <name>`); a task passes only when the
workspace's `answer.txt` equals the task data's `expected.txt` (no attack copies it; `tamper`
rewrites it instead, `link` links to the grader's copy of it, a file the sandbox never
shows). The data folder is the task's `data_paths`, so the reward reads a file outside the
workspace. Like a checker that runs the agent's tests, the check also runs the workspace's
`verify.py` when there is one (through `openforge.sandbox.verifier`).

`solutions(know)` is the scripted policy: for each attack one shell command,
`python -m attack_programs NAME KNOW`, where KNOW is what an attacker is assumed to know
(the run's folders, the canary's path, the data folder, the victim's port, a neighbour's
port, the meeting point).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.options import PluginOptions
from openforge.sandbox import verifier
from openforge.types import RewardResult, Task

ATTACKS = ("forge", "kill", "orphans", "canary", "link", "trojan", "neighbour", "all")
TAMPER_ATTACKS = ("tamper", "exploit")  # run in this order, one at a time
SIBLING_ATTACKS = ("victim", "sibling")  # run side by side
# The machine's processes, memory and CPU (local executor).
LIMIT_ATTACKS = ("forkbomb", "hog", "spin")
DISK_ATTACKS = ("fill", "litter")  # the machine's disk: bytes and inodes (local executor)
TMP_ATTACKS = ("stuff",)  # the machine's memory through the sandbox's tmpfs (local executor)
CANARY = "CANARY-7c1e0d5b-do-not-leak"
SECRET_ANSWER = "the-honest-answer-nobody-writes"


class AttackOptions(PluginOptions):
    """Options of `AttackEnv`."""

    attacks: list[str]
    """The attacks to run, one task each."""
    data: Path
    """The task data folder (holds expected.txt)."""


class AttackEnv(Environment):
    """One task per attack in option `attacks`; the data folder is option `data`."""

    options_model = AttackOptions
    options: AttackOptions

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for name in self.options.attacks:
            yield Task(id=name, prompt=f"ATTACK {name}")

    def data_paths(self, task: Task) -> list[Path]:
        return [self.options.data]

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        answer = workspace / "answer.txt"
        expected = self.options.data / "expected.txt"
        ok = answer.exists() and answer.read_text() == expected.read_text()
        details: dict[str, Any] = {}
        if (workspace / "verify.py").exists():
            # Like a checker that runs the agent's tests: what the agent wrote, run to score.
            ran = verifier.run([sys.executable, "verify.py"], cwd=workspace, timeout_s=60)
            details["verify_output"] = (ran.stdout + ran.stderr)[-3000:]
        return RewardResult(score=1.0 if ok else 0.0, passed=ok, details=details)


# -- the policy -----------------------------------------------------------------------------------


def attack_command(name: str, know: dict[str, Any]) -> str:
    """The shell command the policy runs for attack `name` (tests/attack_programs.py, which the
    sandboxes see read-only on PYTHONPATH, like any code the agent could write itself)."""
    return f"python -m attack_programs {name} {shlex.quote(json.dumps(know))}"


def solutions(know: dict[str, Any]) -> list[dict[str, Any]]:
    """The scripted engine's script: each attack task runs its attack, then says done; the
    victim and the sibling run theirs up to three times, until they have met."""
    script = []
    for name in (*ATTACKS, *TAMPER_ATTACKS, *SIBLING_ATTACKS, *LIMIT_ATTACKS, *DISK_ATTACKS,
                 *TMP_ATTACKS):
        call = {"tool_calls": [{"name": "shell",
                                "arguments": {"command": attack_command(name, know)}}]}
        tries = 3 if name in SIBLING_ATTACKS else 1
        script.append({"match": f"ATTACK {name}$",
                       "replies": [call] * tries + [{"content": f"{name} done"}]})
    return script
