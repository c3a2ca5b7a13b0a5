"""The built-in `tasks` environment: task sets from files, folders and `datasets` datasets,
scored by a command, a file comparison or a Python function, run through `openforge run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from openforge.builtin.tasks import TasksEnvironment, TaskSetError
from openforge.options import OptionsError
from openforge.types import Task

HERE = Path(__file__).parent

HELLO = {"id": "hello", "prompt": "Create hello.txt containing exactly: Hello, world!",
         "check": {"files": {"hello.txt": "Hello, world!"}}, "split": "train"}
SUM = {"id": "sum", "prompt": "Write the sum of the numbers in nums.txt to answer.txt.",
       "files": {"nums.txt": "1\n2\n3\n"}, "ground_truth": 6,
       "check": {"function": "task_checks:answer_in_file"}, "split": "test"}
SCRIPT = {"id": "script", "prompt": "Make run.sh exit 0.", "files": {"run.sh": "exit 3\n"},
          "check": {"command": "sh run.sh"}}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(autouse=True)
def _checks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def run_check(env: TasksEnvironment, task: Task, workspace: Path) -> tuple[float, bool]:
    verdict = env.check(task, workspace, {})
    assert verdict is not None
    return verdict.score, verdict.passed


def test_jsonl_tasks_prepare_and_check_three_ways(tmp_path: Path) -> None:
    env = TasksEnvironment(path=write_jsonl(tmp_path / "set.jsonl", [HELLO, SUM, SCRIPT]))
    tasks = {t.id: t for t in env.tasks()}
    assert list(tasks) == ["hello", "sum", "script"]
    assert tasks["sum"].data["ground_truth"] == 6 and tasks["sum"].environment == "tasks"
    for task in tasks.values():
        ws = tmp_path / task.id
        ws.mkdir()
        env.prepare(task, ws)
        assert run_check(env, task, ws) == (0.0, False)  # nothing done yet
    assert (tmp_path / "sum" / "nums.txt").read_text() == "1\n2\n3\n"
    (tmp_path / "hello" / "hello.txt").write_text("Hello, world!\n")
    (tmp_path / "sum" / "answer.txt").write_text("6")
    (tmp_path / "script" / "run.sh").write_text("exit 0\n")
    for task in tasks.values():
        assert run_check(env, task, tmp_path / task.id) == (1.0, True), task.id


def test_splits_select_tasks(tmp_path: Path) -> None:
    env = TasksEnvironment(path=write_jsonl(tmp_path / "set.jsonl", [HELLO, SUM, SCRIPT]))
    assert [t.id for t in env.tasks("train")] == ["hello"]
    assert [t.id for t in env.tasks("test")] == ["sum"]
    assert [t.id for t in env.tasks()] == ["hello", "sum", "script"]


def test_yaml_json_and_task_folders(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "a.yaml").write_text(yaml.safe_dump({"tasks": [HELLO]}))
    (folder / "b.json").write_text(json.dumps([{"prompt": "Say yes.",
                                                "check": {"function": "task_checks:says_yes"}}]))
    task_dir = folder / "fix-it"
    (task_dir / "workspace" / "src").mkdir(parents=True)
    (task_dir / "workspace" / "src" / "data.bin").write_bytes(b"\x00\x01binary")
    (task_dir / "task.yaml").write_text(yaml.safe_dump(
        {"prompt": "Fix src.", "check": {"command": "test -f src/fixed"}}))
    env = TasksEnvironment(path=folder)
    tasks = {t.id: t for t in env.tasks()}
    assert list(tasks) == ["hello", "b-1", "fix-it"]  # a file's stem numbers its unnamed tasks
    ws = tmp_path / "ws"
    ws.mkdir()
    env.prepare(tasks["fix-it"], ws)
    assert (ws / "src" / "data.bin").read_bytes() == b"\x00\x01binary"  # copied as it is
    verdict = env.check(tasks["b-1"], ws, {"final_answer": "Yes, done."})
    assert verdict is not None and verdict.passed


def test_a_default_check_and_partial_scores(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "set.jsonl", [{"id": "x", "prompt": "anything"}])
    env = TasksEnvironment(path=path, check={"function": "task_checks:always_half"})
    [task] = env.tasks()
    assert run_check(env, task, tmp_path) == (0.5, False)
    env = TasksEnvironment(path=path)
    assert env.check(task, tmp_path, {}) is None  # no check: the checker reward says so


def test_bad_task_sets_are_one_line_errors(tmp_path: Path) -> None:
    cases = {
        "noprompt.jsonl": ('{"id": "a"}\n', r"noprompt\.jsonl: line 1: prompt: required"),
        "typo.jsonl": ('{"prompt": "p", "chek": {}}\n',
                       r"line 1: chek: not a known option \(valid: check, data, files"),
        "twochecks.jsonl": ('{"prompt": "p", "check": {"command": "true", "files": {}}}\n',
                            r"exactly one of command, files, function"),
        "dup.jsonl": ('{"id": "a", "prompt": "p"}\n{"id": "a", "prompt": "q"}\n',
                      r"task id 'a' is used twice .*line 1 and .*line 2"),
        "broken.yaml": ("- prompt: [unclosed\n", r"broken\.yaml: not valid YAML"),
        "nojson.jsonl": ("{not json}\n", r"line 1: not valid JSON"),
    }
    for name, (text, pattern) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(TaskSetError, match=pattern):
            list(TasksEnvironment(path=tmp_path / name).tasks())
    with pytest.raises(TaskSetError, match="no such task file or folder"):
        TasksEnvironment(path=tmp_path / "missing.jsonl").tasks()
    with pytest.raises(OptionsError, match="exactly one of path .* and dataset"):
        TasksEnvironment()
    (tmp_path / "bad-fn.jsonl").write_text('{"prompt": "p", "check": {"function": "task_checks:returns_text"}}\n')
    [task] = TasksEnvironment(path=tmp_path / "bad-fn.jsonl").tasks()
    with pytest.raises(TypeError, match="returned str"):
        TasksEnvironment(path=tmp_path / "bad-fn.jsonl").check(task, tmp_path, {})


def test_files_outside_the_workspace_are_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "set.jsonl", [{"id": "x", "prompt": "p",
                                                 "files": {"../escape.txt": "x"}}])
    env = TasksEnvironment(path=path)
    [task] = env.tasks()
    (tmp_path / "ws").mkdir()
    with pytest.raises(TaskSetError, match="outside the workspace"):
        env.prepare(task, tmp_path / "ws")
    assert not (tmp_path / "escape.txt").exists()


def save_dataset(folder: Path) -> Path:
    """A `datasets` DatasetDict with its own column names, written by save_to_disk."""
    rows = {"train": [{"uid": "hello", "question": HELLO["prompt"], "answer": "Hello, world!"}],
            "test": [{"uid": "sum", "question": SUM["prompt"], "answer": "6"}]}
    datasets.DatasetDict({name: datasets.Dataset.from_list(r) for name, r in rows.items()}
                         ).save_to_disk(str(folder))
    return folder


def test_a_saved_dataset_with_its_own_column_names(tmp_path: Path) -> None:
    folder = save_dataset(tmp_path / "ds")
    env = TasksEnvironment(dataset=str(folder), columns={"id": "uid", "prompt": "question",
                                                         "ground_truth": "answer"},
                           check={"function": "task_checks:answer_in_file"})
    tasks = {t.id: t for t in env.tasks()}
    assert {t.id: t.split for t in tasks.values()} == {"hello": "train", "sum": "test"}
    assert tasks["sum"].prompt == SUM["prompt"] and tasks["sum"].data["ground_truth"] == "6"
    assert [t.id for t in env.tasks("test")] == ["sum"]
    (tmp_path / "answer.txt").write_text("6\n")
    assert run_check(env, tasks["sum"], tmp_path) == (1.0, True)


def test_a_folder_of_data_files_loads_through_datasets(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    # datasets names splits after the files: train.jsonl -> train, test.jsonl -> test
    # Nested values as JSON text, or as structs (whose keys other rows used come back None).
    write_jsonl(folder / "train.jsonl", [
        {"id": "hello", "prompt": HELLO["prompt"], "check": json.dumps(HELLO["check"])},
        {"id": "two", "prompt": "p", "files": {"a.txt": "a"}, "check": {"command": "true"}},
        {"id": "three", "prompt": "p", "files": {"b.txt": "b"}}])
    write_jsonl(folder / "test.jsonl", [{"id": "sum", "prompt": SUM["prompt"],
                                         "check": json.dumps(SUM["check"])}])
    env = TasksEnvironment(dataset=str(folder))
    tasks = {t.id: t for t in env.tasks()}
    assert {t.id: t.split for t in tasks.values()} == {"hello": "train", "two": "train",
                                                      "three": "train", "sum": "test"}
    assert tasks["hello"].data["check"] == HELLO["check"]
    assert tasks["two"].data["files"] == {"a.txt": "a"}
    assert tasks["two"].data["check"] == {"command": "true"}
    assert tasks["three"].data["files"] == {"b.txt": "b"} and "check" not in tasks["three"].data
    with pytest.raises(TaskSetError, match="dataset .* cannot be loaded"):
        list(TasksEnvironment(dataset=str(tmp_path / "nothing-here")).tasks())


# -- through `openforge run`, with the mini harness and the scripted engine -----------------

MINI_SCRIPT = [
    {"match": "hello\\.txt containing exactly",
     "replies": [{"tool_calls": [{"name": "write_file", "arguments": {
         "path": "hello.txt", "content": "Hello, world!\n"}}]}, {"content": "Done."}]},
    {"replies": [{"content": "I cannot do that."}]},  # every other task: fails
]


def openforge_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(MINI_SCRIPT))
    runs = tmp_path / "runs"
    env = {**__import__("os").environ, "PYTHONPATH": str(HERE)}
    proc = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run", "--env", "tasks", "--engine", "scripted",
         "--script", str(script), "--runs-dir", str(runs), "--concurrency", "2", *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    run_dirs = [p for p in runs.iterdir()] if runs.exists() else []
    return proc, (run_dirs[0] if run_dirs else runs)


def results(run_dir: Path) -> dict[str, dict]:
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    return {r["task_id"]: r for r in map(json.loads, lines)}


def test_a_jsonl_task_file_runs_with_mini(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "set.jsonl", [HELLO, SUM])
    proc, run_dir = openforge_run(tmp_path, "--set", f"environment_options.path={tasks}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = results(run_dir)
    assert got["hello"]["passed"] and got["hello"]["reward"] == 1.0
    assert not got["sum"]["passed"] and got["sum"]["reward"] == 0.0
    assert got["sum"]["status"] == "ok"  # scored, not an infrastructure failure
    assert "pass@k" in proc.stdout


def test_a_datasets_folder_runs_with_mini_and_a_split(tmp_path: Path) -> None:
    folder = save_dataset(tmp_path / "ds")
    proc, run_dir = openforge_run(
        tmp_path, "--split", "train", "--set", f"environment_options.dataset={folder}",
        "--set", "environment_options.columns={id: uid, prompt: question}",
        "--set", "environment_options.check={files: {hello.txt: 'Hello, world!'}}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = results(run_dir)
    assert list(got) == ["hello"] and got["hello"]["passed"]  # --split train: one task
