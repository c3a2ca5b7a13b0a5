"""openforge_gui actions as OSWorld actions, in either of DesktopEnv's action spaces.

- `pyautogui`: a Python snippet DesktopEnv runs in the VM after `import pyautogui`
  (`pyautogui.click(120, 45)`); text is quoted with `repr`, so any text is one literal.
- `computer_13`: OSWorld's structured actions (`{"action_type": "CLICK", "x": .., "y": ..}`).

`answer` and `fail` end the episode: they become DesktopEnv's `DONE` and `FAIL`. Actions a
desktop has no meaning for (`click_element`, `goto`: there is no DOM and no address bar to
rely on) raise `UnsupportedAction` with a one-line reason that the agent sees.
"""

from __future__ import annotations

from typing import Any

from openforge_gui.actions import Action

ACTION_SPACES = ("pyautogui", "computer_13")
# Pixels of a browser-style scroll per wheel click of pyautogui / computer_13.
PIXELS_PER_CLICK = 100
# Playwright key names (what openforge_gui's parser produces) -> pyautogui key names.
_KEYS = {
    "control": "ctrl", "alt": "alt", "shift": "shift", "meta": "win", "enter": "enter",
    "escape": "esc", "tab": "tab", "backspace": "backspace", "delete": "delete",
    "space": "space", "arrowup": "up", "arrowdown": "down", "arrowleft": "left",
    "arrowright": "right", "home": "home", "end": "end", "pageup": "pageup",
    "pagedown": "pagedown", "insert": "insert",
}


class UnsupportedAction(ValueError):
    """An action the desktop cannot perform; the message is one line for the agent."""


def key_names(keys: str) -> list[str]:
    """"Control+a" -> ["ctrl", "a"]; "F5" -> ["f5"]; a lone "+" stays a key."""
    parts = [p for p in keys.split("+") if p] or ["+"]
    return [_KEYS.get(p.lower(), p.lower() if len(p) > 1 else p) for p in parts]


def _clicks(pixels: int) -> int:
    """Wheel clicks for a pixel distance, at least one when there is any distance."""
    if pixels == 0:
        return 0
    return max(1, round(abs(pixels) / PIXELS_PER_CLICK)) * (1 if pixels > 0 else -1)


def to_pyautogui(action: Action) -> str:
    """The pyautogui snippet for one non-final action."""
    if action.type == "click":
        return f"pyautogui.click({action.x}, {action.y})"
    if action.type == "type":
        return f"pyautogui.typewrite({action.text!r})"
    if action.type == "key":
        names = key_names(action.keys)
        if len(names) == 1:
            return f"pyautogui.press({names[0]!r})"
        return f"pyautogui.hotkey({', '.join(repr(n) for n in names)})"
    if action.type == "scroll":
        # A browser's dy > 0 scrolls down; pyautogui's positive clicks scroll up.
        lines = [f"pyautogui.moveTo({action.x}, {action.y})"]
        if action.dy:
            lines.append(f"pyautogui.scroll({-_clicks(action.dy)})")
        if action.dx:
            lines.append(f"pyautogui.hscroll({_clicks(action.dx)})")
        return "; ".join(lines)
    if action.type == "wait":
        return f"time.sleep({action.seconds})"
    raise UnsupportedAction(_unsupported(action))


def to_computer_13(action: Action) -> dict[str, Any] | str:
    """The computer_13 action for one non-final action (`WAIT` is a bare string there)."""
    if action.type == "click":
        return {"action_type": "CLICK", "x": action.x, "y": action.y}
    if action.type == "type":
        return {"action_type": "TYPING", "text": action.text}
    if action.type == "key":
        names = key_names(action.keys)
        if len(names) == 1:
            return {"action_type": "PRESS", "key": names[0]}
        return {"action_type": "HOTKEY", "keys": names}
    if action.type == "scroll":
        return {"action_type": "SCROLL", "dx": _clicks(action.dx), "dy": -_clicks(action.dy)}
    if action.type == "wait":
        return "WAIT"
    raise UnsupportedAction(_unsupported(action))


def _unsupported(action: Action) -> str:
    if action.type in ("click_element", "goto"):
        return (f"{action.type} needs a browser page; on the desktop use click(x, y), "
                "type(text) and key(keys)")
    return f"{action.type} is not a desktop action"


def final_action(action_type: str) -> str:
    """DesktopEnv's end-of-episode action for `answer` (DONE) or `fail` (FAIL)."""
    return "FAIL" if action_type == "fail" else "DONE"
