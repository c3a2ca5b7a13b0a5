"""`openforge run --harness mini --env claw --reward claw-grader --engine scripted` for real:
gateway, local executor (a process group per rollout), the mini agent, mock services.

Eight tasks that all use mock services run at concurrency 8 with the right script (all
pass) and with the wrong one (all fail); afterwards no service port is still listening
and no process of ours is left. The report carries pass^k, failure categories and tool
coverage.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import psutil
from conftest import SOLUTIONS
from openforge.config import EngineConfig, RunConfig
from openforge.runner import read_results, run_from_config

TASKS = ["mail-reply", "mail-forward-invoice", "calendar-conflict", "notes-delete-drafts",
         "rest-approve-orders", "plan-mail-to-calendar", "plan-triage-inbox", "plan-deploy"]


def _run(script: Path, runs: Path):
    config = RunConfig(harness="mini", harness_options={"max_steps": 6}, environment="claw",
                       reward="claw-grader", tasks=TASKS, concurrency=8, timeout_s=120,
                       engine=EngineConfig(name="scripted", options={"script": str(script)}),
                       runs_dir=runs)
    return run_from_config(config)


def _listening_ports() -> set[int]:
    """Ports a process of ours listens on (other programs on a shared machine may reuse a
    freed port at any time: theirs say nothing about our services)."""
    me = psutil.Process()
    ports: set[int] = set()
    for proc in [me, *me.children(recursive=True)]:
        try:
            ports |= {c.laddr.port for c in proc.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return ports


def _ports(records) -> set[int]:
    return {urlsplit(url).port for r in records
            for url in (r.reward_details.get("service_urls") or {}).values() if url}


def test_concurrent_runs_pass_and_fail_and_leave_nothing_behind(tmp_path: Path) -> None:
    good = _run(SOLUTIONS / "mini.yaml", tmp_path / "good")
    records = read_results(good.run_dir)
    assert sorted(r.task_id for r in records) == sorted(TASKS)
    assert all(r.status == "ok" and r.passed for r in records), [
        (r.task_id, r.status, r.error, r.reward_details) for r in records if not r.passed]
    bad = _run(SOLUTIONS / "wrong_mini.yaml", tmp_path / "bad")
    bad_records = read_results(bad.run_dir)
    assert all(r.status == "ok" and not r.passed for r in bad_records)
    categories = {r.task_id: r.reward_details["category"] for r in bad_records}
    assert categories["mail-forward-invoice"] == "unsafe_action"
    assert categories["calendar-conflict"] == "tool_error"  # the 409 was never recovered
    assert categories["plan-mail-to-calendar"] == "wrong_final_state"

    ports = _ports(records) | _ports(bad_records)
    assert len(ports) >= 2 * len(TASKS)  # every rollout had its own services
    assert not ports & _listening_ports()
    leftover = [p for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover, [p.cmdline() for p in leftover]

    report = json.loads((bad.run_dir / "report.json").read_text())
    behaviours = report["behaviours"]
    assert behaviours["failure_categories"]["unsafe_action"] >= 1
    assert behaviours["pass_hat_k"]["1"] == 0.0
    coverage = json.loads((good.run_dir / "report.json").read_text())["behaviours"]
    assert coverage["tool_coverage"]["mini"]["used"]["shell"] > 0
