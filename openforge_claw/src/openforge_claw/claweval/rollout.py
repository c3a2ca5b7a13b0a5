"""One rollout of a Claw-Eval task: its workspace, services and tools, and what they recorded.

`prepare` copies the files the agent starts with into the workspace (Claw-Eval's
`/workspace/<path>`; a missing one is an error naming it), starts the task's services from
the checkout, starts the tool proxy with the task's tool endpoints moved to where the
services now run, and writes the tool file the agent's bridge reads (`.claw/tools.json`).
`final_state` returns what Claw-Eval's grader reads besides the conversation: the
dispatches, each service's audit record and the env snapshot. `close` stops it all.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from openforge.harness import McpServer
from openforge.sandbox.scrub import fresh_path

from openforge_claw.claweval import checkout, services, snapshot
from openforge_claw.claweval.bridge import TOOLS_FILE
from openforge_claw.claweval.spec import ClawEvalTask, ToolEndpoint
from openforge_claw.claweval.toolproxy import ToolProxy

MCP_SERVER_NAME = "claw-eval"


def mcp_servers(spec: ClawEvalTask, workspace: Path, python: str = sys.executable) -> list[McpServer]:
    """The bridge's MCP server for a task that has tools (none for one that has not)."""
    if not spec.tools:
        return []
    return [McpServer(name=MCP_SERVER_NAME, command=python,
                      args=["-m", "openforge_claw.claweval.bridge", "mcp", "--tools",
                            str(workspace / TOOLS_FILE)])]


class ClawEvalRollout:
    """The running parts of one Claw-Eval rollout (services, tool proxy)."""

    def __init__(self, spec: ClawEvalTask, python: str = sys.executable,
                 service_env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.python = python
        self.service_env = dict(service_env or {})
        self.services: list[services.ClawEvalService] = []
        self.proxy: ToolProxy | None = None

    def copy_files(self, workspace: Path) -> None:
        root, task_dir = Path(self.spec.repo), Path(self.spec.task_dir)
        for rel in dict.fromkeys([*self.spec.sandbox_files, *self.spec.attachments]):
            source = checkout.require(checkout.resolve_task_file(root, task_dir, rel), rel,
                                      self.spec.task_id)
            target = fresh_path(workspace, rel)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copyfile(source, target)

    def endpoints(self) -> list[ToolEndpoint]:
        """The task's endpoints, each moved to the port its service runs on now."""
        by_port = {s.spec.port: s for s in self.services}
        moved = []
        for endpoint in self.spec.tool_endpoints:
            service = by_port.get(urlsplit(endpoint.url).port or 0)
            url = service.url(endpoint.url) if service else endpoint.url
            moved.append(endpoint.model_copy(update={"url": url}))
        return moved

    def prepare(self, workspace: Path) -> None:
        self.copy_files(workspace)
        # As Claw-Eval: the run's environment first, the task's own `env` over it.
        specs = [s.model_copy(update={"env": {**self.service_env, **s.env}})
                 for s in self.spec.services]
        self.services = services.start_all(specs, Path(self.spec.repo), self.python)
        if self.spec.tools or self.spec.tool_endpoints:
            self.proxy = ToolProxy(self.spec.tools, self.endpoints())
            self.proxy.start()
            path = workspace / TOOLS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"proxy": self.proxy.url, "tools": [
                t.model_dump() for t in self.spec.tools]}, ensure_ascii=False, indent=1))

    def final_state(self, workspace: Path) -> dict[str, Any]:
        audit = {s.name: data for s in self.services if (data := s.audit()) is not None}
        return {"dispatches": list(self.proxy.dispatches) if self.proxy else [],
                "audit_data": audit,
                "env_snapshot": snapshot.collect(self.spec, workspace, self.python),
                "service_urls": {s.name: f"http://127.0.0.1:{s.port}" for s in self.services}}

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        while self.services:
            self.services.pop().stop()
