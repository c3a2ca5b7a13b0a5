"""Agent behaviours in a run report: leaderboard pass^k / pass@k, failure categories, tool
coverage per harness, and the behaviours the OpenForgeRL analysis looks at.

- **pass^k / pass@k** the leaderboard way (Claw-Eval's `all_pass` / `any_pass`): per task,
  its first k trials, missing, infrastructure-failed and plugin-error trials counted as
  failures; pass^k = all k passed, pass@k = any passed. (The report's `pass_at_k` /
  `pass_hat_k` are the unbiased estimators over scored attempts; with exactly k scored
  attempts per task the two agree, and the section says how many trials it counted as
  failures for want of a score.)
- **Claw-Eval's per-task estimators**, in runs scored by Claw-Eval's graders (reward details
  `benchmark: claw-eval`): its `compute_pass_at_k` / `compute_pass_hat_k`
  (`src/claw_eval/models/scoring.py`) over each task's scored trials (n, c passed; its
  cli leaves errored trials out, as this leaves out unscored ones): pass@k = 1 - C(n-c, k)
  / C(n, k) (0 when k > n), pass^k = (c/n)^k, a task without a scored trial 0; the mean
  over tasks for k = 1..k. Its cli prints pass@1 and pass^n per task; the all/any counts
  above are its batch summary.
- **failure categories** per attempt: `timeout`, `infra_error` and `plugin_error` from the
  rollout status;
  otherwise the reward's own `details["category"]` (`tool_error`, `wrong_final_state`,
  `unsafe_action`, ...), `wrong_final_state` when a failed attempt has none, `tool_error`
  for a harness error without one.
- **tool coverage** per harness: the tools offered in the recorded requests and how often
  the policy called each.
- **behaviours** (heuristics over the recorded calls): self-verification (the last tool
  call inspects rather than changes: cat, ls, grep, test, a GET, running a script),
  error recovery (of the attempts whose tool results show an error, the share that still
  passed), plan completion (mean `completion` the reward reported, over `plan` tasks when
  there are any).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from openforge.types import SCORED_STATUSES, Call

_INSPECT = re.compile(r"^\s*(cat|ls|head|tail|grep|test|diff|wc|find|python3? \S+\.py\s*$)"
                      r"|curl -s(?!.*-X)|\bGET\b", re.IGNORECASE)
_TOOL_ERROR = re.compile(r"\berror\b|exit code [1-9]|traceback|\"status\": [45]\d\d|"
                         r"\b(40[0-9]|5\d\d) [A-Z]", re.IGNORECASE)


def failure_category(attempt: dict[str, Any]) -> str | None:
    status = attempt.get("status")
    if status not in SCORED_STATUSES:  # timeout, infra_error, plugin_error
        return str(status)
    if attempt.get("passed"):
        return None
    category = (attempt.get("reward_details") or {}).get("category")
    if category:
        return str(category)
    return "tool_error" if status == "harness_error" else "wrong_final_state"


def offered_tools(call: Call) -> list[str]:
    names = []
    for tool in (call.request or {}).get("tools") or []:
        if isinstance(tool, dict):
            name = (tool.get("function") or {}).get("name") or tool.get("name")
            if name:
                names.append(str(name))
    return names


def used_tools(call: Call) -> list[tuple[str, str]]:
    """(name, arguments text) of the tool calls the policy made in this call."""
    from openforge.report import response_parts

    out = []
    for text in response_parts(call)[2]:
        name, _, args = text.partition("(")
        out.append((name, args.rstrip(")")))
    return out


def _tool_results(calls: list[Call]) -> list[str]:
    from openforge.report import request_messages

    if not calls:
        return []
    return [text for role, text, _ in request_messages(calls[-1]) if role == "tool"]


def claw_eval_estimators(by_task: dict[str, list[dict[str, Any]]], k: int) -> dict[str, Any]:
    """Claw-Eval's per-task pass@k and pass^k estimators, mean over tasks (module doc)."""
    counts = []
    for attempts in by_task.values():
        scored = [a for a in attempts if a["status"] in SCORED_STATUSES]
        counts.append((len(scored), sum(bool(a["passed"]) for a in scored)))

    def at(n: int, c: int, i: int) -> float:
        return 1.0 - math.comb(n - c, i) / math.comb(n, i) if 0 < i <= n else 0.0

    def hat(n: int, c: int, i: int) -> float:
        return (c / n) ** i if n else 0.0

    t = len(counts) or 1
    return {"tasks": len(counts),
            "pass_at_k": {str(i): sum(at(n, c, i) for n, c in counts) / t
                          for i in range(1, k + 1)},
            "pass_hat_k": {str(i): sum(hat(n, c, i) for n, c in counts) / t
                           for i in range(1, k + 1)}}


def analyse(data: dict[str, Any], calls: dict[str, list[Call]]) -> dict[str, Any]:
    """The behaviours section of a report dict (`build_report`'s) and its recorded calls."""
    k = int(data["summary"]["k"])
    harness = str((data.get("config") or {}).get("harness") or "?")
    by_task: dict[str, list[dict[str, Any]]] = {}
    for attempt in data["attempts"]:
        by_task.setdefault(attempt["task_id"], []).append(attempt)

    per_task: list[dict[str, Any]] = []
    for task_id, attempts in by_task.items():
        trials = [bool(a["passed"]) for a in sorted(attempts, key=lambda a: a["attempt"])][:k]
        trials += [False] * (k - len(trials))
        per_task.append({"task_id": task_id, "trials": trials, "pass_hat_k": all(trials),
                         "pass_at_k": any(trials)})
    n = len(per_task) or 1
    unscored = sum(1 for a in data["attempts"] if a["status"] not in SCORED_STATUSES)

    categories: Counter[str] = Counter()
    offered: set[str] = set()
    used: Counter[str] = Counter()
    verified = with_tools = errored = recovered = 0
    completions: list[float] = []
    plan_completions: list[float] = []
    for attempt in data["attempts"]:
        category = failure_category(attempt)
        if category:
            categories[category] += 1
        details = attempt.get("reward_details") or {}
        if isinstance(details.get("completion"), int | float):
            completions.append(float(details["completion"]))
            if details.get("task_category") == "plan":
                plan_completions.append(float(details["completion"]))
        session_calls = calls.get(attempt.get("session_id") or "", [])
        tool_calls = [t for call in session_calls for t in used_tools(call)]
        for call in session_calls:
            offered.update(offered_tools(call))
        used.update(name for name, _ in tool_calls)
        if tool_calls:
            with_tools += 1
            if len(tool_calls) >= 2 and _INSPECT.search(tool_calls[-1][1].replace('\\"', '"')
                                                         .split('"command": "')[-1]):
                verified += 1
        if any(_TOOL_ERROR.search(text) for text in _tool_results(session_calls)):
            errored += 1
            recovered += bool(attempt.get("passed"))

    coverage = len(set(used) & offered) / len(offered) if offered else None
    plan = plan_completions or completions
    claw_eval = any((a.get("reward_details") or {}).get("benchmark") == "claw-eval"
                    for a in data["attempts"])
    return {
        "k": k,
        "pass_hat_k": {str(k): sum(bool(t["pass_hat_k"]) for t in per_task) / n},
        "pass_at_k": {str(k): sum(bool(t["pass_at_k"]) for t in per_task) / n},
        "claw_eval_estimators": claw_eval_estimators(by_task, k) if claw_eval else None,
        "per_task": per_task,
        "unscored_trials": unscored,
        "failure_categories": dict(sorted(categories.items())),
        "tool_coverage": {harness: {"offered": sorted(offered), "used": dict(used.most_common()),
                                    "coverage": coverage}},
        "behaviours": {
            "self_verification": verified / with_tools if with_tools else None,
            "error_recovery": recovered / errored if errored else None,
            "attempts_with_tool_errors": errored,
            "plan_completion": sum(plan) / len(plan) if plan else None,
        },
    }


def behaviours_html(b: dict[str, Any] | None) -> str:
    """The report page's section for `analyse`'s result."""
    import html

    if not b:
        return ""

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))

    k = str(b["k"])
    rows = "".join(f"<tr><td>{html.escape(t['task_id'])}</td><td>"
                   f"{''.join('&#10003;' if x else '&#10007;' for x in t['trials'])}</td>"
                   f"<td>{'yes' if t['pass_hat_k'] else 'no'}</td>"
                   f"<td>{'yes' if t['pass_at_k'] else 'no'}</td></tr>" for t in b["per_task"])
    cats = ", ".join(f"{html.escape(c)}: {n}" for c, n in b["failure_categories"].items())
    tools = "".join(f"<tr><td>{html.escape(h)}</td><td>{fmt(v['coverage'])}</td><td>"
                    + html.escape(", ".join(f"{t} x{n}" for t, n in v["used"].items()))
                    + "</td></tr>" for h, v in b["tool_coverage"].items())
    beh = b["behaviours"]
    unscored = b.get("unscored_trials", 0)
    estimators = ""
    if b.get("claw_eval_estimators"):
        e = b["claw_eval_estimators"]
        figures = ", ".join(f"pass@{i} {fmt(e['pass_at_k'][i])} / pass^{i} "
                            f"{fmt(e['pass_hat_k'][i])}" for i in e["pass_at_k"])
        estimators = (f"<p>Claw-Eval's per-task estimators (its models/scoring.py, over each "
                      f"task's scored trials: pass@k = 1 - C(n-c,k)/C(n,k), pass^k = (c/n)^k; "
                      f"mean over {e['tasks']} tasks): {figures}.</p>")
    return (f"<h2>Behaviours</h2><p>Counted the leaderboard way: every trial, the "
            f"{unscored} not scored (plugin errors, infrastructure failures) as failed. "
            f"pass^{k} (all {k} trials pass) {fmt(b['pass_hat_k'][k])}, "
            f"pass@{k} (any passes) {fmt(b['pass_at_k'][k])}. Failure categories: "
            f"{cats or 'none'}.</p>{estimators}<p>Self-verification {fmt(beh['self_verification'])}, "
            f"error recovery {fmt(beh['error_recovery'])} (over "
            f"{beh['attempts_with_tool_errors']} attempts with tool errors), plan completion "
            f"{fmt(beh['plan_completion'])}.</p>"
            f"<table><tr><th>harness</th><th>tool coverage</th><th>tools used</th></tr>{tools}"
            f"</table><table><tr><th>task</th><th>trials</th><th>pass^{k}</th>"
            f"<th>pass@{k}</th></tr>{rows}</table>")
