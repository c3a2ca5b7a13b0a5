"""Recorded calls -> training samples: the turn tree of a session, loss masks, metrics.

A session's calls form a tree of branches, computed here from the token ids alone (the
gateway's own branch labels are not trusted, only its `branch_reason` hints):

1. Calls are taken in index order. Failed calls are dropped (and counted).
2. Retries are merged: two calls with the same `body_digest`, or a call with
   `retry_count > 0` whose prompt ids equal an earlier call's, are one call. The LAST of
   them is kept (it is the answer the harness continued from), in the FIRST one's place.
3. Each call joins the branch whose full sequence (its last call's prompt + completion) is
   a prefix of the call's prompt ids; when several do, the longest (then the oldest) wins,
   which merges as much as the tokens allow. Otherwise the call opens a new branch, whose
   reason is the call's `branch_reason` when set, else `history_rewritten` when it shares
   the conversation's opening (system prompt and first user turn) with an existing branch,
   else `side_call`.
4. Each branch becomes one `Sample`: the first call's prompt, then for every call the
   observation tokens that arrived since the previous call (mask 0, logprob 0.0) and the
   call's generated tokens (mask 1, the engine's logprobs).
5. A sample's `images` are the sha256 hashes of the images its token sequence holds, in
   order (one per image placeholder run, repeats kept): those of its last call's prompt,
   which every earlier call of the branch extends.

Prefixes are compared as int32 byte strings (`bytes.startswith`, a memcmp) and responses
are built by appending slices, so a session costs O(total recorded tokens).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, computed_field

from openforge.types import Call, Sample, Session

if TYPE_CHECKING:
    from openforge.store import Store

FIRST_BRANCH_REASON = None  # the session's first branch was not "opened" for a reason
HISTORY_REWRITTEN = "history_rewritten"
SIDE_CALL = "side_call"
_SYSTEM_ROLES = frozenset({"system", "developer"})


class SessionMetrics(BaseModel):
    """How one session's calls turned into samples."""

    session_id: str = ""
    calls_recorded: int = 0
    failed_calls: int = 0
    retries_merged: int = 0
    calls_used: int = 0  # ok, deduplicated calls: each is in exactly one sample
    merged_calls: int = 0  # calls appended to an existing branch (calls_used - samples)
    samples: int = 0
    branches_opened: dict[str, int] = Field(default_factory=dict)  # reason -> count, beyond the first
    generated_tokens: int = 0
    observation_tokens: int = 0
    exact_calls: int = 0


class RunMetrics(BaseModel):
    """Trajectory metrics of a whole run, aggregated over its sessions."""

    sessions: int = 0
    samples: int = 0
    calls_recorded: int = 0
    calls_used: int = 0
    merged_calls: int = 0
    retries_merged: int = 0
    failed_calls: int = 0
    branches_opened: dict[str, int] = Field(default_factory=dict)
    generated_tokens: int = 0
    exact_calls: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def samples_per_session(self) -> float:
        return self.samples / self.sessions if self.sessions else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def calls_per_sample(self) -> float:
        """The merge rate: used calls per training sample (1.0: no call merged)."""
        return self.calls_used / self.samples if self.samples else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_generated_tokens_per_sample(self) -> float:
        return self.generated_tokens / self.samples if self.samples else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exact_token_fraction(self) -> float:
        """Fraction of the used (ok, deduplicated) calls whose ids are exact engine ids."""
        return self.exact_calls / self.calls_used if self.calls_used else 1.0

    def add(self, m: SessionMetrics) -> None:
        """Fold one session's metrics in."""
        self.sessions += 1
        self.samples += m.samples
        self.calls_recorded += m.calls_recorded
        self.calls_used += m.calls_used
        self.merged_calls += m.merged_calls
        self.retries_merged += m.retries_merged
        self.failed_calls += m.failed_calls
        self.generated_tokens += m.generated_tokens
        self.exact_calls += m.exact_calls
        for reason, n in m.branches_opened.items():
            self.branches_opened[reason] = self.branches_opened.get(reason, 0) + n

    def summary(self) -> dict[str, Any]:
        """The metrics as one flat dict, derived ratios included (for reports and logs)."""
        return self.model_dump()


class TrajectoryResult(BaseModel):
    """The samples of one session and how they were built."""

    samples: list[Sample] = Field(default_factory=list)
    metrics: SessionMetrics = Field(default_factory=SessionMetrics)


def _ids_bytes(ids: list[int]) -> bytes:
    # Native byte order is fine: these bytes are only compared with each other in memory.
    return array("i", ids).tobytes()


def _dedupe_retries(calls: list[Call]) -> tuple[list[Call], int]:
    """Drop every call that a later retry of the same request supersedes.

    Returns the surviving calls (in order of each group's first call) and how many were
    merged away.
    """
    group_of: list[int] = []  # call position -> group id
    by_digest: dict[str, int] = {}
    by_prompt: dict[bytes, int] = {}
    for pos, call in enumerate(calls):
        prompt_key = hashlib.blake2b(_ids_bytes(call.prompt_ids), digest_size=16).digest()
        group = pos
        if call.body_digest and call.body_digest in by_digest:
            group = by_digest[call.body_digest]
        elif call.retry_count > 0 and prompt_key in by_prompt:
            group = by_prompt[prompt_key]
        group_of.append(group)
        if call.body_digest:
            by_digest[call.body_digest] = group
        by_prompt.setdefault(prompt_key, group)
    # The survivor takes the slot of the group's first call: a retry is the same logical
    # call, so calls of other branches that ran in between must not be ordered before it.
    last_of: dict[int, int] = {}
    for pos, group in enumerate(group_of):
        last_of[group] = pos
    keep = sorted(last_of)
    return [calls[last_of[g]] for g in keep], len(calls) - len(keep)


def _message_end_ids(calls: Iterable[Call]) -> set[int]:
    """Tokens that end an assistant message: the last id of completions that stopped."""
    return {c.completion_ids[-1] for c in calls
            if c.completion_ids and c.finish_reason not in ("length", None)}


def _leading_system_messages(request: dict[str, Any]) -> int:
    """How many messages before the first user turn carry the system prompt, per dialect."""
    if request.get("system") or request.get("instructions"):  # Messages / Responses
        return 1
    messages: Any = request.get("messages")
    if not isinstance(messages, list):
        raw_input = request.get("input")
        messages = raw_input if isinstance(raw_input, list) else []
    count = 0
    for message in messages:
        if isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES:
            count += 1
        else:
            break
    if count == 0 and request.get("tools"):
        # Qwen-style templates render the tool list as a system block of their own.
        return 1
    return count


def _opening_length(call: Call, end_ids: Collection[int]) -> int | None:
    """Tokens of `call`'s prompt up to the end of its first non-system message, if known."""
    if not end_ids:
        return None
    wanted = _leading_system_messages(call.request) + 1
    seen = 0
    for pos, tok in enumerate(call.prompt_ids):
        if tok in end_ids:
            seen += 1
            if seen == wanted:
                return pos + 1
    return None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    # Binary search on slice equality keeps the comparisons in C.
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _Branch:
    reason: str | None
    calls: list[Call] = field(default_factory=list)
    seq: bytes = b""  # the last call's prompt + completion, as int32 bytes

    @property
    def seq_len(self) -> int:
        return len(self.seq) // 4


def _infer_reason(call: Call, branches: list[_Branch], end_ids: Collection[int]) -> str:
    for branch in branches:
        first = branch.calls[0]
        opening = _opening_length(first, end_ids)
        shared = _common_prefix(first.prompt_ids, call.prompt_ids)
        if opening is None:
            # No message boundary known (no completion ever stopped): fall back to
            # "most of the prompt is shared".
            if shared * 2 > len(call.prompt_ids) > 0:
                return HISTORY_REWRITTEN
        elif shared >= opening:
            return HISTORY_REWRITTEN
    return SIDE_CALL


def _assign_branches(calls: list[Call], end_ids: Collection[int]) -> list[_Branch]:
    branches: list[_Branch] = []
    for call in calls:
        prompt = _ids_bytes(call.prompt_ids)
        best: _Branch | None = None
        for branch in branches:
            if (branch.seq_len <= len(call.prompt_ids)
                    and (best is None or branch.seq_len > best.seq_len)
                    and prompt.startswith(branch.seq)):
                best = branch
        if best is None:
            reason = FIRST_BRANCH_REASON if not branches else (
                call.branch_reason or _infer_reason(call, branches, end_ids))
            best = _Branch(reason=reason)
            branches.append(best)
        best.calls.append(call)
        best.seq = prompt + _ids_bytes(call.completion_ids)
    return branches


def _branch_images(calls: list[Call]) -> list[str]:
    """The images of a branch's sequence, in order: the last call's prompt holds them all.

    Should a call's images not extend the ones before (only possible when a recording's
    prompt ids extend while its messages do not), the new ones are appended instead, so
    no referenced image is ever left out.
    """
    images: list[str] = []
    for call in calls:
        if call.images[:len(images)] == images:
            images = list(call.images)
        else:
            images.extend(i for i in call.images if i not in images)
    return images


def _branch_sample(branch: _Branch, number: int, session_id: str, session: Session | None,
                   reward: float | None) -> tuple[Sample, int, int]:
    """One branch as a Sample; also returns its generated and observation token counts."""
    first = branch.calls[0]
    response_ids = array("i")
    mask = array("b")
    logprobs = array("d")
    generated = observed = 0
    covered = len(first.prompt_ids)  # tokens of the sequence so far
    for call in branch.calls:
        obs = len(call.prompt_ids) - covered
        if obs > 0:
            response_ids.extend(call.prompt_ids[covered:])
            mask.extend(bytes(obs))
            logprobs.extend([0.0] * obs)
            observed += obs
        n = len(call.completion_ids)
        response_ids.extend(call.completion_ids)
        mask.extend(b"\x01" * n)
        # One logprob per generated id; text-only engines may return none (exact_tokens=False).
        lp = call.logprobs[:n]
        logprobs.extend(lp)
        if len(lp) < n:
            logprobs.extend([0.0] * (n - len(lp)))
        generated += n
        covered = len(call.prompt_ids) + n
    default_version = (session.weight_version if session else None) or ""
    sample = Sample.model_construct(
        sample_id=f"{session_id}/{number}",
        session_id=session_id,
        rollout_id=session.rollout_id if session else "",
        task_id=session.task_id if session else "",
        branch=number,
        branch_reason=branch.reason,
        call_ids=[c.id for c in branch.calls],
        prompt_ids=list(first.prompt_ids),
        response_ids=response_ids.tolist(),
        response_mask=mask.tolist(),
        response_logprobs=logprobs.tolist(),
        images=_branch_images(branch.calls),
        reward=reward,
        num_turns=len(branch.calls),
        weight_versions=[c.weight_version or default_version for c in branch.calls],
        exact_tokens=all(c.exact_tokens for c in branch.calls),
    )
    return sample, generated, observed


def build_samples(calls: list[Call], session: Session | None = None,
                  reward: float | None = None) -> TrajectoryResult:
    """Turn one session's recorded calls into one Sample per branch (see the module doc).

    `reward` defaults to `session.reward`. All calls must belong to one session.
    """
    session_ids = {c.session_id for c in calls}
    if len(session_ids) > 1:
        raise ValueError(f"build_samples takes the calls of one session, got {sorted(session_ids)}")
    session_id = session.id if session else (next(iter(session_ids)) if session_ids else "")
    if reward is None and session is not None:
        reward = session.reward
    ordered = sorted(calls, key=lambda c: (c.index, c.started_at))
    ok = [c for c in ordered if c.status == "ok"]
    used, retries = _dedupe_retries(ok)
    branches = _assign_branches(used, _message_end_ids(used))

    metrics = SessionMetrics(session_id=session_id, calls_recorded=len(calls),
                             failed_calls=len(ordered) - len(ok), retries_merged=retries,
                             calls_used=len(used), samples=len(branches),
                             merged_calls=len(used) - len(branches),
                             exact_calls=sum(1 for c in used if c.exact_tokens))
    opened = Counter(b.reason or SIDE_CALL for b in branches[1:])
    metrics.branches_opened = dict(opened)
    samples: list[Sample] = []
    for number, branch in enumerate(branches):
        sample, generated, observed = _branch_sample(branch, number, session_id, session, reward)
        samples.append(sample)
        metrics.generated_tokens += generated
        metrics.observation_tokens += observed
    return TrajectoryResult(samples=samples, metrics=metrics)


def session_reward(store: Store, session: Session) -> float | None:
    """The session's reward: set on the session, else the score of its rollout result."""
    if session.reward is not None:
        return session.reward
    result = store.get_result(session.id)
    if result is not None and result.reward is not None:
        return result.reward.score
    return None


def iter_session_calls(store: Store, run_id: str | None = None) -> Iterator[tuple[str, list[Call]]]:
    """(session id, its calls) for every session with calls, streamed from the store.

    Only one session's calls are in memory at a time.
    """
    current: str | None = None
    batch: list[Call] = []
    for call in store.iter_calls(run_id=run_id):
        if call.session_id != current:
            if batch:
                yield current or "", batch
            current, batch = call.session_id, []
        batch.append(call)
    if batch:
        yield current or "", batch


def iter_trajectories(store: Store, run_id: str | None = None
                      ) -> Iterator[tuple[Session | None, TrajectoryResult]]:
    """Build every session's samples in turn, streaming: bounded by the largest session."""
    for session_id, calls in iter_session_calls(store, run_id):
        session = store.get_session(session_id)
        reward = session_reward(store, session) if session else None
        yield session, build_samples(calls, session, reward)


def run_metrics(store: Store, run_id: str | None = None) -> RunMetrics:
    """Trajectory metrics over every session (with calls) of a run, or of the whole store."""
    total = RunMetrics()
    for _session, result in iter_trajectories(store, run_id):
        total.add(result.metrics)
    return total
