"""What one gateway process has served since it started: calls by outcome, tokens, CPU.

`GET /admin/health` answers it under `"served"`, and `openforge serve` prints it when it
stops. With `gateway.workers = N` each worker counts the calls of its own sessions; the
serve summary adds the workers up.

The outcomes are the pipeline's (`gateway/pipeline.py`): a call answered and recorded as
training data, an engine failure recorded as a failed call, a request refused with a 4xx
before anything was generated (not recorded), and a client that left before its answer
(nothing recorded). CPU is the whole process's, every thread (`time.process_time`) since
the gateway began serving: under `openforge serve`, and in each worker, that is the
gateway's own, the figure `benchmarks/bench_gateway.py` measures from outside (issue 20);
a gateway embedded in another program (`openforge run`) shares its process with it.
"""

from __future__ import annotations

import collections
import time
from typing import Any


class GatewayStats:
    """Counters the call pipeline increments; plain integers, read by the admin route."""

    __slots__ = ("ok", "failed", "refused", "disconnected", "prompt_tokens",
                 "completion_tokens", "_started", "_cpu_at_start")

    def __init__(self) -> None:
        self.ok = 0  # answered, and recorded as training data
        self.failed = 0  # the engine (or the gateway) failed: recorded as a failed call
        self.refused: collections.Counter[int] = collections.Counter()  # by HTTP status
        self.disconnected = 0  # the client left before its answer: nothing recorded
        self.prompt_tokens = 0  # of recorded calls, failed ones included
        self.completion_tokens = 0
        self._started = time.monotonic()
        self._cpu_at_start = time.process_time()

    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON, with the CPU spent since start and per recorded call."""
        cpu_s = time.process_time() - self._cpu_at_start
        calls = self.ok + self.failed
        return {
            "ok": self.ok,
            "failed": self.failed,
            "refused": sum(self.refused.values()),
            "refused_by_status": {str(k): v for k, v in sorted(self.refused.items())},
            "disconnected": self.disconnected,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "cpu_s": round(cpu_s, 6),
            "cpu_ms_per_call": _per_call(cpu_s, calls),
        }


def _per_call(cpu_s: float, calls: int) -> float | None:
    return round(1000 * cpu_s / calls, 3) if calls else None


def add_up(snapshots: list[dict[str, Any]], workers: int) -> dict[str, Any]:
    """The snapshots of a pool's `workers` as one; `"unreported"` counts the workers whose
    snapshot is missing (they did not answer), whose calls the sums lack."""
    total: dict[str, Any] = {key: sum(s[key] for s in snapshots) for key in (
        "ok", "failed", "refused", "disconnected", "prompt_tokens",
        "completion_tokens", "cpu_s")}
    total["cpu_s"] = round(total["cpu_s"], 6)
    by_status: collections.Counter[str] = collections.Counter()
    for s in snapshots:
        by_status.update(s["refused_by_status"])
    total["refused_by_status"] = dict(sorted(by_status.items()))
    total["uptime_s"] = max((s["uptime_s"] for s in snapshots), default=0.0)
    total["cpu_ms_per_call"] = _per_call(total["cpu_s"], total["ok"] + total["failed"])
    total["unreported"] = workers - len(snapshots)
    return total


def summary_line(served: dict[str, Any]) -> str:
    """One line for the end of `openforge serve`."""
    refused = served["refused"]
    statuses = ", ".join(f"{n} x {status}" for status, n in served["refused_by_status"].items())
    per_call = served["cpu_ms_per_call"]
    return (f"calls: {served['ok']} answered and {served['failed']} failed (both "
            f"recorded), {refused} refused{f' ({statuses})' if refused else ''}, "
            f"{served['disconnected']} abandoned by their client; "
            f"{served['prompt_tokens']} prompt and {served['completion_tokens']} completion "
            f"tokens; CPU {served['cpu_s']:.1f} s"
            + (f", {per_call:.2f} ms per recorded call" if per_call is not None else "")
            + (f"; not counted: the calls of {served['unreported']} worker(s) that did "
               "not report"
               if served.get("unreported") else ""))
