"""Quirks of the real harness programs that docs/harnesses.md states, shown by running them
(`nox -s e2e`):

- Claude Code rewrites each `Edit` tool input with `"replace_all": false` first when it
  sends the history back, so the next request no longer extends the earlier token ids: a
  `history_rewritten` branch, unless the reply already wrote the input that way;
- Codex, given a model name it does not know, offers no `apply_patch` tool while its
  instructions ask for one; it edits through `exec_command`, and the task still passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness_plugins import CLAUDE_CODE, CODEX, installed, pip_install, with_path

from openforge.store import Store

HERE = Path(__file__).parent
TASK = {"id": "hello", "prompt": "Create hello.txt containing exactly: Hello, world!",
        "check": {"files": {"hello.txt": "Hello, world!"}}}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    missing = [p for p in (CODEX, CLAUDE_CODE) if not installed(p.name)]
    if missing:
        pip_install(target, *missing)
    return target


def run(site: Path, tmp_path: Path, harness: str, script: Path, *extra: str) -> tuple[dict, list]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASK) + "\n")
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "openforge.cli", "run", "--harness", harness, "--env", "tasks",
            "--set", f"environment_options.path={tasks}", "--engine", "scripted", "--script",
            str(script), "--runs-dir", str(runs), "--timeout", "240",
            "--set", "max_infra_retries=0", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, env=with_path(site), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = list(runs.iterdir())
    record = json.loads((run_dir / "results.jsonl").read_text())
    with Store(run_dir / "store.sqlite") as store:
        [session] = store.list_sessions()
        calls = store.list_calls(session.id)
    return record, calls


def edit_script(tmp_path: Path, edit_arguments: dict) -> Path:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump([{"replies": [
        {"tool_calls": [{"name": "Write", "arguments": {"file_path": "hello.txt",
                                                        "content": "Hello, word!"}}]},
        {"tool_calls": [{"name": "Edit", "arguments": edit_arguments}]},
        {"content": "Fixed hello.txt."}]}], sort_keys=False))
    return path


@pytest.mark.parametrize("replace_all_first", [False, True])
def test_claude_code_rewrites_edit_inputs_with_replace_all_first(
        site: Path, tmp_path: Path, replace_all_first: bool) -> None:
    edit = {"file_path": "hello.txt", "old_string": "word", "new_string": "world"}
    if replace_all_first:
        edit = {"replace_all": False, **edit}
    record, calls = run(site, tmp_path, "claude-code", edit_script(tmp_path, edit),
                        "--set", "harness_options.max_output_tokens=48")
    assert record["status"] == "ok" and record["passed"], record
    assert len(calls) == 3
    # What Claude Code sent back as the Edit it had received: replace_all first, always.
    echoed = [block["input"] for message in calls[2].request["messages"]
              if message["role"] == "assistant" and isinstance(message["content"], list)
              for block in message["content"] if block.get("name") == "Edit"]
    assert echoed and list(echoed[0]) == ["replace_all", "file_path", "old_string", "new_string"]
    reasons = [c.branch_reason for c in calls]
    if replace_all_first:
        assert reasons == [None, None, None]  # the reply already had it: one sequence
    else:
        assert reasons == [None, None, "history_rewritten"]


def test_codex_asks_for_apply_patch_without_offering_it(site: Path, tmp_path: Path) -> None:
    record, calls = run(site, tmp_path, "codex", HERE / "codex_script.yaml")
    assert record["status"] == "ok" and record["passed"], record  # done with exec_command
    first = calls[0].request
    tools = {t.get("name") for t in first.get("tools") or []}
    assert "exec_command" in tools and "apply_patch" not in tools
    assert "apply_patch" in json.dumps(first)  # ... yet its instructions ask for it
