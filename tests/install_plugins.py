"""Throwaway harnesses for the runner's `Harness.install` step, loaded as `install_plugins:Name`.

The rollout subprocess imports them through PYTHONPATH (the executor keeps PYTHONPATH).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openforge.harness import Command, Harness, HarnessContext, HarnessMissingError
from openforge.options import PluginOptions


class InstallingOptions(PluginOptions):
    counter: str = ""
    bin: str = ""


class InstallingHarness(Harness):
    """Installs once in the runner (counted in `counter`); rollouts need the `bin` it returns."""

    options_model = InstallingOptions

    def install(self, log: Callable[[str], None] = print) -> dict[str, Any]:
        with open(self.options.counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        log("installed the fake program")
        return {"bin": "/bin/sh"}

    def check(self) -> None:
        if not Path(self.options.bin).is_file():
            raise HarnessMissingError("no bin: install() did not run before the rollout")

    def command(self, ctx: HarnessContext) -> Command:
        return Command(argv=[self.options.bin, "-c", "echo done > ok.txt; echo done"],
                       cwd=ctx.workspace)


class UninstallableHarness(Harness):
    """Its program cannot be had: install() says what to run."""

    def install(self, log: Callable[[str], None] = print) -> dict[str, Any]:
        raise HarnessMissingError("fakeprog is not installed; run: npm install -g fakeprog@1.0.0")

    def command(self, ctx: HarnessContext) -> Command:
        raise AssertionError("never reached")
