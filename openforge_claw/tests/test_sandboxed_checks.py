"""The built-in tasks' checks and answers against an agent that runs shell commands.

- `command_succeeds` runs what the agent wrote (`./run.sh`, `python3 calc.py`): in a rollout
  it runs in a fresh sandbox of the attempt (`openforge.sandbox.verifier`), so the agent's
  script cannot write outside its view, yet a right script still passes and a wrong one
  fails.
- A built-in task's `task.yaml` (its grader's expected answers) and the scripted solutions
  ship inside the installed package, whose folder the sandbox maps read-only with the
  Python paths: the environment's `hidden_paths` empties them in the view, and
  `data_paths` lists only the fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ISOLATING_MODES
from openforge.sandbox import verifier
from openforge.sandbox.view import build_view
from openforge.types import Task

from openforge_claw.environment import ClawEnvironment, to_task
from openforge_claw.grading import grade
from openforge_claw.tasks import builtin_root, builtin_tasks, solutions_root


def _attempt(tmp_path: Path, env: ClawEnvironment, task: Task) -> tuple[Path, Path, object]:
    """An attempt's folders and view, as the rollout supervisor lays them out."""
    agent, work = tmp_path / "agent", tmp_path / "work"
    for folder in (agent / "home", agent / "tmp", agent / "workspace", work):
        folder.mkdir(parents=True)
    return agent, work, build_view(agent, workspace=agent / "workspace",
                                   data=env.data_paths(task), hidden=env.hidden_paths(task))


def _env(agent: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(agent / "home")}


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_command_succeeds_runs_the_agents_script_in_the_attempts_sandbox(
        tmp_path: Path, mode: str) -> None:
    task = next(t for t in builtin_tasks() if t.id == "shell-executable")
    agent, work, view = _attempt(tmp_path, ClawEnvironment(), to_task(task))
    workspace = agent / "workspace"
    outside = tmp_path / "outside"  # the host's, never in the attempt's view
    outside.mkdir()
    run_sh = workspace / "run.sh"
    scores = {}
    for kind, says in (("right", "ok"), ("wrong", "not ok")):
        run_sh.write_text(f"#!/bin/sh\necho escaped > {outside}/{kind}.txt\n"
                          f"readlink /proc/self/ns/pid > pid-ns.txt\necho {says}\n")
        run_sh.chmod(0o755)
        with verifier.active(mode, view, agent, work, _env(agent)):  # type: ignore[arg-type]
            scores[kind] = grade(task, workspace, {"files": {}, "services": {}})
    assert scores["right"].passed and scores["right"].details["completion"] == 1.0
    assert not scores["wrong"].passed and scores["wrong"].details["completion"] == 0.0
    assert list(outside.iterdir()) == []  # the script's writes stayed in its sandbox
    # It ran in a PID namespace of its own, not the supervisor's.
    assert (workspace / "pid-ns.txt").read_text().strip() != os.readlink("/proc/self/ns/pid")


def test_data_paths_are_the_fixtures_never_the_task_file() -> None:
    env = ClawEnvironment()
    for ct in builtin_tasks():
        paths = env.data_paths(to_task(ct))
        root = Path(ct.root or "")
        assert paths == ([root / "fixtures"] if (root / "fixtures").is_dir() else []), ct.id


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_the_sandbox_hides_the_installed_tasks_and_solutions(tmp_path: Path, mode: str) -> None:
    """What the agent could run to read its answers, from inside the attempt's sandbox: the
    package's task folders and scripted solutions are empty there, the fixtures are in the
    workspace, and the package itself (`openforge_claw.tasks` included) still imports."""
    env = ClawEnvironment()
    task = to_task(next(t for t in builtin_tasks() if t.id == "shell-executable"))
    agent, work, view = _attempt(tmp_path, env, task)
    workspace = agent / "workspace"
    env.prepare(task, workspace)
    answers = builtin_root() / "shell-executable" / "task.yaml"
    solutions = solutions_root()
    assert answers.is_file() and any(solutions.iterdir())  # on the trusted side: there
    probe = (f"cat {answers}; echo \"tasks: $(ls -A {builtin_root()})\"; "
             f"echo \"solutions: $(ls -A {solutions})\"; cat run.sh; "
             f"python3 -c 'import openforge_claw.tasks; print(\"imports\")'")
    with verifier.active(mode, view, agent, work, _env(agent)):  # type: ignore[arg-type]
        seen = verifier.run(["/bin/sh", "-c", probe], cwd=workspace, timeout_s=60)
    assert "No such file" in seen.stderr, seen.stderr
    assert "command_succeeds" not in seen.stdout
    assert seen.stdout.splitlines() == ["tasks: ", "solutions: ", "#!/bin/sh", "echo ok",
                                        "imports"], (seen.stdout, seen.stderr)
