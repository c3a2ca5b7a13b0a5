"""The `mini` harness: openforge's reference agent (`openforge.builtin.mini_agent`) as a harness.

Options: `max_steps` (default 6), `max_tokens` per model call (default 256: the untrained
default model rambles, and 2 CPU cores must finish `openforge run` in minutes),
`temperature` (default: the session's sampling).

`AgentProgramHarness` is the part any agent program of this kind shares (the task in a
file, `python -m <program>` against the session URL given in `OPENAI_BASE_URL` and the token
in `OPENAI_API_KEY`, never on the command line; a JSON transcript; exit code 0 done / 1 agent
error / other: crashed); openforge-gui's `gui-agent` builds on it too.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, ClassVar

from pydantic import Field

from openforge.harness import (
    Command,
    Harness,
    HarnessContext,
    HarnessOutput,
    ProcessOutput,
    WireAPI,
)
from openforge.options import PluginOptions
from openforge.sandbox import bounded

TRANSCRIPT = "mini_transcript.json"
TASK_FILE = "mini_task.txt"
_TRANSCRIPT_MAX = 64 << 20  # bytes of the transcript read (mini's are kilobytes)


class AgentProgramOptions(PluginOptions):
    """The options every agent program takes; a subclass adds its own and its defaults."""

    max_steps: int = Field(default=6, ge=1)
    """Model calls at most; the agent stops with an error after the last one."""
    max_tokens: int = Field(default=256, ge=1)
    """max_tokens of each model call."""
    temperature: float | None = None
    """Sampling temperature of each call (None: the run's `sampling.temperature`)."""


class MiniOptions(AgentProgramOptions):
    """mini's options: the shared ones, with their defaults."""


class AgentProgramHarness(Harness):
    """Runs `python -m <program>` with the arguments of `mini_agent.agent_arguments`.

    Subclasses name the program, their options model (`max_steps`, `max_tokens`,
    `temperature` and their own), their file names, and may add arguments and read the
    final answer their own way.
    """

    wire_api: ClassVar[WireAPI] = "chat"
    label: ClassVar[str] = "mini"  # names the program in the statuses' messages
    program: ClassVar[str] = "openforge.builtin.mini_agent"
    options_model: ClassVar[type[AgentProgramOptions]] = MiniOptions
    options: AgentProgramOptions
    task_file: ClassVar[str] = TASK_FILE
    transcript_file: ClassVar[str] = TRANSCRIPT

    def prepare(self, ctx: HarnessContext) -> None:
        (ctx.home / self.task_file).write_text(ctx.task.prompt)

    def extra_arguments(self) -> list[str]:
        """The program's own arguments, after the shared ones."""
        return []

    def command(self, ctx: HarnessContext) -> Command:
        # The endpoint and the key travel in the environment only: argv is public (`ps`).
        argv = [sys.executable, "-m", self.program,
                "--task-file", str(ctx.home / self.task_file), "--workspace", str(ctx.workspace),
                "--transcript", str(ctx.home / self.transcript_file),
                "--model", ctx.model, "--max-steps", str(self.options.max_steps),
                "--max-tokens", str(self.options.max_tokens)]
        if self.options.temperature is not None:
            argv += ["--temperature", str(self.options.temperature)]
        argv += self.extra_arguments()
        # The agent's `python` is the interpreter openforge runs on, whatever PATH says.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
        return Command(argv=argv, env={"OPENAI_API_KEY": ctx.api_key, "OPENAI_BASE_URL": ctx.base_url,
                                       "PATH": path}, cwd=ctx.workspace)

    def final_answer(self, stdout: str) -> str | None:
        """The answer the program printed: its last line of stdout."""
        lines = stdout.strip().splitlines()
        return lines[-1] if lines else None

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        transcript: Any = None
        path = ctx.home / self.transcript_file
        if path.exists():
            # In the agent's HOME, so as large as the agent makes it: read no more than a
            # transcript takes (a cut one does not parse, and is left out).
            try:
                transcript = json.loads(bounded.read_text(path, _TRANSCRIPT_MAX))
            except ValueError:
                transcript = None
        answer = self.final_answer(proc.stdout)
        err_tail = proc.stderr.strip()[-2000:] or None
        name = self.label
        if proc.timed_out:
            return HarnessOutput(status="timeout", transcript=transcript, error=f"{name} timed out")
        if proc.returncode == 0:
            return HarnessOutput(status="completed", final_answer=answer, transcript=transcript)
        if proc.returncode == 1:
            return HarnessOutput(status="failed", final_answer=answer, transcript=transcript,
                                 error=err_tail or f"{name} failed")
        # 2: the model endpoint was down; negative: killed by a signal; other: a crash.
        return HarnessOutput(status="crashed", transcript=transcript,
                             error=err_tail or f"{name} exited with code {proc.returncode}")


class MiniHarness(AgentProgramHarness):
    """A small ReAct-style agent over OpenAI chat completions, with shell and write_file tools."""
