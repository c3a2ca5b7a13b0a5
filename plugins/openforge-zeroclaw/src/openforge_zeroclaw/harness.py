"""The `zeroclaw` harness: `zeroclaw agent -a of -m TASK` against the session URL.

ZeroClaw cannot be installed by openforge (no npm / PyPI / crates.io release): the binary
comes from the option `bin`, `$ZEROCLAW_BIN` or `PATH`. `install` resolves it once per
run outside the sandbox and hands the path to the rollouts (the sandbox's environment
does not carry `ZEROCLAW_BIN`).

In single-message mode ZeroClaw runs its tool loop and prints the final reply on stdout;
diagnostics go to stderr; a failure exits non-zero with `Error: ...` on stderr.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from openforge.harness import (
    Command,
    Harness,
    HarnessContext,
    HarnessMissingError,
    HarnessOutput,
    ProcessOutput,
    WireAPI,
    validate_options,
    wire_api_variants,
)
from openforge_zeroclaw.config import ALIAS, ZeroClawOptions, config_dir, write_config

BIN_ENV = "ZEROCLAW_BIN"
HOW_TO_GET = ("ZeroClaw is not on npm, PyPI or crates.io: download a release binary from "
              "https://github.com/zeroclaw-labs/zeroclaw/releases (or run its install.sh), then "
              f"put `zeroclaw` on PATH or set {BIN_ENV}=/path/to/zeroclaw")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Errors that say the model endpoint failed: infrastructure, not the policy's doing.
_ENDPOINT_DOWN = re.compile(
    r"connection refused|error sending request|connection reset|timed out|"
    r"\b(?:500|502|503|504)\b|internal server error|service unavailable|bad gateway", re.I)


def find_zeroclaw(given: str | None) -> Path:
    """The zeroclaw binary: `given`, else `$ZEROCLAW_BIN`, else PATH; or HarnessMissingError."""
    for source, value in (("option bin", given), (BIN_ENV, os.environ.get(BIN_ENV))):
        if value:
            path = Path(value).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise HarnessMissingError(f"zeroclaw: {source}={path} is not an executable file; "
                                          + HOW_TO_GET)
            return path.resolve()
    on_path = shutil.which("zeroclaw")
    if on_path:
        return Path(on_path).resolve()
    raise HarnessMissingError("zeroclaw is not installed; " + HOW_TO_GET)


class ZeroClawHarness(Harness):
    """ZeroClaw (`zeroclaw agent -m`, Rust binary from ZEROCLAW_BIN or PATH): chat, Responses or Messages."""

    wire_api: ClassVar[WireAPI] = "chat"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = validate_options(ZeroClawOptions, options, "zeroclaw")

    def install(self, log: Callable[[str], None] = print) -> dict[str, Any]:
        return {"bin": str(find_zeroclaw(self.config.bin))}

    def check(self) -> None:
        find_zeroclaw(self.config.bin)

    def prepare(self, ctx: HarnessContext) -> None:
        write_config(ctx, self.config)

    def program_paths(self) -> list[Path]:
        """The zeroclaw binary (the sandbox maps it read-only)."""
        return [Path(find_zeroclaw(self.config.bin)).resolve()]

    def command(self, ctx: HarnessContext) -> Command:
        argv = [str(find_zeroclaw(self.config.bin)), "agent", "-a", ALIAS,
                # `--message=TASK`: a task that starts with `-` stays the message.
                f"--message={ctx.task.prompt}"]
        env = {"HOME": str(ctx.home), "ZEROCLAW_CONFIG_DIR": str(config_dir(ctx)),
               "NO_COLOR": "1"}
        return Command(argv=argv, env=env, cwd=ctx.workspace)

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        return to_output(proc)


def to_output(proc: ProcessOutput) -> HarnessOutput:
    """Map the finished `zeroclaw agent -m` process to a `HarnessOutput`."""
    answer = _ANSI.sub("", proc.stdout).strip() or None
    stderr = _ANSI.sub("", proc.stderr).strip()
    transcript = {"stdout": answer, "stderr_tail": stderr[-2000:]}
    if proc.timed_out:
        return HarnessOutput(status="timeout", final_answer=answer, transcript=transcript,
                             error="zeroclaw did not finish before the rollout timeout")
    code = proc.returncode
    if code == 0:
        return HarnessOutput(status="completed", final_answer=answer, transcript=transcript)
    if code is None or code < 0:
        return HarnessOutput(status="crashed", final_answer=answer, transcript=transcript,
                             error=f"zeroclaw killed by signal {-(code or 0)}")
    errors = [ln for ln in stderr.splitlines() if ln.lower().startswith("error")]
    message = (errors[-1] if errors else stderr.splitlines()[-1] if stderr else
               f"zeroclaw exited with code {code}")[:2000]
    if _ENDPOINT_DOWN.search(message):
        return HarnessOutput(status="crashed", final_answer=answer, transcript=transcript,
                             error=f"model endpoint failed: {message}")
    return HarnessOutput(status="failed", final_answer=answer, transcript=transcript, error=message)


_BY_API = wire_api_variants(ZeroClawHarness)


def create(**options: Any) -> ZeroClawHarness:
    """ZeroClaw (`zeroclaw agent -m`, Rust binary from ZEROCLAW_BIN or PATH): chat, Responses or Messages."""
    return _BY_API[validate_options(ZeroClawOptions, options, "zeroclaw").api](**options)
