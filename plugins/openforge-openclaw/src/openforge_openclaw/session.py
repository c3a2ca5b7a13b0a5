"""OpenClaw's own transcript of a run: the session events in its state directory.

OpenClaw keeps a session's events (the `{"type": "session" | "message" | ...}` objects it
used to write as `sessions/<id>.jsonl`, the format benchmarks such as QwenClawBench grade)
in the agent's SQLite database, `<state>/agents/<agent>/agent/openclaw-agent.sqlite`,
table `transcript_events(session_id, seq, event_json, event_zstd, event_utf8_bytes)`: an
event of 1 KiB or more is stored zstd-compressed (`event_zstd`) instead of as JSON text.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

_QUERY = ("SELECT session_id, seq, event_json, event_zstd, event_utf8_bytes "
          "FROM transcript_events ORDER BY session_id, seq")


def _decode(text: str | None, blob: bytes | None, size: int | None) -> dict[str, Any] | None:
    if text is None and blob is not None:
        import zstandard

        text = zstandard.ZstdDecompressor().decompress(
            blob, max_output_size=int(size or 0) or 4 << 20).decode("utf-8")
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def read_events(state_dir: Path, session_id: str | None = None) -> list[dict[str, Any]] | None:
    """The events of `session_id` (else of the session with the most events) in the state
    directory, in order; None when there is no readable transcript."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for db in sorted(state_dir.glob("agents/*/agent/openclaw-agent.sqlite")):
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                rows = conn.execute(_QUERY).fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            continue
        for sid, _seq, text, blob, size in rows:
            try:
                event = _decode(text, blob, size)
            except (ValueError, ImportError, UnicodeDecodeError):
                event = None
            if event is not None:
                sessions.setdefault(str(sid), []).append(event)
    if not sessions:
        return None
    if session_id and session_id in sessions:
        return sessions[session_id]
    return max(sessions.values(), key=len)
