"""Claw-Eval (github.com/claw-eval/claw-eval) run unchanged from a checkout.

The loader (`formats/claw_eval.py`) reads `tasks/<id>/task.yaml` into `spec.ClawEvalTask`.
Per rollout (`rollout.py`): the task's files are copied into the workspace, its mock
services start from the checkout with their own commands and seeds (`services.py`), and a
tool proxy (`toolproxy.py`) routes the task's tools to them and records each call as
Claw-Eval's `ToolDispatch`; inside the agent's sandbox, `bridge.py` offers those tools as an
MCP server (Codex, Claude Code, OpenClaw) and as the `claw-tool` command (`mini`, any
shell). After the agent, the grader's inputs are gathered (`snapshot.py`, `trace.py`) and
the task's own `grader.py` scores them in a subprocess that imports the checkout's
`claw_eval` package (`grading.py`, `grade_main.py`). `survey.py` prints what a checkout
holds and what of it runs here.
"""

from __future__ import annotations

from openforge_claw.claweval.spec import ClawEvalTask, NeedKind

# Why a task is skipped, in the words of the skip report and of docs/claw.md (a task whose
# task.yaml cannot be read is the loader's: `tasks.UNREADABLE`).
SKIP_REASONS: dict[NeedKind, str] = {
    "fixture": "fixture files not in the checkout",
    "real_web": "need the real web (web_real services, SERP_DEV_KEY)",
    "simulated_user": "need a simulated user (multi-turn user_agent)",
    "judge": "need the LLM judge (set judge_base_url and judge_model)",
}


def blocking_need(spec: ClawEvalTask, judged: bool) -> NeedKind | None:
    """The first need of the task that this run cannot meet (None: it runs)."""
    for kind in SKIP_REASONS:
        if spec.need(kind) and not (kind == "judge" and judged):
            return kind
    return None
