"""Reports: JSON numbers, self-contained HTML, trajectories readable in every dialect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


def test_claw_eval_runs_get_its_per_task_estimators_beside_the_all_any_counts() -> None:
    """Claw-Eval's compute_pass_at_k (1 - C(n-c,k)/C(n,k), 0 when k > n) and
    compute_pass_hat_k ((c/n)^k) over each task's scored trials, mean over tasks; the
    leaderboard all/any counts stay as they were. Runs of other graders get none."""
    from openforge.report.behaviours import analyse, behaviours_html

    def attempt(task: str, n: int, status: str, passed: bool = False) -> dict[str, object]:
        return {"task_id": task, "attempt": n, "status": status, "passed": passed,
                "reward_details": {"benchmark": "claw-eval"}}

    attempts = [attempt("a", 0, "ok", True), attempt("a", 1, "ok"), attempt("a", 2, "ok", True),
                attempt("b", 0, "ok"), attempt("b", 1, "infra_error"), attempt("b", 2, "ok"),
                attempt("c", 0, "infra_error"), attempt("c", 1, "timeout"),
                attempt("c", 2, "plugin_error")]
    b = analyse({"summary": {"k": 3}, "attempts": attempts}, {})
    assert b["pass_hat_k"] == {"3": 0.0} and b["pass_at_k"] == {"3": 1 / 3}
    estimators = b["claw_eval_estimators"]
    # a: n=3, c=2; b: n=2, c=0 (its errored trial left out); c: nothing scored, 0.
    assert estimators["tasks"] == 3
    assert estimators["pass_at_k"] == pytest.approx({"1": 2 / 9, "2": 1 / 3, "3": 1 / 3})
    assert estimators["pass_hat_k"] == pytest.approx({"1": 2 / 9, "2": 4 / 27, "3": 8 / 81})
    assert "Claw-Eval's per-task estimators" in behaviours_html(b)
    for a in attempts:
        a["reward_details"] = {}
    assert analyse({"summary": {"k": 3}, "attempts": attempts}, {})["claw_eval_estimators"] is None
