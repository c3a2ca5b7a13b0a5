"""The Recipe plugin kind: a whole training pipeline behind `openforge train --recipe NAME`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from rich.console import Console


class Recipe(ABC):
    """Base class of recipe plugins (the built-in `demo`; `claw` from openforge-claw)."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def run(self, config_path: Path | None, overrides: list[str] | tuple[str, ...],
            console: Console) -> dict[str, Any]:
        """Read the recipe's knobs from `config_path` plus `--set key=value` overrides, run
        every phase (printing progress to `console`), and return a JSON-ready summary."""
