"""WebVoyager / Online-Mind2Web loaders on fixture files, a WebVoyager rollout's screen on a
local page, and the webjudge reward through litellm against a local stand-in of the OpenAI chat
API (the judge's calls land in its own log, not in any gateway)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from openforge.errors import OpenforgeError
from openforge.types import Task
from openforge_gui.computer import ComputerClient
from openforge_gui.judge import JudgeError, WebJudgeReward
from openforge_gui.webtasks import (
    TaskFileError,
    WebVoyagerEnvironment,
    load_online_mind2web,
    load_webvoyager,
)

FIXTURES = Path(__file__).parent / "fixtures"
SHOP = b"<html><head><title>Shop</title></head><body><p>Blue mug: $12</p></body></html>"


class _Site(BaseHTTPRequestHandler):
    """The local web: a shop page (start URL) and a stand-in of the OpenAI chat API."""

    verdict = "success"
    requests: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(SHOP)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Site.requests.append(body)
        content = body["messages"][-1]["content"]
        text = content if isinstance(content, str) else " ".join(
            p.get("text", "") for p in content if p.get("type") == "text")
        if "List the key points" in text:
            reply = "1. the price of the blue mug"
        elif "Score from 1 to 5" in text:
            reply = "It shows the mug and its price. Score: 4"
        else:
            # Reasoning that names the other status first: the last one is the verdict.
            other = "failure" if _Site.verdict == "success" else "success"
            reply = f"Not 'Status: {other}': the answer matches the page.\nStatus: {_Site.verdict}"
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0,
                           "model": body.get("model"), "choices": [{
                               "index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": reply}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                     "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_loaders_read_the_published_formats(tmp_path: Path) -> None:
    voyager = load_webvoyager(FIXTURES / "webvoyager.jsonl")
    assert [t.id for t in voyager] == ["Local--0", "Local--1"]
    assert voyager[0].data["start_url"] == "http://127.0.0.1:1/"
    assert "Find the price of the blue mug." in voyager[0].prompt
    m2w = load_online_mind2web(FIXTURES / "online_mind2web.json")
    assert m2w[0].id == "m2w-local-1" and m2w[0].data["reference_length"] == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "web": "http://a"}\n')
    with pytest.raises(TaskFileError, match=r"bad.jsonl: task 1: ques: Field required"):
        load_webvoyager(bad)
    bad.write_text('[{"task_id": "x", "confirmed_task": "do it"}]')
    with pytest.raises(TaskFileError, match=r"task 1: website: Field required"):
        load_online_mind2web(bad)
    with pytest.raises(OpenforgeError, match="environment_options.path"):
        WebVoyagerEnvironment()


def _rollout(site: str, tmp_path: Path, answer: str) -> tuple[Any, Task, dict[str, Any]]:
    records = tmp_path / "tasks.jsonl"
    records.write_text(json.dumps({"web_name": "Shop", "id": "t1", "web": f"{site}/shop",
                                   "ques": "Find the price of the blue mug."}) + "\n")
    env = WebVoyagerEnvironment(path=str(records), width=400, height=300)
    task = next(iter(env.tasks()))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env.prepare(task, workspace)
    try:
        client = ComputerClient.from_workspace(workspace)
        assert client.observation().title == "Shop"
        client.act({"type": "scroll", "x": 10, "y": 10, "dy": 100})
        client.act({"type": "answer", "text": answer})
        state = env.final_state(task, workspace)
    finally:
        env.close()
    return env, task, state


def test_webjudge_success_and_failure_through_litellm(site: str, tmp_path: Path) -> None:
    env, task, state = _rollout(site, tmp_path, "$12")
    assert state["final_title"] == "Shop" and state["episode"]["answer"] == "$12"
    log = tmp_path / "judge.jsonl"
    judge = WebJudgeReward(model="openai/judge", api_base=f"{site}/v1", api_key="k", log=str(log))
    _Site.requests.clear()
    _Site.verdict = "success"
    verdict = judge.score(task, env, tmp_path / "ws", state)
    assert verdict.passed and verdict.score == 1.0
    assert verdict.details["key_screens"] == [1, 2]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["stage"] for r in records] == ["key_points", "screenshot", "screenshot", "verdict"]
    assert verdict.details["judge_calls"] == len(_Site.requests) == 4
    # The log names each screenshot by the sha256 of the bytes sent, never inline.
    screens = [h["screenshot"] for h in state["episode"]["history"]]
    logged = [p["sha256"] for p in records[-1]["messages"][0]["content"] if p["type"] == "image"]
    assert logged == [hashlib.sha256(Path(s).read_bytes()).hexdigest() for s in screens]
    assert "base64" not in log.read_text()
    last = _Site.requests[-1]["messages"][-1]["content"]
    assert sum(1 for p in last if p["type"] == "image_url") == 2
    assert "Final answer: $12" in last[0]["text"] and "scroll(" in last[0]["text"]
    _Site.verdict = "failure"
    assert judge.score(task, env, tmp_path / "ws", state).score == 0.0


def test_unreachable_judge_is_an_error_not_a_zero(tmp_path: Path, site: str) -> None:
    env, task, state = _rollout(site, tmp_path, "?")
    judge = WebJudgeReward(model="openai/judge", api_base="http://127.0.0.1:9/v1", api_key="k",
                           log=str(tmp_path / "j.jsonl"))
    with pytest.raises(JudgeError, match="failed at key_points"):
        judge.score(task, env, tmp_path / "ws", state)
    with pytest.raises(OpenforgeError, match="reward_options.model"):
        WebJudgeReward()
    with pytest.raises(OpenforgeError, match=r"option score_treshold: not a known option \(valid: .*score_threshold"):
        WebJudgeReward(model="openai/judge", score_treshold=3)
