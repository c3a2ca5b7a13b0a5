"""The Trainer plugin kind: turns recorded samples into better weights."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Trainer(ABC):
    """Base class of trainer plugins (`local` on one machine, `verl` on clusters)."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def train(self, config: Any) -> None:
        """Train according to `config` (an `openforge.config.TrainConfig`)."""
