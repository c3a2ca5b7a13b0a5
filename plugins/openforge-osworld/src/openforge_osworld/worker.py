"""The process that holds OSWorld's `DesktopEnv`, driven by JSON lines on stdin/stdout.

Why a process of its own: `desktop-env` pins torch 2.5, transformers 4.35 and numpy<2,
which cannot live in one environment with openforge (transformers>=4.50), so it is
installed in a virtual environment of its own and this file runs under that interpreter
(the `python` option of the `osworld` environment). It imports only the standard library
and `desktop_env`, and is run as a script (`python worker.py`), so openforge need not be
installed there.

Protocol: one JSON request a line in, one JSON reply a line out.

    {"op": "start", "options": {...DesktopEnv keyword arguments...}}  -> {"ok": true}
    {"op": "reset", "task_config": {...OSWorld task JSON...}}          -> {"ok": true}
    {"op": "screenshot"}                                              -> {"ok": true, "png": b64}
    {"op": "step", "action": str | dict, "pause": seconds}            -> {"ok": true, "done": .., "info": ..}
    {"op": "evaluate"}                                                -> {"ok": true, "score": float}
    {"op": "close"}                                                   -> {"ok": true}, then exit

A failure is `{"ok": false, "error": "<one line>"}`; the worker stays up for the next request.
DesktopEnv and its evaluators print freely, so the protocol keeps the real stdout to itself
and everything else printed goes to stderr.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from typing import Any


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:500]}" if text else type(exc).__name__


class Worker:
    def __init__(self) -> None:
        self.env: Any = None

    def start(self, options: dict[str, Any]) -> dict[str, Any]:
        from desktop_env.desktop_env import DesktopEnv

        if "screen_size" in options:
            options["screen_size"] = tuple(options["screen_size"])
        self.env = DesktopEnv(**options)
        return {}

    def reset(self, task_config: dict[str, Any]) -> dict[str, Any]:
        self.env.reset(task_config=task_config)
        return {}

    def screenshot(self) -> dict[str, Any]:
        png = self.env.render()
        if not png:
            raise RuntimeError("the VM returned no screenshot")
        return {"png": base64.b64encode(png).decode()}

    def step(self, action: Any, pause: float = 2.0) -> dict[str, Any]:
        _, _, done, info = self.env.step(action, pause=pause)
        return {"done": bool(done), "info": info or {}}

    def evaluate(self) -> dict[str, Any]:
        return {"score": float(self.env.evaluate())}

    def close(self) -> dict[str, Any]:
        if self.env is not None:
            self.env.close()
            self.env = None
        return {}


def main() -> int:
    # Run as a script, this file's folder is sys.path[0]; its siblings (actions.py, tasks.py...)
    # must not shadow top-level modules that desktop_env or its dependencies import.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    # The protocol's channel is the original stdout; fd 1 becomes stderr for everyone else.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        op = "?"
        try:
            request = json.loads(line)
            op = request.pop("op")
            handler = getattr(worker, op, None)
            if op.startswith("_") or handler is None:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, **handler(**request)}
        except BaseException as exc:  # noqa: BLE001 - every failure is a reply, not a crash
            traceback.print_exc()
            reply = {"ok": False, "error": _one_line(exc)}
        channel.write(json.dumps(reply) + "\n")
        if op == "close":
            break
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
