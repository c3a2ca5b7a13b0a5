"""The `mini` harness: openforge's reference agent (`openforge.builtin.mini_agent`) as a harness.

Options: `max_steps` (default 6), `max_tokens` per model call (default 256: the untrained
default model rambles, and 2 CPU cores must finish `openforge run` in minutes),
`temperature` (default: the session's sampling).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openforge.errors import OpenforgeError
from openforge.harness import (
    Command,
    Harness,
    HarnessContext,
    HarnessOutput,
    ProcessOutput,
    WireAPI,
)

TRANSCRIPT = "mini_transcript.json"
TASK_FILE = "mini_task.txt"


class MiniOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=6, ge=1)
    max_tokens: int = Field(default=256, ge=1)
    temperature: float | None = None


class MiniHarness(Harness):
    """A small ReAct-style agent on the official openai SDK, with shell and write_file tools."""

    wire_api: ClassVar[WireAPI] = "chat"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        try:
            self.config = MiniOptions.model_validate(options)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise OpenforgeError(f"mini harness option {where}: {err['msg']}") from None

    def prepare(self, ctx: HarnessContext) -> None:
        (ctx.home / TASK_FILE).write_text(ctx.task.prompt)

    def command(self, ctx: HarnessContext) -> Command:
        argv = [sys.executable, "-m", "openforge.builtin.mini_agent",
                "--task-file", str(ctx.home / TASK_FILE), "--workspace", str(ctx.workspace),
                "--transcript", str(ctx.home / TRANSCRIPT), "--base-url", ctx.base_url,
                "--model", ctx.model, "--max-steps", str(self.config.max_steps),
                "--max-tokens", str(self.config.max_tokens)]
        if self.config.temperature is not None:
            argv += ["--temperature", str(self.config.temperature)]
        # The agent's `python` is the interpreter openforge runs on, whatever PATH says.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
        return Command(argv=argv, env={"OPENAI_API_KEY": ctx.api_key, "OPENAI_BASE_URL": ctx.base_url,
                                       "PATH": path}, cwd=ctx.workspace)

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        transcript: Any = None
        path = ctx.home / TRANSCRIPT
        if path.exists():
            try:
                transcript = json.loads(path.read_text())
            except ValueError:
                transcript = None
        lines = proc.stdout.strip().splitlines()
        answer = lines[-1] if lines else None
        err_tail = proc.stderr.strip()[-2000:] or None
        if proc.timed_out:
            return HarnessOutput(status="timeout", transcript=transcript, error="mini timed out")
        if proc.returncode == 0:
            return HarnessOutput(status="completed", final_answer=answer, transcript=transcript)
        if proc.returncode == 1:
            return HarnessOutput(status="failed", final_answer=answer, transcript=transcript,
                                 error=err_tail or "mini failed")
        # 2: the model endpoint was down; negative: killed by a signal; other: a crash.
        return HarnessOutput(status="crashed", transcript=transcript,
                             error=err_tail or f"mini exited with code {proc.returncode}")
