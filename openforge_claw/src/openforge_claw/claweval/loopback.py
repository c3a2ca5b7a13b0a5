"""Run a Claw-Eval mock service's script with its web server bound to 127.0.0.1.

    python -m openforge_claw.claweval.loopback mock_services/gmail/server.py [ARGS...]

Claw-Eval's services end in `uvicorn.run(app, host="0.0.0.0", port=PORT)`: every network
interface. A rollout's services must answer on loopback only (nothing off the machine may
change a rollout's service state), so this runs the same script as `__main__`, unchanged,
with `uvicorn.run` told to bind 127.0.0.1 whatever host the script names.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

LOOPBACK = "127.0.0.1"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m openforge_claw.claweval.loopback SCRIPT [ARGS...]",
              file=sys.stderr)
        raise SystemExit(2)
    import uvicorn

    serve = uvicorn.run

    def run_on_loopback(app: Any, *pos: Any, **kw: Any) -> Any:
        kw["host"] = LOOPBACK
        return serve(app, *pos, **kw)

    uvicorn.run = run_on_loopback  # type: ignore[assignment]
    sys.argv = list(args)
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
