"""The `notes` mock service: notes with tags (generic routes; `?q=` searches)."""

from __future__ import annotations

from typing import Any

from openforge_claw.services.base import MockService


class NotesService(MockService):
    name = "notes"
    default_state: dict[str, list[dict[str, Any]]] = {"notes": []}
