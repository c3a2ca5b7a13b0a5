"""MiniWoB++ end to end through the real `openforge run` path: the gateway, the scripted
engine on the tiny multimodal model, the local executor, the gui-agent program, headless
Chromium on the pages of PyPI `miniwob`, the reward read from the page. The right scripts
score 1.0 on every task, the wrong ones 0; the images the gateway stored are the exact
bytes the agent sent, the samples reference them, and the report shows the filmstrip."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from openforge.config import EngineConfig, RunConfig
from openforge.runner import read_results, run_from_config
from openforge.store import Store
from openforge.trajectory import build_samples
from openforge_gui.actions import parse_action
from openforge_gui.miniwob import SAMPLES, MiniWobEnvironment, registered

SOLUTIONS = Path(__file__).parents[1] / "src" / "openforge_gui" / "solutions"


def _run(script: str, runs: Path, tasks: list[str] | None = None) -> Any:
    config = RunConfig(harness="gui-agent", environment="miniwob", reward="checker",
                       tasks=tasks if tasks is not None else [name for name, _, _ in SAMPLES],
                       engine=EngineConfig(name="scripted", model="tiny-vl",
                                           options={"script": str(SOLUTIONS / script)}),
                       runs_dir=runs, concurrency=2, timeout_s=120)
    return run_from_config(config)


@pytest.fixture(scope="module")
def right(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _run("miniwob.yaml", tmp_path_factory.mktemp("right"))


def test_every_registered_task_with_a_fixed_seed() -> None:
    import gymnasium
    import miniwob  # noqa: F401 - registers its environments

    ids = {k.split("/", 1)[1].rsplit("-v", 1)[0] for k in gymnasium.envs.registry
           if k.startswith("miniwob/")}
    tasks = {t.id: t for t in MiniWobEnvironment().tasks()}
    assert set(tasks) == ids == set(registered()) and len(ids) >= 125
    assert all(t.data["seed"] is not None for t in tasks.values())
    assert len(SAMPLES) >= 10 and all(instruction in tasks[name].prompt
                                      for name, _, instruction in SAMPLES)
    assert "375x667" in tasks["flight.AA"].prompt and "160x210" in tasks["click-test"].prompt


def test_scripted_solutions_score_one_on_every_task(right: Any) -> None:
    records = read_results(right.run_dir)
    assert {r.task_id for r in records} == {name for name, _, _ in SAMPLES}
    assert right.metrics.infra_failures == 0
    assert {r.task_id: r.reward for r in records} == {name: 1.0 for name, _, _ in SAMPLES}


def test_wrong_actions_score_zero_on_every_task(tmp_path: Path) -> None:
    summary = _run("miniwob_wrong.yaml", tmp_path)
    records = read_results(summary.run_dir)
    assert summary.metrics.infra_failures == 0 and len(records) == len(SAMPLES)
    assert {r.task_id: r.reward for r in records} == {name: 0.0 for name, _, _ in SAMPLES}
    # MiniWoB itself judged the wrong clicks and texts (-1), not just a missing answer.
    judged = [r for r in records if (r.reward_details or {}).get("done")]
    assert len(judged) >= 6 and all(r.reward_details["raw_reward"] < 0 for r in judged)


def test_stored_images_are_the_bytes_sent_and_samples_reference_them(right: Any) -> None:
    with Store(right.run_dir / "store.sqlite") as store:
        pairs = store.list_results()
        assert len(pairs) == len(SAMPLES)
        for session, result in pairs:
            steps = result.harness_output["transcript"]["steps"]
            calls = store.list_calls(session.id)
            assert len(calls) == len(steps) >= 1
            for step, call in zip(steps, calls, strict=True):
                assert call.images == step["request_images"]
                assert call.images[-1] == step["screenshot_sha256"]
                for sha in call.images:
                    stored = store.get_image(sha)
                    assert stored is not None and stored.media_type == "image/png"
                    assert hashlib.sha256(stored.data).hexdigest() == sha
                    assert stored.data.startswith(b"\x89PNG")
            samples = build_samples(calls).samples
            assert len(samples) == len(steps)  # one training sample per step
            for sample, call in zip(samples, calls, strict=True):
                assert sample.images == call.images


def test_report_shows_the_filmstrip(right: Any) -> None:
    page = (right.run_dir / "report.html").read_text()
    assert page.count("<figure class='frame'>") >= len(SAMPLES)
    assert "one sample per step" in page
    with Store(right.run_dir / "store.sqlite") as store:
        session, result = next((s, r) for s, r in store.list_results() if s.task_id == "enter-text")
        steps = result.harness_output["transcript"]["steps"]
        shot = store.get_image(steps[0]["screenshot_sha256"])
    assert shot is not None
    assert f"data:image/png;base64,{base64.b64encode(shot.data).decode()}" in page
    assert "type(&quot;Jerald&quot;)" in page or 'type("Jerald")' in page  # the model output
    assert "type(text=&quot;Jerald&quot;)" in page  # the parsed action


def test_a_text_only_model_is_refused_before_any_rollout(tmp_path: Path) -> None:
    """gui-agent sends screenshots: with the text-only default model the run stops at once
    with one line that says what to use, rather than failing every rollout with a 400."""
    from openforge.errors import OpenforgeError

    config = RunConfig(harness="gui-agent", environment="miniwob", reward="checker",
                       engine=EngineConfig(name="scripted", model="tiny",
                                           options={"script": str(SOLUTIONS / "miniwob.yaml")}),
                       runs_dir=tmp_path, concurrency=2, timeout_s=120)
    with pytest.raises(OpenforgeError, match="takes text only: use a vision-language model"):
        run_from_config(config)
    assert all(path.read_text() == "" for path in tmp_path.rglob("results.jsonl"))


def test_doing_nothing_scores_zero_on_every_registered_task(tmp_path: Path) -> None:
    """Each registered page opens with its seed, and an agent that does nothing gets 0:
    no MiniWoB task ends (or rewards) by itself once its timer is lifted. One browser per
    page size, each page loaded and started the way `prepare` does it."""
    from openforge_gui.miniwob import MiniWobComputer, size_of

    env = MiniWobEnvironment()
    scored: dict[str, tuple[float, bool]] = {}
    computers: dict[tuple[int, int], MiniWobComputer] = {}
    try:
        for task in env.tasks():
            size = size_of(task.id)
            computer = computers.get(size) or computers.setdefault(
                size, MiniWobComputer(*size, allow_goto=False))
            env.start(computer, task)
            page = computer.page_state()
            assert page["utterance"], task.id  # the page shows an instruction
            verdict = env.check(task, tmp_path, {"miniwob": page})
            scored[task.id] = (verdict.score, bool(page["done"]))
    finally:
        for computer in computers.values():
            computer.close()
        env.close()
    assert set(scored) == set(registered())
    assert {t: v for t, v in scored.items() if v != (0.0, False)} == {}


def test_openforge_run_accepts_any_registered_task(tmp_path: Path) -> None:
    script = tmp_path / "nothing.yaml"
    script.write_text('- replies:\n    - content: "answer(\\"done\\")"\n')
    tasks = ["flight.AA", "email-inbox-nl-turk", "book-flight", "use-colorwheel-2"]
    config = RunConfig(harness="gui-agent", environment="miniwob", reward="checker", tasks=tasks,
                       engine=EngineConfig(name="scripted", model="tiny-vl",
                                           options={"script": str(script)}),
                       runs_dir=tmp_path, concurrency=2, timeout_s=120)
    records = read_results(run_from_config(config).run_dir)
    assert {r.task_id: (r.status, r.reward) for r in records} == {t: ("ok", 0.0) for t in tasks}


def test_a_browser_that_crashed_scores_zero_not_an_error(tmp_path: Path) -> None:
    """Chromium killed under a MiniWoB episode (as a crash would): the step that finds it
    gone ends the episode, and the final state is scored 0 instead of raising (which would
    make the attempt an environment error, never scored)."""
    import psutil

    env = MiniWobEnvironment()
    task = next(t for t in env.tasks() if t.id == "click-test")
    env.prepare(task, tmp_path)
    try:
        assert env.episode is not None
        assert env.episode.act(parse_action("scroll(10, 10, 0, 10)")).ok
        for proc in psutil.Process().children(recursive=True):
            if "chrom" in proc.name():
                proc.kill()
        result = env.episode.act(parse_action("click(80, 120)"))
        state = env.final_state(task, tmp_path)
    finally:
        env.close()
    assert result.done and not result.ok and "browser is gone" in (result.error or "")
    assert state["episode"]["ended_by"] == "screen_gone" and "gone" in state["screen_gone"]
    verdict = env.check(task, tmp_path, state)
    assert verdict.score == 0.0 and not verdict.details["done"]
