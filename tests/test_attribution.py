"""Whose failure a harness's crash or timeout is (`openforge.attribution`), case by case; the
real supervisor runs of each side are in test_rollout.py."""

from __future__ import annotations

import pytest

from openforge.attribution import agents_own_end
from openforge.types import Call


def calls(*statuses: str) -> list[Call]:
    return [Call(id=f"c{i}", session_id="s", index=i, status=status)  # type: ignore[arg-type]
            for i, status in enumerate(statuses)]


@pytest.mark.parametrize("harness_status", ["crashed", "timeout"])
@pytest.mark.parametrize("recorded", [(), ("failed",), ("failed", "failed"), ("ok", "failed")])
def test_the_infrastructure_may_be_at_fault(harness_status: str, recorded: tuple[str, ...]) -> None:
    # Never answered, or the engine failed the call the harness was waiting on.
    assert agents_own_end(harness_status, calls(*recorded)) is None  # type: ignore[arg-type]


def test_a_timeout_after_any_failed_call_is_the_infrastructures() -> None:
    # The time went (partly) to the failure, although the engine answered again afterwards.
    assert agents_own_end("timeout", calls("ok", "failed", "ok")) is None


def test_a_crash_after_the_engine_recovered_is_the_agents() -> None:
    own = agents_own_end("crashed", calls("ok", "failed", "ok"))
    assert own is not None and "the model answered 2 call(s)" in own


def test_the_last_call_is_the_one_with_the_highest_index() -> None:
    # The store's order is not the calls' order: the latest is the one that counts.
    recorded = list(reversed(calls("ok", "failed")))
    assert agents_own_end("crashed", recorded) is None


def answered_then(*failed_with: int | None) -> list[Call]:
    """One answered call, then calls that failed with these HTTP statuses."""
    recorded = calls("ok", *["failed"] * len(failed_with))
    return [call.model_copy(update={"http_status": status})
            for call, status in zip(recorded, (200, *failed_with), strict=True)]


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_a_crash_after_the_engine_refused_the_request_itself_is_the_agents(status: int) -> None:
    # A prompt beyond the engine's context window, or a call the agent sent itself: the
    # request's own fault, not the infrastructure's.
    own = agents_own_end("crashed", answered_then(status))
    assert own is not None and f"refused the last one as the request's own fault ({status})" in own


def test_a_timeout_after_only_refused_requests_is_the_agents() -> None:
    own = agents_own_end("timeout", answered_then(400, 400))
    assert own is not None and "the infrastructure failed none" in own


@pytest.mark.parametrize("status", [None, 200, 429, 500, 502, 503, 504])
def test_failures_of_the_engine_or_the_gateway_stay_the_infrastructures(
        status: int | None) -> None:
    # None: a call recorded before the status was kept; 200: answered, then recording it
    # failed; 429: the engine was busy (its weights being replaced).
    assert agents_own_end("crashed", answered_then(status)) is None
    assert agents_own_end("timeout", answered_then(status)) is None
    # A refusal after it does not give the time back.
    assert agents_own_end("timeout", answered_then(status, 400)) is None
