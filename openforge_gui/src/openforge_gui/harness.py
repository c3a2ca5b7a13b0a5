"""The `gui-agent` harness: `openforge_gui.agent` (a screenshot -> action loop) as a harness.

Options: `max_steps` (model calls, default 15), `history` (screenshots per request, K,
default 3), `max_tokens` per call (default 128), `temperature` (default: the session's),
`tools` (offer the actions as tools instead of asking for text, default false).

The environment must offer a screen through the computer API (`.openforge/computer.json`
in the workspace, see `openforge_gui.computer`): `miniwob`, `webvoyager`, `online-mind2web`,
or any `ComputerEnvironment`. Running the program and reading its exit code is openforge's
`AgentProgramHarness`, as for `mini`.
"""

from __future__ import annotations

import json
from typing import ClassVar

from pydantic import Field

from openforge.builtin.mini import AgentProgramHarness, AgentProgramOptions


class GuiAgentOptions(AgentProgramOptions):
    max_steps: int = Field(default=15, ge=1)
    max_tokens: int = Field(default=128, ge=1)
    history: int = Field(default=3, ge=1)
    tools: bool = False


class GuiAgentHarness(AgentProgramHarness):
    """A computer-use loop: screenshot -> model (multimodal chat) -> action -> computer API."""

    label: ClassVar[str] = "gui-agent"
    sends_images: ClassVar[bool] = True
    program: ClassVar[str] = "openforge_gui.agent"
    options_model: ClassVar[type[AgentProgramOptions]] = GuiAgentOptions
    task_file: ClassVar[str] = "gui_task.txt"
    transcript_file: ClassVar[str] = "gui_transcript.json"
    options: GuiAgentOptions

    def extra_arguments(self) -> list[str]:
        return ["--history", str(self.options.history)] + (["--tools"] if self.options.tools else [])

    def final_answer(self, stdout: str) -> str | None:
        """The `answer` of the program's last line, the final JSON."""
        lines = stdout.strip().splitlines()
        try:
            final = json.loads(lines[-1]) if lines else {}
        except ValueError:
            return None
        return final.get("answer") if isinstance(final, dict) else None
