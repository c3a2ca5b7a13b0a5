"""The `tasks` environment with the real Codex CLI (`nox -s e2e`): a JSONL task file and a
`datasets` folder, each run through `openforge run --harness codex` on the scripted engine.

Codex's own shell tool (`exec_command`) writes hello.txt (tests/e2e/codex_script.yaml); the
task's file check passes; a second task that the script does not solve fails, scored, not
an infrastructure failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
from harness_plugins import with_path

HERE = Path(__file__).parent
HELLO = {"id": "hello", "prompt": "Create hello.txt containing exactly: Hello, world!",
         "check": {"files": {"hello.txt": "Hello, world!"}}}
OTHER = {"id": "other", "prompt": "Create bye.txt containing exactly: Bye.",
         "check": {"command": "grep -qx Bye. bye.txt"}}


def run_codex(codex_site: Path, tmp_path: Path, *options: str) -> dict[str, dict]:
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "openforge.cli", "run", "--harness", "codex", "--env", "tasks",
            "--engine", "scripted", "--script", str(HERE / "codex_script.yaml"),
            "--runs-dir", str(runs), "--timeout", "240", "--set", "max_infra_retries=0",
            "--concurrency", "1", *options]
    proc = subprocess.run(argv, capture_output=True, text=True, env=with_path(codex_site), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = list(runs.iterdir())
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    return {r["task_id"]: r for r in map(json.loads, lines)}


def test_a_jsonl_task_file_runs_with_codex(codex_site: Path, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (HELLO, OTHER)))
    got = run_codex(codex_site, tmp_path, "--set", f"environment_options.path={path}")
    assert got["hello"]["status"] == "ok" and got["hello"]["passed"], got["hello"]
    assert got["other"]["status"] == "ok" and not got["other"]["passed"], got["other"]


def test_a_datasets_folder_runs_with_codex(codex_site: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    rows = [{"uid": t["id"], "question": t["prompt"], "check": json.dumps(t["check"])}
            for t in (HELLO, OTHER)]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    got = run_codex(codex_site, tmp_path, "--split", "test",
                    "--set", f"environment_options.dataset={folder}",
                    "--set", "environment_options.columns={id: uid, prompt: question}")
    assert got["hello"]["passed"] and not got["other"]["passed"]
