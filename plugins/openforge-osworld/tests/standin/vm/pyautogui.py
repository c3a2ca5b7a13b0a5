"""The stand-in VM's `pyautogui`: instead of moving a real pointer, it drives a one-window
"notes" desktop whose state lives in `$OSW_VM_STATE` (a JSON file).

OSWorld's controller runs every action as `python -c "import pyautogui; ...; <command>"`
inside the VM; the stand-in VM puts this module first on that interpreter's path, so the
exact command strings DesktopEnv sends act on this desktop. The desktop is small on purpose:

- the editor is the rectangle EDITOR; clicking inside it focuses it, clicking outside
  unfocuses it;
- typing (`typewrite`/`write`, `press` of a printable key or "enter") goes into the editor
  when it is focused and is lost otherwise;
- `hotkey("ctrl", "s")` saves the editor's text to ~/notes.txt.

Every call is also appended to the state's `events` list, so tests can see what ran.
Standard library only: the interpreter is whatever Python the VM was started with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FAILSAFE = True
WIDTH, HEIGHT = 640, 400
EDITOR = (20, 60, 620, 380)  # left, top, right, bottom

_STATE = Path(os.environ.get("OSW_VM_STATE", "state.json"))


def _load() -> dict:
    if _STATE.is_file():
        return json.loads(_STATE.read_text())
    return {"focused": False, "text": "", "pointer": [0, 0], "events": []}


def _save(state: dict) -> None:
    _STATE.write_text(json.dumps(state))


def _record(name: str, *args: object, **kwargs: object) -> dict:
    state = _load()
    state["events"].append({"call": name, "args": list(args), "kwargs": kwargs})
    return state


def _insert(state: dict, text: str) -> None:
    if state["focused"]:
        state["text"] += text


def size() -> tuple[int, int]:
    return WIDTH, HEIGHT


def position() -> tuple[int, int]:
    x, y = _load()["pointer"]
    return x, y


def moveTo(x: float | None = None, y: float | None = None, *args: object, **kwargs: object) -> None:  # noqa: N802
    state = _record("moveTo", x, y)
    if x is not None and y is not None:
        state["pointer"] = [int(x), int(y)]
    _save(state)


def click(x: float | None = None, y: float | None = None, clicks: int = 1, *args: object,
          button: str = "left", **kwargs: object) -> None:
    state = _record("click", x, y, button=button, clicks=clicks)
    if x is not None and y is not None:
        state["pointer"] = [int(x), int(y)]
    px, py = state["pointer"]
    left, top, right, bottom = EDITOR
    if button == "left":
        state["focused"] = left <= px <= right and top <= py <= bottom
    _save(state)


def doubleClick(x: float | None = None, y: float | None = None, *args: object, **kwargs: object) -> None:  # noqa: N802
    click(x, y, clicks=2)


def typewrite(message: str | list[str], interval: float = 0.0, *args: object, **kwargs: object) -> None:
    state = _record("typewrite", message)
    keys = [message] if isinstance(message, str) else message
    for key in keys:
        _insert(state, "\n" if key in ("enter", "return") else key)
    _save(state)


write = typewrite


def press(keys: str | list[str], presses: int = 1, *args: object, **kwargs: object) -> None:
    state = _record("press", keys)
    for key in [keys] if isinstance(keys, str) else keys:
        for _ in range(presses):
            if key in ("enter", "return"):
                _insert(state, "\n")
            elif key == "space":
                _insert(state, " ")
            elif key == "backspace" and state["focused"]:
                state["text"] = state["text"][:-1]
            elif len(key) == 1:
                _insert(state, key)
    _save(state)


def hotkey(*keys: str, **kwargs: object) -> None:
    state = _record("hotkey", *keys)
    chord = [k.lower() for k in keys]
    if chord == ["ctrl", "s"]:
        home = Path(os.environ.get("HOME", "."))
        (home / "notes.txt").write_text(state["text"])
    elif chord == ["ctrl", "a"] and state["focused"]:
        state["selected_all"] = True
    _save(state)


def scroll(clicks: int, x: float | None = None, y: float | None = None, **kwargs: object) -> None:
    _save(_record("scroll", clicks, x, y))


def vscroll(clicks: int, x: float | None = None, y: float | None = None, **kwargs: object) -> None:
    _save(_record("vscroll", clicks, x, y))


def rightClick(x: float | None = None, y: float | None = None, *args: object, **kwargs: object) -> None:  # noqa: N802
    click(x, y, button="right")


def hscroll(clicks: int, x: float | None = None, y: float | None = None, **kwargs: object) -> None:
    _save(_record("hscroll", clicks, x, y))


def mouseDown(*args: object, **kwargs: object) -> None:  # noqa: N802
    _save(_record("mouseDown"))


def mouseUp(*args: object, **kwargs: object) -> None:  # noqa: N802
    _save(_record("mouseUp"))


def keyDown(key: str, *args: object, **kwargs: object) -> None:  # noqa: N802
    _save(_record("keyDown", key))


def keyUp(key: str, *args: object, **kwargs: object) -> None:  # noqa: N802
    _save(_record("keyUp", key))


def dragTo(x: float, y: float, *args: object, **kwargs: object) -> None:  # noqa: N802
    _save(_record("dragTo", x, y))


# Tween names OSWorld's computer_13 actions pass to moveTo.
def easeInQuad(n: float) -> float:  # noqa: N802
    return n


easeOutQuad = easeInOutQuad = easeInBounce = easeInElastic = easeInQuad
