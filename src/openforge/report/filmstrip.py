"""The filmstrip of a GUI rollout in the HTML report: per step, the screenshot the model saw,
what it answered, and the action that was parsed from it.

A rollout is shown as a filmstrip when its recorded calls carry images (the gateway keeps
each image once, by the sha256 of its exact bytes; a call lists the hashes its prompt
holds). Each call is one step; its screenshot is the last image of its prompt, read back
from the store and inlined as a data URL, so the page stays self-contained. The parsed
action and its outcome come from the harness's transcript when it records them per step
(`transcript.steps[i].action_text` / `parse_error` / `result`, as `gui-agent` does).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from openforge.types import Call

_MAX_OUTPUT = 2000


def _step_notes(transcript: Any) -> list[dict[str, Any]]:
    if isinstance(transcript, dict) and isinstance(transcript.get("steps"), list):
        return [s if isinstance(s, dict) else {} for s in transcript["steps"]]
    return []


def _output_text(call: Call) -> str:
    from openforge.report import response_parts

    reasoning, text, calls = response_parts(call)
    return "\n".join(part for part in (text, *calls) if part)


def filmstrip_html(calls: list[Call], images: dict[str, tuple[str, bytes]],
                   transcript: Any = None) -> str:
    """The filmstrip of one session: `images` maps sha256 -> (media type, bytes).

    The caption says how many training samples the steps became: a GUI harness that sends
    a windowed screenshot history makes one per step, and this is where that shows.
    """
    from openforge.trajectory import build_samples

    samples = len(build_samples(calls).samples)
    notes = _step_notes(transcript)
    frames = []
    for i, call in enumerate(calls):
        note = notes[i] if i < len(notes) else {}
        shot = call.images[-1] if call.images else None
        if shot and shot in images:
            media, data = images[shot]
            img = (f"<img alt='step {i + 1} screenshot' title='sha256 {html.escape(shot)}' "
                   f"src='data:{html.escape(media)};base64,{base64.b64encode(data).decode()}'>")
        else:
            img = "<div class='meta'>no screenshot</div>"
        output = _output_text(call)[:_MAX_OUTPUT]
        if note.get("action_text"):
            action = html.escape(str(note["action_text"]))
            result = note.get("result") or {}
            if result and not result.get("ok", True):
                action += f" <span class='fail'>({html.escape(str(result.get('error')))})</span>"
        elif note.get("parse_error"):
            action = f"<span class='fail'>no action: {html.escape(str(note['parse_error']))}</span>"
        else:
            action = "<span class='meta'>-</span>"
        frames.append(f"<figure class='frame'><figcaption>step {i + 1}</figcaption>{img}"
                      f"<pre class='output'>{html.escape(output)}</pre>"
                      f"<div class='action'>&rarr; {action}</div></figure>")
    per_step = "one sample per step" if samples == len(calls) else "steps merged"
    return (f"<p><b>filmstrip</b> <span class='meta'>({len(calls)} steps &rarr; {samples} "
            f"training samples: {per_step})</span></p>"
            "<div class='filmstrip' style='display:flex;gap:8px;overflow-x:auto'>"
            + "".join(frames) + "</div>")


def load_filmstrips(run_dir: Path, data: dict[str, Any],
                    calls: dict[str, list[Call]]) -> dict[str, str]:
    """session id -> filmstrip HTML, for the report's attempts whose calls carry images."""
    from openforge.runner import STORE_FILE

    wanted = [sid for sid, session_calls in calls.items()
              if any(c.images for c in session_calls)]
    path = Path(run_dir) / STORE_FILE
    if not wanted or not path.exists():
        return {}
    from openforge.store import Store

    out: dict[str, str] = {}
    store = Store(path)
    try:
        for sid in wanted:
            images: dict[str, tuple[str, bytes]] = {}
            for call in calls[sid]:
                if call.images and call.images[-1] not in images:
                    stored = store.get_image(call.images[-1])
                    if stored is not None:
                        images[stored.sha256] = (stored.media_type, stored.data)
            result = store.get_result(sid)
            transcript = (result.harness_output or {}).get("transcript") if result else None
            out[sid] = filmstrip_html(calls[sid], images, transcript)
    finally:
        store.close()
    return out
