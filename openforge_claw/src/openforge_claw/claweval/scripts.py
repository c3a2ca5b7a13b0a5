"""Scripted-engine solutions of Claw-Eval tasks: written once, rendered for each harness.

The source (`solutions/claw_eval.yaml`) is a list of tasks::

    - task: T086_pinbench_calendar_event_creation
      match: create a meeting on 2026-03-10     # a regular expression found in the prompt
      steps:                                    # the right solution, one assistant turn each
        - tools: [{calendar_create_event: {title: Project Sync, ...}}]
        - shell: "python3 make_answer.py"
        - answer: "Created ..."
      wrong: [...]                              # a deliberately wrong one: the task fails

A `tools` turn calls task tools (several in one turn), a `shell` turn runs one command in
the workspace, an `answer` turn is the final answer. `render` turns them into the
scripted engine's entries for a harness, in its own tool vocabulary:

| harness | a task tool | a shell command |
|---|---|---|
| mini | `shell` running `claw-tool NAME '<JSON>'` | `shell {command}` |
| openclaw | `claw-eval__NAME` (its MCP tool) | `exec {command}` |
| codex | `mcp__claw_eval__NAME` | `exec_command {cmd}` |
| claude-code | `mcp__claw-eval__NAME` | `Bash {command}` |

    python -m openforge_claw.claweval.scripts HARNESS [--wrong] > script.yaml
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from openforge_claw.claweval.rollout import MCP_SERVER_NAME
from openforge_claw.formats.claw_eval import TOOL_CLI

# harness -> (task tool name prefix, shell tool, its command argument)
HARNESSES: dict[str, tuple[str | None, str, str]] = {
    "mini": (None, "shell", "command"),
    "openclaw": (f"{MCP_SERVER_NAME}__", "exec", "command"),
    "codex": (f"mcp__{MCP_SERVER_NAME.replace('-', '_')}__", "exec_command", "cmd"),
    "claude-code": (f"mcp__{MCP_SERVER_NAME}__", "Bash", "command"),
}


def source_path() -> Path:
    return Path(str(resources.files("openforge_claw").joinpath("solutions/claw_eval.yaml")))


def load_source(path: Path | None = None) -> list[dict[str, Any]]:
    data = yaml.safe_load((path or source_path()).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path or source_path()}: expected a list of task solutions")
    return data


def _call(harness: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    prefix, shell, key = HARNESSES[harness]
    if prefix is None:
        command = f"{TOOL_CLI} {tool} {shlex.quote(json.dumps(arguments, ensure_ascii=False))}"
        return {"name": shell, "arguments": {key: command}}
    return {"name": prefix + tool, "arguments": arguments}


def _turn(harness: str, step: dict[str, Any]) -> dict[str, Any]:
    _, shell, key = HARNESSES[harness]
    if "answer" in step:
        return {"content": str(step["answer"])}
    if "shell" in step:
        return {"tool_calls": [{"name": shell, "arguments": {key: str(step["shell"])}}]}
    calls = []
    for call in step["tools"]:
        ((tool, arguments),) = call.items()
        calls.append(_call(harness, tool, dict(arguments or {})))
    return {"tool_calls": calls}


def render(source: list[dict[str, Any]], harness: str, wrong: bool = False) -> list[dict[str, Any]]:
    """The scripted engine's entries for `harness` (the wrong solutions with `wrong`)."""
    if harness not in HARNESSES:
        raise ValueError(f"unknown harness {harness!r}; one of {', '.join(HARNESSES)}")
    return [{"match": item["match"],
             "replies": [_turn(harness, step) for step in item["wrong" if wrong else "steps"]]}
            for item in source]


def dump(entries: list[dict[str, Any]], harness: str, wrong: bool) -> str:
    kind = "deliberately wrong" if wrong else "right"
    header = (f"# Scripted-engine solutions ({kind}) of real Claw-Eval tasks for the `{harness}` "
              f"harness.\n# Rendered from claw_eval.yaml: python -m openforge_claw.claweval.scripts "
              f"{harness}{' --wrong' if wrong else ''}\n")
    return header + yaml.safe_dump(entries, allow_unicode=True, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openforge_claw.claweval.scripts")
    parser.add_argument("harness", choices=sorted(HARNESSES))
    parser.add_argument("--wrong", action="store_true", help="the deliberately wrong solutions")
    parser.add_argument("--source", type=Path, help="the solutions file (default: the shipped one)")
    args = parser.parse_args(argv)
    entries = render(load_source(args.source), args.harness, args.wrong)
    sys.stdout.write(dump(entries, args.harness, args.wrong))
    return 0


if __name__ == "__main__":
    sys.exit(main())
