"""The `mini` agent program: a small, honest ReAct loop over OpenAI chat completions
(`chat_endpoint`: the standard library, not the SDK, whose import cost each rollout 1.2 s
of CPU).

    python -m openforge.builtin.mini_agent --task-file T --workspace W --transcript J
        [--model M] [--max-steps 6] [--max-tokens 256] [--temperature X]

The key comes from `OPENAI_API_KEY` (the session token) and the endpoint from
`OPENAI_BASE_URL` (the session URL, which holds the token too): both in the environment,
never on the command line, where every process can read them (`ps`). Tools: `shell`
{command} runs in the workspace (timeout, output truncated) and `write_file` {path,
content} writes inside the workspace only. A reply
without tool calls ends the loop: its text is the final answer, printed as the last line
of stdout. The transcript (every message) is written to `--transcript` as JSON.

Exit codes: 0 done; 1 agent error (step limit, an error the model endpoint returned);
2 the model endpoint could not be reached or failed (an infrastructure failure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from openforge.builtin.chat_endpoint import (
    ChatEndpoint,
    EndpointDown,
    EndpointError,
    function_calls,
    reply_message,
)

SYSTEM_PROMPT = (
    "You are a careful agent working in a Linux workspace directory. Use the tools to "
    "complete the task: `shell` runs a shell command in the workspace, `write_file` writes a "
    "file in the workspace. When the task is done, reply with a short final answer and no "
    "tool call."
)
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "shell",
        "description": "Run a shell command in the workspace and return its exit code and output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line, run with /bin/sh."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "write_file",
        "description": "Write text to a file in the workspace (parent directories are created).",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the workspace."},
            "content": {"type": "string", "description": "The full new content of the file."}},
            "required": ["path", "content"]}}},
]
OUTPUT_LIMIT = 4000
SHELL_TIMEOUT_S = 30.0

EXIT_DONE, EXIT_AGENT_ERROR, EXIT_ENDPOINT_DOWN = 0, 1, 2


def _truncate(text: str, limit: int = OUTPUT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n...[{len(text) - limit} characters cut]...\n" + text[-limit // 2:]


def tool_shell(workspace: Path, args: dict[str, Any]) -> str:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return "error: `command` must be a non-empty string"
    try:
        proc = subprocess.run(["/bin/sh", "-c", command], cwd=workspace, capture_output=True,
                              text=True, timeout=SHELL_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              errors="replace")
    except subprocess.TimeoutExpired:
        return f"error: the command timed out after {SHELL_TIMEOUT_S:g}s"
    output = proc.stdout + (("\n" if proc.stdout else "") + proc.stderr if proc.stderr else "")
    return f"exit code {proc.returncode}\n{_truncate(output)}"


def tool_write_file(workspace: Path, args: dict[str, Any]) -> str:
    path, content = args.get("path"), args.get("content")
    if not isinstance(path, str) or not path or not isinstance(content, str):
        return "error: `path` and `content` must be strings"
    root = workspace.resolve()
    target = (root / path).resolve()
    # Refuse anything that resolves outside the workspace (`..`, absolute paths, symlinks).
    if target != root and root not in target.parents:
        return f"error: {path} is outside the workspace"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    except OSError as exc:
        return f"error: {exc}"
    return f"wrote {len(content)} characters to {path}"


TOOL_FUNCS = {"shell": tool_shell, "write_file": tool_write_file}


def run_tool(workspace: Path, name: str, raw_args: str) -> str:
    func = TOOL_FUNCS.get(name)
    if func is None:
        return f"error: unknown tool {name!r}; tools are: {', '.join(TOOL_FUNCS)}"
    try:
        args = json.loads(raw_args or "{}")
    except json.JSONDecodeError as exc:
        return f"error: arguments are not valid JSON: {exc}"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    return func(workspace, args)


def agent_arguments(prog: str, max_steps: int, max_tokens: int) -> argparse.ArgumentParser:
    """The arguments every agent program takes (what `mini.AgentProgramHarness` passes)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--task-file", type=Path, required=True)
    p.add_argument("--workspace", type=Path, required=True)
    p.add_argument("--transcript", type=Path, required=True)
    # The harnesses leave it unset (the URL holds the token; argv is public): from the env.
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    p.add_argument("--model", default="policy")
    p.add_argument("--max-steps", type=int, default=max_steps)
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=None)
    return p


def endpoint(base_url: str | None) -> ChatEndpoint:
    """The session's chat endpoint; the key is the session token."""
    if not base_url:
        raise SystemExit("no model endpoint: pass --base-url or set OPENAI_BASE_URL")
    return ChatEndpoint(base_url, os.environ.get("OPENAI_API_KEY", "none"))


def main(argv: list[str] | None = None) -> int:
    args = agent_arguments("mini_agent", max_steps=6, max_tokens=256).parse_args(argv)
    client = endpoint(args.base_url)
    task = args.task_file.read_text()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": task}]
    transcript: dict[str, Any] = {"messages": messages, "steps": 0, "status": "running"}

    def save(status: str, error: str | None = None, answer: str | None = None) -> None:
        transcript.update(status=status, error=error, final_answer=answer)
        args.transcript.write_text(json.dumps(transcript, indent=1))

    extra: dict[str, Any] = {}
    if args.temperature is not None:
        extra["temperature"] = args.temperature
    for step in range(args.max_steps):
        transcript["steps"] = step + 1
        try:
            msg = reply_message(client.create(model=args.model, messages=messages,
                                              tools=TOOLS, max_tokens=args.max_tokens, **extra))
        except EndpointDown as exc:
            save("endpoint_error", str(exc))
            print(f"mini_agent: the model endpoint failed: {exc}", file=sys.stderr)
            return EXIT_ENDPOINT_DOWN
        except EndpointError as exc:
            save("error", str(exc))
            print(f"mini_agent: the model endpoint returned an error: {exc}", file=sys.stderr)
            return EXIT_AGENT_ERROR
        content = msg["content"]
        # Only function calls are ours to run; other tool-call kinds are ignored.
        calls = function_calls(msg)
        entry: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            entry["tool_calls"] = calls
        messages.append(entry)
        if not calls:
            answer = content.strip()
            save("done", answer=answer)
            last = answer.splitlines()[-1] if answer else ""
            print(last)
            return EXIT_DONE
        for call in calls:
            result = run_tool(args.workspace, call["function"]["name"],
                              call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    save("step_limit", error=f"no final answer after {args.max_steps} steps")
    print(f"mini_agent: step limit of {args.max_steps} reached without a final answer",
          file=sys.stderr)
    return EXIT_AGENT_ERROR


if __name__ == "__main__":
    sys.exit(main())
