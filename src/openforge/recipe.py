"""The Recipe plugin kind: a whole training pipeline behind `openforge train --recipe NAME`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from rich.console import Console

from openforge.options import Plugin


class Recipe(Plugin, ABC):
    """Base class of recipe plugins (the built-in `demo`; `claw` from openforge-claw).

    A recipe reads its knobs from its config file in `run`; it takes no plugin options.
    """

    kind = "recipe"

    @abstractmethod
    def run(self, config_path: Path | None, overrides: list[str] | tuple[str, ...],
            console: Console) -> dict[str, Any]:
        """Read the recipe's knobs from `config_path` plus `--set key=value` overrides, run
        every phase (printing progress to `console`), and return a JSON-ready summary."""
