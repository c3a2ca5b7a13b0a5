"""The run folder: config.yaml paths that survive a change of folder (resume), the agent's
stdout/stderr kept per attempt and linked from report.html, the reward named in the report,
and `openforge runs` listing run folders with the report's own figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from openforge.report import write_report
from openforge.runner import AttemptRecord

HERE = Path(__file__).parent
HELLO_SCRIPT = """
- match: "hello\\\\.txt containing exactly"
  replies:
    - tool_calls: [{name: write_file, arguments: {path: hello.txt, content: "Hello, world!"}}]
    - content: "Created hello.txt."
- replies: [{content: "No."}]
"""


def openforge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    return subprocess.run([sys.executable, "-m", "openforge.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)


def start_run(project: Path, *args: str) -> Path:
    """`openforge run` from `project` with a relative --script and --runs-dir."""
    (project / "script.yaml").write_text(HELLO_SCRIPT)
    before = set((project / "runs").iterdir()) if (project / "runs").exists() else set()
    out = openforge("run", "--engine", "scripted", "--script", "script.yaml", "--runs-dir",
                    "runs", "--task", "hello-file", "--task", "count-lines", *args, cwd=project)
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = set((project / "runs").iterdir()) - before
    return run_dir


def test_resume_from_another_folder_finds_the_run_s_files(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    run_dir = start_run(project)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["engine"]["options"]["script"] == str(project / "script.yaml")
    assert config["runs_dir"] == str(project / "runs")
    # Nothing left to do, from another folder: it finishes (it used to fail to find the script).
    out = openforge("run", "--resume", str(run_dir), cwd=elsewhere)
    assert out.returncode == 0, out.stderr[-2000:]
    # A hand-written relative path is read relative to the run folder, and a missing
    # attempt is run again from there.
    config["engine"]["options"]["script"] = "../../script.yaml"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["task_id"] != "hello-file"]
    (run_dir / "results.jsonl").write_text("".join(line + "\n" for line in kept))
    out = openforge("run", "--resume", str(run_dir), cwd=elsewhere)
    assert out.returncode == 0, out.stderr[-2000:]
    done = {json.loads(line)["task_id"]: json.loads(line)
            for line in (run_dir / "results.jsonl").read_text().splitlines()}
    assert done["hello-file"]["passed"] and not done["count-lines"]["passed"]


def test_agent_output_is_kept_per_attempt_and_linked(tmp_path: Path) -> None:
    run_dir = start_run(tmp_path)
    records = {json.loads(line)["task_id"]: json.loads(line)
               for line in (run_dir / "results.jsonl").read_text().splitlines()}
    html = (run_dir / "report.html").read_text()
    for task_id, answer in (("hello-file", "Created hello.txt."), ("count-lines", "No.")):
        logs = records[task_id]["logs"]
        assert set(logs) == {"stdout", "stderr"}
        # mini prints its final answer as the last line of stdout: passed or not, it is kept.
        assert (run_dir / logs["stdout"]).read_text().strip().splitlines()[-1] == answer
        assert f"<a href='{logs['stdout']}'>stdout</a>" in html
        assert f"<a href='{logs['stderr']}'>stderr</a>" in html


def test_reward_details_are_labelled_with_the_run_s_reward(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"run_id": "r", "k": 1,
                                                          "reward": "claw-grader"}))
    record = AttemptRecord(task_id="t", attempt=0, rollout_id="x", session_id="s", status="ok",
                           reward=0.8, reward_details={"completion": 0.8})
    (tmp_path / "results.jsonl").write_text(record.model_dump_json() + "\n")
    _, html_path = write_report(tmp_path)
    html = html_path.read_text()
    assert "reward claw-grader: details" in html and "<b>checker</b>" not in html


def test_runs_lists_each_run_with_the_report_s_figures(tmp_path: Path) -> None:
    first = start_run(tmp_path)
    second = start_run(tmp_path, "-k", "2")
    out = openforge("runs", "runs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:] if line.strip()}
    assert set(rows) == {first.name, second.name}
    for run_dir in (first, second):
        report = json.loads((run_dir / "report.json").read_text())
        row = rows[run_dir.name].split()
        s = report["summary"]
        assert row[3:7] == ["mini", "demo", "checker", "scripted"]  # after date and time
        assert f"{s['attempts']} ({s['tasks']} tasks x k={s['k']})" in rows[run_dir.name]
        assert row[-7:] == [str(s["scored"]), str(s["passed"]), f"{report['pass_at_k']['1']:.3f}",
                            str(s["plugin_errors"]), str(s["infra_failures"]),
                            f"{s['mean_reward']:.3f}", "yes"]
    assert "0.500" in rows[second.name]  # hello-file passes, count-lines does not
    empty = openforge("runs", "nothing", cwd=tmp_path)
    assert empty.returncode == 0 and "no runs in nothing" in empty.stdout
