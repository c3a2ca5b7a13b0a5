"""The agent's end of a task's tools: an MCP server and the `claw-tool` command.

Both read the tool file `prepare` writes into the workspace (`.claw/tools.json`: the tool
proxy's URL and the tools' names, descriptions and JSON schemas) and forward every call to
the proxy (`toolproxy.py`), which calls the mock service and records the dispatch. Nothing
here is trusted: whatever the agent does to these files or programs, it can only make real
tool calls.

    claw-tool list                      every tool with its JSON schema
    claw-tool NAME '{"key": "value"}'   call NAME (arguments from stdin with '-'); prints
                                        the service's JSON answer; exit 1 on an error status
    python -m openforge_claw.claweval.bridge mcp --tools PATH
                                        an MCP server on stdio offering the same tools

The tool file is found with `--tools`, else `$CLAW_TOOLS`, else in `.claw/tools.json` of the
current folder or a folder above it (a harness's shell starts in the workspace).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

TOOLS_FILE = Path(".claw") / "tools.json"
TOOLS_ENV = "CLAW_TOOLS"
_TIMEOUT_S = 60.0


class BridgeError(Exception):
    """A bad tool file or an unreachable proxy: one line for the agent to read."""


def find_tools_file(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get(TOOLS_ENV):
        return Path(os.environ[TOOLS_ENV])
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / TOOLS_FILE).is_file():
            return folder / TOOLS_FILE
    raise BridgeError(f"no {TOOLS_FILE} here or above {here}: run claw-tool in the task's "
                      f"workspace, or pass --tools PATH")


def load_tools(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BridgeError(f"cannot read the tool file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("proxy"), str):
        raise BridgeError(f"{path} is not a tool file (no proxy URL)")
    return data


def call(tools: dict[str, Any], name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    """(ok, text) of one call: the service's JSON answer as text, as Claw-Eval shows it."""
    try:
        response = httpx.post(f"{tools['proxy']}/call/{name}", json=arguments,
                              timeout=_TIMEOUT_S, trust_env=False)
        answer = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise BridgeError(f"the tool proxy at {tools['proxy']} did not answer: {exc}") from None
    if response.status_code != 200:
        return False, json.dumps(answer, ensure_ascii=False)
    return answer["status"] < 400, json.dumps(answer["body"], ensure_ascii=False)


# -- the command ---------------------------------------------------------------------------

def _arguments(raw: str | None) -> dict[str, Any]:
    text = sys.stdin.read() if raw == "-" else (raw or "{}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BridgeError(f"the arguments are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BridgeError("the arguments must be a JSON object, e.g. '{\"days_back\": 7}'")
    return value


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["mcp"]:
        return serve_mcp(args[1:])
    parser = argparse.ArgumentParser(prog="claw-tool", description="Call a tool of this task.")
    parser.add_argument("--tools", help=f"the tool file (default: {TOOLS_FILE} here or above)")
    parser.add_argument("name", help="a tool name, or `list`")
    parser.add_argument("arguments", nargs="?", help="a JSON object ('-': read it from stdin)")
    opts = parser.parse_args(args)
    try:
        tools = load_tools(find_tools_file(opts.tools))
        if opts.name == "list":
            for tool in tools.get("tools") or []:
                print(f"{tool['name']}: {tool.get('description', '')}\n  arguments: "
                      f"{json.dumps(tool.get('input_schema') or {}, ensure_ascii=False)}")
            return 0
        ok, text = call(tools, opts.name, _arguments(opts.arguments))
    except BridgeError as exc:
        print(f"claw-tool: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0 if ok else 1


# -- the MCP server ------------------------------------------------------------------------

def serve_mcp(argv: list[str]) -> int:
    """An MCP server on stdin/stdout with the task's tools (official `mcp` SDK)."""
    parser = argparse.ArgumentParser(prog="claw-tool mcp")
    parser.add_argument("--tools", help=f"the tool file (default: {TOOLS_FILE} here or above)")
    opts = parser.parse_args(argv)
    try:
        tools = load_tools(find_tools_file(opts.tools))
    except BridgeError as exc:
        print(f"claw-tool mcp: {exc}", file=sys.stderr)
        return 2

    import anyio
    import mcp.server.stdio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    listed = [types.Tool(name=t["name"], description=t.get("description") or "",
                         input_schema=t.get("input_schema") or {"type": "object",
                                                                "properties": {}})
              for t in tools.get("tools") or []]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            ok, text = await anyio.to_thread.run_sync(
                call, tools, params.name, dict(params.arguments or {}))
        except BridgeError as exc:
            ok, text = False, str(exc)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    is_error=not ok)

    server = Server("claw-eval", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with mcp.server.stdio.stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
