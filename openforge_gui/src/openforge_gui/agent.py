"""The `gui-agent` program: screenshot -> model -> action -> execute, until the episode ends.

    python -m openforge_gui.agent --task-file T --workspace W --transcript J
        [--base-url URL] [--model M] [--max-steps 15] [--history 3] [--max-tokens 128]
        [--temperature X] [--tools]

The computer API is found in `W/.openforge/computer.json`; the key for the model endpoint
comes from `OPENAI_API_KEY` (the session token), the endpoint from `--base-url` or
`OPENAI_BASE_URL`. Each step is one chat request (`openforge.builtin.chat_endpoint`):

    system   the action space
    user     the task                      \\  earlier steps, text only: what the model
    assistant its reply of step 1           |  answered and what became of it
    user     "step 1: click(...) -> ok"    /
    ...
    user     (last) + the last K screenshots as `image_url` data URLs (K = --history)

Screenshots ride only on the last user message. The previous step's request therefore is
never a token prefix of the next one, and the trajectory builder makes exactly one
training sample per step (samples == steps), each seeing the K most recent screens.

The reply is parsed with `openforge_gui.actions.parse_action` (text, or tool calls with
`--tools`); a reply that is no action is answered with the parse error and costs a step.
The last stdout line is the final JSON `{"status", "steps", "answer", "ended_by"}`; the
transcript (every step: screenshot hashes sent, model output, action, result) goes to
`--transcript`.

Exit codes: 0 the episode ended (answer, fail, the task said so, the screen's step
limit); 1 the agent's own step limit came first, or the endpoint refused a request;
2 the model endpoint or the computer API could not be reached (infrastructure).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from typing import Any

from openforge.builtin.chat_endpoint import (
    EndpointDown,
    EndpointError,
    function_calls,
    reply_message,
)
from openforge.builtin.mini_agent import agent_arguments, endpoint
from openforge_gui.actions import ACTION_TOOLS, ActionParseError, format_action, parse_action
from openforge_gui.computer import ComputerAPIError, ComputerClient, Observation

SYSTEM_PROMPT = """You operate a computer through screenshots. Each turn, look at the latest \
screenshot and reply with exactly one action, on the last line, as a function call:
click(x, y)                 click at pixel (x, y) of the screenshot
click_element(text="...")   click the element showing this text (or selector="css")
type("text")                type into the focused element
key("Enter")                press a key or chord, e.g. key("Control+a")
scroll(x, y, dx, dy)        scroll by (dx, dy) pixels at (x, y)
goto("https://...")         open a URL
wait(1)                     wait a second
answer("...")               finish, giving the answer (or "done")
fail("reason")              give up"""

EXIT_DONE, EXIT_AGENT_ERROR, EXIT_DOWN = 0, 1, 2


def data_url(png_b64: str) -> str:
    return f"data:image/png;base64,{png_b64}"


def sha256_b64(png_b64: str) -> str:
    """The sha256 of a screenshot's exact bytes (what the gateway stores it under)."""
    return hashlib.sha256(base64.b64decode(png_b64)).hexdigest()


def build_messages(history: list[dict[str, Any]], screens: list[Observation],
                   window: int) -> list[dict[str, Any]]:
    """The request's messages: the text-only history, the last K screenshots on the last
    user message (oldest first)."""
    messages = [dict(m) for m in history]
    last = messages[-1]
    parts: list[dict[str, Any]] = [{"type": "text", "text": last["content"]}]
    recent = screens[-window:]
    for i, obs in enumerate(recent):
        label = "Current screen" if i == len(recent) - 1 else f"Screen at step {obs.step}"
        parts.append({"type": "text", "text": f"{label} ({obs.width}x{obs.height}):"})
        parts.append({"type": "image_url", "image_url": {"url": data_url(obs.screenshot)}})
    last["content"] = parts
    return messages


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = agent_arguments("gui-agent", max_steps=15, max_tokens=128)
    p.add_argument("--history", type=int, default=3, help="screenshots per request (K)")
    p.add_argument("--tools", action="store_true", help="offer the actions as tools")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    client = endpoint(args.base_url)
    task = args.task_file.read_text()
    steps: list[dict[str, Any]] = []
    transcript: dict[str, Any] = {"task": task, "history_window": args.history, "steps": steps,
                                  "status": "running"}
    final: dict[str, Any] = {"status": "running", "steps": 0, "answer": None, "ended_by": None}

    def finish(status: str, code: int, error: str | None = None) -> int:
        final["status"] = status
        transcript.update(status=status, error=error, final=final)
        args.transcript.write_text(json.dumps(transcript, indent=1))
        if error:
            print(f"gui-agent: {error}", file=sys.stderr)
        print(json.dumps(final))
        return code

    try:
        computer = ComputerClient.from_workspace(args.workspace)
    except (OSError, ValueError) as exc:
        return finish("computer_error", EXIT_DOWN, f"no computer API in the workspace: {exc}")
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                     {"role": "user", "content": task}]
    screens: list[Observation] = []
    extra: dict[str, Any] = {"tools": ACTION_TOOLS} if args.tools else {}
    if args.temperature is not None:
        extra["temperature"] = args.temperature
    for step in range(1, args.max_steps + 1):
        try:
            obs = computer.observation()
        except ComputerAPIError as exc:
            return finish("computer_error", EXIT_DOWN, str(exc))
        if obs.done:
            final.update(answer=obs.answer)
            return finish("done", EXIT_DONE)
        screens.append(obs)
        messages = build_messages(history, screens, max(args.history, 1))
        record: dict[str, Any] = {
            "step": step, "screenshot_sha256": sha256_b64(obs.screenshot), "url": obs.url,
            "request_images": [sha256_b64(o.screenshot) for o in screens[-max(args.history, 1):]]}
        steps.append(record)
        try:
            msg = reply_message(client.create(model=args.model, messages=messages,
                                              max_tokens=args.max_tokens, **extra))
        except EndpointDown as exc:
            return finish("endpoint_error", EXIT_DOWN, f"the model endpoint failed: {exc}")
        except EndpointError as exc:
            return finish("error", EXIT_AGENT_ERROR, f"the model endpoint returned an error: {exc}")
        output = msg["content"]
        calls = function_calls(msg)
        record["model_output"] = output
        entry: dict[str, Any] = {"role": "assistant", "content": output}
        if calls:
            record["tool_calls"] = [dict(call["function"]) for call in calls]
            entry["tool_calls"] = calls
        history.append(entry)
        try:
            action = parse_action(record["tool_calls"][0] if calls else output)
        except ActionParseError as exc:
            record["parse_error"] = str(exc)
            feedback = f"Step {step}: your reply was not an action ({exc}). Reply with one action."
        else:
            record["action"] = action.model_dump()
            record["action_text"] = format_action(action)
            try:
                result = computer.act(action)
            except ComputerAPIError as exc:
                return finish("computer_error", EXIT_DOWN, str(exc))
            record["result"] = result.model_dump()
            outcome = "ok" if result.ok else f"error: {result.error}"
            feedback = f"Step {step}: {record['action_text']} -> {outcome}"
            final["steps"] = result.step
            if action.type == "answer":
                final["answer"] = action.text
            if result.done:
                final["ended_by"] = action.type if action.type in ("answer", "fail") else "screen"
        for call in calls:  # every tool call is answered, the first was the one performed
            history.append({"role": "tool", "tool_call_id": call.id, "content": feedback})
        history.append({"role": "user", "content": feedback if not calls else "Next action?"})
        if final["ended_by"]:
            return finish("done", EXIT_DONE)
    return finish("step_limit", EXIT_AGENT_ERROR,
                  f"step limit of {args.max_steps} reached before the episode ended")


if __name__ == "__main__":
    sys.exit(main())
