"""Reports: JSON numbers, self-contained HTML, trajectories readable in every dialect."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from openforge.report import request_messages, response_parts, write_report
from openforge.runner import AttemptRecord
from openforge.store import Store
from openforge.types import Call, Session


def test_chat_call_turns() -> None:
    call = Call(id="c", session_id="s", dialect="chat", request={"messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "do it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "a.txt"}]},
        response={"choices": [{"message": {"content": "done", "tool_calls": None}}]})
    msgs = request_messages(call)
    assert [m[0] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[2][2] == ['shell({"command": "ls"})']
    assert response_parts(call) == ("", "done", [])


def test_anthropic_and_responses_calls() -> None:
    anthropic = Call(id="a", session_id="s", dialect="messages", request={
        "system": "sys", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "out"}]}]},
        response={"content": [{"type": "thinking", "thinking": "hmm"},
                              {"type": "tool_use", "id": "t", "name": "bash", "input": {"cmd": "ls"}}]})
    assert [m[0] for m in request_messages(anthropic)] == ["system", "user", "tool"]
    reasoning, text, calls = response_parts(anthropic)
    assert reasoning == "hmm" and calls == ['bash({"cmd": "ls"})']
    responses = Call(id="r", session_id="s", dialect="responses", request={
        "instructions": "sys", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "task"}]},
            {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "x"},
            {"type": "function_call_output", "call_id": "x", "output": "ok"}]},
        response={"output": [{"type": "message", "content": [{"type": "output_text", "text": "fin"}]}]})
    assert [m[0] for m in request_messages(responses)] == ["system", "user", "assistant", "tool"]
    assert response_parts(responses)[1] == "fin"


def test_write_report_from_a_run_dir(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"run_id": "r1", "k": 2, "harness": "mini"}))
    store = Store(tmp_path / "store.sqlite")
    store.create_session(Session(id="s1", token="t1", run_id="r1", task_id="a"))
    store.add_call(Call(id="c1", session_id="s1", request={"messages": [
        {"role": "user", "content": "<b>make</b> a file"}]},
        response={"choices": [{"message": {"content": "ok"}}]}, prompt_ids=[1, 2], completion_ids=[3]))
    store.close()
    records = [
        AttemptRecord(task_id="a", attempt=0, rollout_id="x", session_id="s1", status="ok", reward=1.0, passed=True),
        AttemptRecord(task_id="a", attempt=1, rollout_id="y", session_id="s2", status="ok", reward=0.0),
        AttemptRecord(task_id="b", attempt=0, rollout_id="z", session_id="s3", status="timeout",
                      error="killed", tries=3),
        AttemptRecord(task_id="b", attempt=1, rollout_id="w", session_id="s4", status="ok", reward=0.5),
    ]
    (tmp_path / "results.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in records) + "{torn")
    json_path, html_path = write_report(tmp_path)
    data = json.loads(json_path.read_text())
    assert data["summary"]["infra_failures"] == 1 and data["summary"]["scored"] == 3
    # a: 1 of 2 passed; b: 0 of 1 scored (its timeout is excluded), so only a has pass@2
    assert data["pass_at_k"] == {"1": 0.25, "2": 1.0}
    assert len(data["attempts"]) == 4 and data["attempts"][2]["error"] == "killed"
    assert data["trajectories"]["calls_per_sample"] == 1.0  # the merge rate
    html = html_path.read_text()
    assert "1.00 calls per sample" in html
    assert "&lt;b&gt;make&lt;/b&gt;" in html and "<b>make</b>" not in html  # escaped
    assert "<svg" in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_a_violation_is_a_scored_failure_in_the_behaviours_section() -> None:
    """A violation is scored (0, labelled), so the leaderboard count does not call it
    unscored; infrastructure failures and plugin errors are, and are their own categories."""
    from openforge.report.behaviours import analyse

    attempts = [{"task_id": "t", "attempt": n, "status": status, "passed": False}
                for n, status in enumerate(["violation", "timeout", "plugin_error", "ok"])]
    b = analyse({"summary": {"k": 4}, "attempts": attempts}, {})
    assert b["unscored_trials"] == 2
    assert b["failure_categories"] == {"plugin_error": 1, "timeout": 1,
                                       "wrong_final_state": 2}
