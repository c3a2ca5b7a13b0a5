"""Recorded calls -> samples: the turn tree, masks, retries, metrics (unit + property tests)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.model import ModelBundle
from openforge.gateway.server import Gateway
from openforge.store import Store
from openforge.trajectory import (
    HISTORY_REWRITTEN,
    SIDE_CALL,
    RunMetrics,
    build_samples,
    iter_session_calls,
    run_metrics,
)
from openforge.types import Call, RewardResult, RolloutResult, Sample, Session

IM_END = 151645  # ChatML end-of-message, ends every completion that stopped


def call(cid: str, index: int, prompt: list[int], completion: list[int], **kw: object) -> Call:
    fields: dict[str, object] = {
        "id": cid, "session_id": "s", "index": index, "prompt_ids": prompt,
        "completion_ids": completion, "logprobs": [-0.1 * (i + 1) for i in range(len(completion))],
        "finish_reason": "stop",
    }
    fields.update(kw)
    return Call(**fields)


def check_sample_against_calls(sample: Sample, by_id: dict[str, Call]) -> None:
    """The invariants every sample must satisfy, whatever the tree looked like."""
    seq = sample.prompt_ids + sample.response_ids
    calls = [by_id[c] for c in sample.call_ids]
    last = calls[-1]
    assert seq == last.prompt_ids + last.completion_ids
    assert len(sample.response_mask) == len(sample.response_ids) == len(sample.response_logprobs)
    assert sample.prompt_ids == calls[0].prompt_ids
    expected_mask = [0] * len(sample.response_ids)
    expected_lp = [0.0] * len(sample.response_ids)
    base = len(sample.prompt_ids)
    for c in calls:
        # every call of the sample is a prefix of its sequence: no sample spans two branches
        assert seq[: len(c.prompt_ids) + len(c.completion_ids)] == c.prompt_ids + c.completion_ids
        start = len(c.prompt_ids) - base
        for i, lp in enumerate(c.logprobs):
            expected_mask[start + i] = 1
            expected_lp[start + i] = lp
    assert sample.response_mask == expected_mask
    assert sample.response_logprobs == expected_lp
    assert sample.num_turns == len(calls)


# -- unit tests --------------------------------------------------------------------------

SYS = [151644, 8948, 198, 5, 6, 7, IM_END, 198]  # <|im_start|>system\n ... <|im_end|>\n
USER = [151644, 872, 198, 11, 12, 13, IM_END, 198, 151644, 77091, 198]  # user turn + assistant header


def test_linear_tool_conversation_merges_into_one_sample() -> None:
    p0 = SYS + USER
    c0 = [21, 22, IM_END]
    obs1 = [198, 151644, 872, 198, 31, 32, IM_END, 198, 151644, 77091, 198]
    p1 = p0 + c0 + obs1
    c1 = [41, IM_END]
    p2 = p1 + c1 + obs1
    c2 = [51, 52, 53, IM_END]
    calls = [call("a", 0, p0, c0), call("b", 1, p1, c1), call("c", 2, p2, c2)]
    result = build_samples(calls, Session(id="s", token="t", rollout_id="r", task_id="task",
                                          reward=0.5, weight_version="w7"))
    [sample] = result.samples
    check_sample_against_calls(sample, {c.id: c for c in calls})
    assert sample.response_ids == c0 + obs1 + c1 + obs1 + c2
    assert sample.response_mask == [1] * 3 + [0] * 11 + [1] * 2 + [0] * 11 + [1] * 4
    assert sample.reward == 0.5 and sample.rollout_id == "r" and sample.task_id == "task"
    assert sample.call_ids == ["a", "b", "c"] and sample.num_turns == 3
    assert sample.weight_versions == ["w7", "w7", "w7"]
    assert sample.branch_reason is None and sample.exact_tokens
    m = result.metrics
    assert (m.samples, m.merged_calls, m.branches_opened, m.generated_tokens) == (1, 2, {}, 9)
    assert m.observation_tokens == 22


def test_rewritten_history_opens_a_branch_with_the_reason() -> None:
    p0 = SYS + USER
    c0 = [21, IM_END]
    p1 = p0 + c0 + [198, 151644, 872, 198, 31, IM_END, 198, 151644, 77091, 198]
    c1 = [41, IM_END]
    # compaction: same system prompt and task, the middle replaced by a summary
    p2 = p0 + [99, 98, IM_END, 198, 151644, 77091, 198]
    c2 = [61, IM_END]
    p3 = p2 + c2 + [198, 7, IM_END]
    calls = [call("a", 0, p0, c0), call("b", 1, p1, c1), call("c", 2, p2, c2),
             call("d", 3, p3, [71, IM_END])]
    result = build_samples(calls)
    assert [s.call_ids for s in result.samples] == [["a", "b"], ["c", "d"]]
    assert [s.branch_reason for s in result.samples] == [None, HISTORY_REWRITTEN]
    assert result.metrics.branches_opened == {HISTORY_REWRITTEN: 1}
    for s in result.samples:
        check_sample_against_calls(s, {c.id: c for c in calls})


def test_side_call_with_other_task_and_gateway_reason_hint() -> None:
    main0 = call("a", 0, SYS + USER, [21, IM_END],
                 request={"messages": [{"role": "system"}, {"role": "user"}]})
    title = call("t", 1, [151644, 8948, 198, 900, IM_END, 198, 151644, 872, 198, 901, IM_END],
                 [902, IM_END], request={"messages": [{"role": "system"}, {"role": "user"}]})
    sub = call("u", 2, SYS + [151644, 872, 198, 77, IM_END], [78, IM_END],
               branch_reason="subagent")
    main1 = call("b", 3, SYS + USER + [21, IM_END] + [198, 5], [22, IM_END])
    result = build_samples([main0, title, sub, main1])
    assert [s.call_ids for s in result.samples] == [["a", "b"], ["t"], ["u"]]
    assert [s.branch_reason for s in result.samples] == [None, SIDE_CALL, "subagent"]
    assert result.metrics.branches_opened == {SIDE_CALL: 1, "subagent": 1}


def test_retries_and_failed_calls_are_merged_and_counted() -> None:
    p0 = SYS + USER
    failed = call("f", 0, p0, [], status="failed", error="engine down")
    first = call("a", 1, p0, [21, IM_END], body_digest="d0")
    # SDK retry after a client timeout: same body, a different sample; the harness saw this one
    retry = call("a2", 2, p0, [25, 26, IM_END], body_digest="d0", retry_count=1)
    nxt = call("b", 3, p0 + [25, 26, IM_END, 198, 3], [27, IM_END], body_digest="d1")
    # a retry recognized by its prompt alone (its digest differs: e.g. a changed timestamp)
    nxt_retry = call("b2", 4, nxt.prompt_ids, [28, IM_END], body_digest="d2", retry_count=1)
    calls = [failed, first, retry, nxt, nxt_retry]
    result = build_samples(calls)
    [sample] = result.samples
    assert sample.call_ids == ["a2", "b2"]
    check_sample_against_calls(sample, {c.id: c for c in calls})
    m = result.metrics
    assert (m.failed_calls, m.retries_merged, m.calls_used, m.calls_recorded) == (1, 2, 2, 5)


def test_same_prompt_without_retry_marker_is_a_separate_call() -> None:
    p0 = SYS + USER
    calls = [call("a", 0, p0, [21, IM_END], body_digest="x"),
             call("b", 1, p0, [22, IM_END], body_digest="y")]
    result = build_samples(calls)
    assert [s.call_ids for s in result.samples] == [["a"], ["b"]]
    assert result.samples[1].branch_reason == HISTORY_REWRITTEN


def test_calls_are_ordered_by_index_and_gateway_branch_labels_ignored() -> None:
    p0 = SYS + USER
    a = call("a", 0, p0, [21, IM_END], branch=3)
    b = call("b", 1, p0 + [21, IM_END, 9], [22, IM_END], branch=7, branch_reason="bogus")
    result = build_samples([b, a])
    [sample] = result.samples
    assert sample.call_ids == ["a", "b"] and sample.branch == 0


def test_missing_logprobs_and_inexact_calls() -> None:
    p0 = SYS + USER
    a = call("a", 0, p0, [21, 22, IM_END], logprobs=[], exact_tokens=False)
    [sample] = build_samples([a]).samples
    assert sample.response_logprobs == [0.0, 0.0, 0.0]
    assert sample.response_mask == [1, 1, 1]
    assert not sample.exact_tokens


def test_empty_session() -> None:
    result = build_samples([], Session(id="s", token="t"))
    assert result.samples == [] and result.metrics.samples == 0


def test_sample_images_are_the_ordered_images_of_its_sequence() -> None:
    # Each call's prompt extends the last, and so do its images: the sample holds the last
    # call's list, repeats kept (the same screenshot twice is two placeholder runs).
    p0 = SYS + USER
    a = call("a", 0, p0, [21, IM_END], images=["img1"])
    b = call("b", 1, p0 + [21, IM_END, 5], [22, IM_END], images=["img1", "img2"])
    c = call("c", 2, p0 + [21, IM_END, 5, 22, IM_END, 6], [23, IM_END],
             images=["img1", "img2", "img1"])
    [sample] = build_samples([a, b, c]).samples
    assert sample.images == ["img1", "img2", "img1"]


def test_sample_images_never_drop_a_referenced_image() -> None:
    p0 = SYS + USER
    a = call("a", 0, p0, [21, IM_END], images=["img1", "img2"])
    b = call("b", 1, p0 + [21, IM_END, 5], [22, IM_END], images=["img2", "img3"])
    [sample] = build_samples([a, b]).samples
    assert sample.images == ["img1", "img2", "img3"]


def test_branches_keep_their_own_images() -> None:
    p0 = SYS + USER
    a = call("a", 0, p0, [21, IM_END], images=["img1"])
    side = call("b", 1, [1, 2, 3], [22, IM_END], images=["img9"])
    first, second = build_samples([a, side]).samples
    assert first.images == ["img1"] and second.images == ["img9"]


def test_run_metrics_from_a_store(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        for sid, n_extra in (("s1", 0), ("s2", 1)):
            store.create_session(Session(id=sid, token=f"t{sid}", run_id="run"))
            p0 = SYS + USER
            store.add_call(call(f"{sid}-a", 0, p0, [21, IM_END]).model_copy(
                update={"session_id": sid}))
            store.add_call(call(f"{sid}-b", 1, p0 + [21, IM_END, 4], [22, IM_END],
                                exact_tokens=False).model_copy(update={"session_id": sid}))
            if n_extra:
                store.add_call(call(f"{sid}-t", 2, [151644, 1, IM_END], [3, IM_END]).model_copy(
                    update={"session_id": sid}))
                store.add_call(call(f"{sid}-f", 3, [1], [], status="failed").model_copy(
                    update={"session_id": sid}))
        store.set_reward("s1", 1.0)
        store.save_result("s2", RolloutResult(rollout_id="r2", reward=RewardResult(
            score=0.25, passed=False)))
        metrics = run_metrics(store, "run")
        assert isinstance(metrics, RunMetrics)
        assert (metrics.sessions, metrics.samples, metrics.failed_calls) == (2, 3, 1)
        assert metrics.samples_per_session == 1.5
        assert metrics.merged_calls == 2
        assert metrics.calls_per_sample == 5 / 3  # the merge rate every report shows
        assert metrics.branches_opened == {SIDE_CALL: 1}
        assert metrics.exact_token_fraction == 3 / 5
        assert metrics.mean_generated_tokens_per_sample == 10 / 3  # 5 calls x 2 ids
        assert metrics.summary()["samples_per_session"] == 1.5
        assert [sid for sid, _ in iter_session_calls(store, "run")] == ["s1", "s2"]
        from openforge.trajectory import iter_trajectories
        rewards = {s.id: r.samples[0].reward for s, r in iter_trajectories(store, "run")}
        assert rewards == {"s1": 1.0, "s2": 0.25}


# -- property tests ----------------------------------------------------------------------


@dataclass
class Generated:
    """A generated session plus the ground truth the generator knows."""

    calls: list[Call] = field(default_factory=list)
    branch_of: dict[str, int] = field(default_factory=dict)  # call id -> true branch
    expected_ids: set[str] = field(default_factory=set)  # ok calls that survive dedup


@st.composite
def sessions(draw: st.DrawFn) -> Generated:
    """Tree-shaped call sequences: extend a branch, fork, start anew, retry, fail.

    Every completion and every observation starts with a token used nowhere else, and a
    fork puts a fresh token right after the shared prefix, so the true tree is unambiguous.
    """
    fresh = itertools.count(200_000)
    words = st.lists(st.integers(0, 50), max_size=6)
    gen = Generated()
    tips: list[tuple[list[int], str]] = []  # branch -> (its sequence, tip call id)
    tip_call: dict[str, Call] = {}
    extended: set[str] = set()  # calls another call has built on (no longer retryable)
    for index in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(["extend", "extend", "new", "fork", "retry", "fail"]))
        if not tips:
            op = "new"
        retry_of: Call | None = None
        if op == "extend":
            b = draw(st.integers(0, len(tips) - 1))
            prompt = tips[b][0] + [next(fresh)] + draw(words)
            extended.add(tips[b][1])
        elif op == "fork":
            b = draw(st.integers(0, len(tips) - 1))
            seq = tips[b][0]
            cut = draw(st.integers(1, len(seq) - 1))  # a full cut would be an extension
            prompt = seq[:cut] + [next(fresh)] + draw(words)
        elif op == "retry":
            b = draw(st.integers(0, len(tips) - 1))
            retry_of = tip_call[tips[b][1]]
            if retry_of.id in extended:
                op, prompt = "new", [next(fresh)] + draw(words)
            else:
                prompt = list(retry_of.prompt_ids)
        else:
            prompt = [next(fresh)] + draw(words)
        completion = [next(fresh)] + draw(words)
        cid = f"c{index}"
        kw: dict[str, object] = {}
        if op == "fail":
            kw = {"status": "failed", "completion_ids": [], "logprobs": []}
        elif retry_of is not None:
            by_digest = draw(st.booleans())
            kw = {"retry_count": 1 if not by_digest else draw(st.integers(0, 2)),
                  "body_digest": retry_of.body_digest if by_digest else f"d{cid}"}
        else:
            kw = {"body_digest": f"d{cid}"}
        c = call(cid, index, prompt, completion, **kw)
        gen.calls.append(c)
        if op == "fail":
            continue
        if op == "retry" and retry_of is not None:
            b = gen.branch_of[retry_of.id]
            gen.expected_ids.discard(retry_of.id)
            tips[b] = (prompt + completion, cid)
        elif op == "extend":
            tips[b] = (prompt + completion, cid)
        else:
            b = len(tips)
            tips.append((prompt + completion, cid))
        gen.branch_of[cid] = b
        gen.expected_ids.add(cid)
        tip_call[cid] = c
    return gen


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.randoms(use_true_random=False))
def test_property_samples_are_exact_branches(gen: Generated, rnd: object) -> None:
    shuffled = list(gen.calls)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]  # order comes from the index, not the list
    result = build_samples(shuffled, reward=1.0)
    by_id = {c.id: c for c in gen.calls}
    seen: list[str] = []
    for sample in result.samples:
        check_sample_against_calls(sample, by_id)
        seen.extend(sample.call_ids)
        # no sample spans two true branches
        assert len({gen.branch_of[c] for c in sample.call_ids}) == 1
        assert sample.reward == 1.0
    # every ok, non-superseded call lands in exactly one sample
    assert sorted(seen) == sorted(gen.expected_ids)
    # merging is maximal: one sample per true branch that kept a call
    assert len(result.samples) == len({gen.branch_of[c] for c in gen.expected_ids})
    m = result.metrics
    assert m.calls_used == len(gen.expected_ids)
    assert m.failed_calls == sum(1 for c in gen.calls if c.status == "failed")
    assert m.calls_used + m.retries_merged + m.failed_calls == len(gen.calls)
    assert m.generated_tokens == sum(sum(s.response_mask) for s in result.samples)


# -- sessions recorded through the real gateway ------------------------------------------

SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}


async def _gateway(store: Store, bundle: ModelBundle, engine: str, **options: object) -> Gateway:
    eng = plugins.create("engine", engine, model=bundle, **options)
    gw = Gateway(GatewayConfig(), EngineConfig(name=engine), store, engine=eng, bundle=bundle)
    await gw.start()
    return gw


async def _tool_turns(c: openai.AsyncOpenAI, messages: list[dict[str, Any]], n: int) -> None:
    """`n` harness-like turns: call the model, run its tool call, append the result."""
    for i in range(n):
        r = await c.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
        msg = r.choices[0].message
        if not msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content})
            return
        messages.append({"role": "assistant", "content": msg.content or "",
                         "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"output {i}"})


async def test_recorded_tool_session_merges_and_rewrite_branches(
        tmp_path: Path, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    store = Store(tmp_path / "store.sqlite")
    replies = ([{"tool_calls": [{"name": "shell", "arguments": {"cmd": f"step {i}"}}]}
                for i in range(9)] + [{"content": "All done."}])
    gw = await _gateway(store, tiny_bundle, "scripted", replies=list(replies) * 2)
    try:
        linear = gw.open_session(run_id="run", rollout_id="r1")
        c = openai.AsyncOpenAI(base_url=gw.session_url(linear), api_key=linear.token)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                          {"role": "user", "content": "do ten steps"}]
        await _tool_turns(c, messages, 10)
        await c.close()
        assert messages[-1]["content"] == "All done."

        rewritten = gw.open_session(run_id="run", rollout_id="r2")
        c = openai.AsyncOpenAI(base_url=gw.session_url(rewritten), api_key=rewritten.token)
        messages = [{"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": "do ten steps"}]
        await _tool_turns(c, messages, 4)
        # compaction: keep the task, summarize the middle, carry on
        compacted = messages[:2] + [{"role": "user", "content": "summary: 4 steps ran"}]
        await _tool_turns(c, compacted, 6)
        # a title call on the side: its own system prompt and question, no tools
        await c.chat.completions.create(model="policy", messages=[
            {"role": "system", "content": "Write a short title."},
            {"role": "user", "content": "do ten steps"}])
        await c.close()
    finally:
        await gw.stop()

    calls = store.list_calls(linear.id)
    result = build_samples(calls, store.get_session(linear.id))
    [sample] = result.samples
    assert sample.num_turns == 10 and sample.call_ids == [c.id for c in calls]
    check_sample_against_calls(sample, {c.id: c for c in calls})
    assert sum(sample.response_mask) == sum(len(c.completion_ids) for c in calls)
    assert result.metrics.branches_opened == {} and result.metrics.merged_calls == 9

    calls = store.list_calls(rewritten.id)
    result = build_samples(calls)
    assert [s.num_turns for s in result.samples] == [4, 6, 1]
    assert [s.branch_reason for s in result.samples] == [None, HISTORY_REWRITTEN, SIDE_CALL]
    assert result.metrics.branches_opened == {HISTORY_REWRITTEN: 1, SIDE_CALL: 1}
    for s in result.samples:
        check_sample_against_calls(s, {c.id: c for c in calls})
    # the same reasons are inferred from the tokens when the gateway gave no hint
    unlabelled = [c.model_copy(update={"branch_reason": None, "branch": 0}) for c in calls]
    inferred = build_samples(unlabelled).samples
    assert [s.branch_reason for s in inferred] == [None, HISTORY_REWRITTEN, SIDE_CALL]
    metrics = run_metrics(store, "run")
    assert (metrics.sessions, metrics.samples, metrics.exact_token_fraction) == (2, 4, 1.0)
    store.close()


async def test_tiny_model_session_merges_with_the_engines_logprobs(
        tmp_path: Path, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    store = Store(tmp_path / "store.sqlite")
    gw = await _gateway(store, tiny_bundle, "local", device="cpu")
    try:
        session = gw.open_session()
        c = openai.AsyncOpenAI(base_url=gw.session_url(session), api_key=session.token)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        for turn in range(3):
            r = await c.chat.completions.create(model="policy", messages=messages,
                                                max_tokens=6, seed=turn)
            msg = r.choices[0].message
            messages.append({"role": "assistant", "content": msg.content or "",
                             **({"tool_calls": [t.model_dump() for t in msg.tool_calls]}
                                if msg.tool_calls else {})})
            for tc in msg.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": "ok"})
            messages.append({"role": "user", "content": f"and then {turn}?"})
        await c.close()
        log = {e.request_id: e for e in gw.engine.log}
    finally:
        await gw.stop()
    calls = store.list_calls(session.id)
    samples = build_samples(calls).samples
    # Random weights emit text that need not survive the harness's round trip (broken UTF-8):
    # then the next prompt cannot extend the last one and a branch must open, exactly there.
    breaks = sum(1 for a, b in zip(calls, calls[1:], strict=False)
                 if b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)]
                 != a.prompt_ids + a.completion_ids)
    assert len(samples) == 1 + breaks
    assert sum(s.num_turns for s in samples) == 3
    for sample in samples:
        check_sample_against_calls(sample, {c.id: c for c in calls})
        generated = [lp for lp, m in zip(sample.response_logprobs, sample.response_mask,
                                         strict=True) if m]
        engine_lps = [lp for cid in sample.call_ids for lp in log[cid].logprobs]
        assert generated == pytest.approx(engine_lps, abs=1e-6)  # stored as float32
    store.close()
