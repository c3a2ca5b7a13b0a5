"""CPU of the built-in agent program per rollout: `mini_agent` (its model client is
`openforge.builtin.chat_endpoint`, the standard library) against the same exchange made with
the official `openai` SDK's client, which it used before.

    python benchmarks/bench_agent_program.py [--quick] [--runs 8]

Each run is a new process, as each rollout's agent is: it reads a task, makes one chat call
to a local HTTP server that answers with a final reply (no tool call), writes its
transcript and exits. Printed: the median CPU seconds (user + system) of each, over the
same number of runs, and their ratio. It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPLY = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "policy",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": "done\n42"}}]}).encode()

# The same call through the official SDK, as mini_agent made it before.
SDK_PROGRAM = """
import os, sys, openai
client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="k", max_retries=2)
reply = client.chat.completions.create(model="policy", max_tokens=8,
                                       messages=[{"role": "user", "content": "hi"}])
print(reply.choices[0].message.content.splitlines()[-1])
"""


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(REPLY)))
        self.end_headers()
        self.wfile.write(REPLY)

    def log_message(self, *args: Any) -> None:
        pass


def _cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds of one run of `argv` (which must print 42 last)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.stdout.strip().splitlines()[-1:] != ["42"]:
        raise SystemExit(f"{argv[:3]} did not print the reply: {out.stdout!r} {out.stderr!r}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs each")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args(argv)
    runs = 3 if args.quick else args.runs
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
           "OPENAI_API_KEY": "k"}
    with tempfile.TemporaryDirectory() as tmp:
        task = Path(tmp) / "task.txt"
        task.write_text("say 42")
        mini = [sys.executable, "-m", "openforge.builtin.mini_agent", "--task-file", str(task),
                "--workspace", tmp, "--transcript", str(Path(tmp) / "transcript.json")]
        sdk = [sys.executable, "-c", SDK_PROGRAM]
        _cpu_of(mini, env), _cpu_of(sdk, env)  # warm the page cache for both
        mini_s = statistics.median(_cpu_of(mini, env) for _ in range(runs))
        sdk_s = statistics.median(_cpu_of(sdk, env) for _ in range(runs))
    server.shutdown()
    print(json.dumps({"agent program cpu per run": {
        "runs": runs, "mini_agent_s": round(mini_s, 3), "openai_sdk_client_s": round(sdk_s, 3),
        "sdk_over_mini": round(sdk_s / mini_s, 1) if mini_s else None}}))


if __name__ == "__main__":
    main()
