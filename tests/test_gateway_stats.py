"""The gateway's served counters: adding a pool's workers up, and the line `serve` prints."""

from __future__ import annotations

from openforge.gateway.stats import GatewayStats, add_up, summary_line


def _snapshot(ok: int, failed: int, refused: dict[int, int], cpu_s: float) -> dict[str, object]:
    stats = GatewayStats()
    stats.ok, stats.failed = ok, failed
    stats.refused.update(refused)
    snap = stats.snapshot()
    snap["cpu_s"] = cpu_s  # a fixed figure, as a worker's health route would answer it
    return snap


def test_a_pools_workers_add_up_and_a_silent_one_is_named() -> None:
    a = _snapshot(3, 1, {400: 2}, 0.5)
    b = _snapshot(5, 0, {400: 1, 421: 4}, 0.3)
    total = add_up([a, b], workers=2)
    assert (total["ok"], total["failed"], total["refused"]) == (8, 1, 7)
    assert total["refused_by_status"] == {"400": 3, "421": 4}
    assert total["cpu_s"] == 0.8 and total["cpu_ms_per_call"] == round(800 / 9, 3)
    assert total["unreported"] == 0
    line = summary_line(total)
    assert line.startswith("calls: 8 answered and 1 failed (both recorded), 7 refused "
                           "(3 x 400, 4 x 421), 0 abandoned by their client; ")
    assert line.endswith("CPU 0.8 s, 88.89 ms per recorded call")
    # One worker did not answer: the line says its calls are missing, not that none came.
    partial = summary_line(add_up([a], workers=2))
    assert partial.endswith("; not counted: the calls of 1 worker(s) that did not report")
    assert summary_line(add_up([], workers=2)).startswith("calls: 0 answered")
    assert add_up([], workers=2)["cpu_ms_per_call"] is None


def test_a_process_that_served_nothing_reports_no_cpu_per_call() -> None:
    snap = GatewayStats().snapshot()
    assert snap["cpu_ms_per_call"] is None and snap["refused_by_status"] == {}
    assert "ms per recorded call" not in summary_line(snap)
