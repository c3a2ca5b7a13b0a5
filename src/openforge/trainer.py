"""The Trainer plugin kind: turns recorded samples into better weights."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from openforge.options import Plugin


class Trainer(Plugin, ABC):
    """Base class of trainer plugins (`local` on one machine, `verl` on clusters).

    `options_model` is the model of `TrainConfig.options` (`openforge train --set
    options.KEY=VALUE`); the trainer is built with them, so they are checked before training.
    """

    kind = "trainer"

    @abstractmethod
    def train(self, config: Any) -> None:
        """Train according to `config` (an `openforge.config.TrainConfig`)."""
