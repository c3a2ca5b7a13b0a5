"""The harness-native training recipe with the real Codex CLI (`nox -s e2e`), at toy size:
`openforge train --recipe demo --set harness=codex`.

The scripted teacher's demonstrations go through Codex (its own `exec_command` tool, its
Responses wire format, its environment context); SFT trains on the samples built from
that recorded traffic, and GRPO's rollouts and the evaluations run through Codex too, on
the policy served by the `local` engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from harness_plugins import with_path

from openforge.store import Store


def test_the_demo_recipe_trains_on_codexs_own_traffic(codex_site: Path, tmp_path: Path) -> None:
    out = tmp_path / "codex-demo"
    argv = [sys.executable, "-m", "openforge.cli", "train", "--recipe", "demo",
            "--set", f"output_dir={out}", "--set", "harness=codex",
            "--set", "families=[clean,tally]", "--set", "train_per_family=2",
            "--set", "validation_per_family=1", "--set", "test_per_family=1",
            "--set", "sft_epochs=2", "--set", "grpo_steps=1", "--set", "tasks_per_step=2",
            "--set", "k=2", "--set", "eval_k=1"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=with_path(codex_site), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["harness"] == "codex"
    teacher = summary["traffic"]["teacher"]
    # Each demonstration: Codex's tool-call turn and its answer, merged into one sample.
    assert teacher["calls"] == 8 and teacher["calls_per_sample"] == 2.0
    # The preset fits Codex's prompt into the 4-layer model's 4,096-token context.
    assert 1000 < teacher["prompt_tokens_per_call"] < 4096 - 48

    with Store(out / "teacher" / "store.sqlite") as store:
        calls = [c for c in store.iter_calls() if c.status == "ok"]
    assert {c.dialect for c in calls} == {"responses"}
    first = calls[0].request["input"][0]["content"][0]["text"]
    assert first.startswith("You are a coding agent in a workspace.")
    # What SFT trained on is the token sequence Codex's traffic produced: each sample is a
    # session's last call's prompt followed by its completion, exactly as recorded.
    rows = pq.read_table(out / "demos-samples" / "data.parquet").to_pylist()
    assert len(rows) == 4
    recorded = {tuple(c.prompt_ids + c.completion_ids) for c in calls if c.index == 1}
    for row in rows:
        assert tuple(row["prompt_ids"] + row["response_ids"]) in recorded

    with Store(out / "rollouts" / "store.sqlite") as store:
        rollout_calls = list(store.iter_calls())
        versions = {c.weight_version for c in store.iter_calls(run_id="validation-final")}
    assert rollout_calls and {c.dialect for c in rollout_calls} == {"responses"}
    assert versions == {"1"}  # the final evaluation ran on the weights GRPO's step pushed
