"""pass@k / pass^k against hand-computed values and their defining properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openforge.metrics import AttemptOutcome, pass_at_k, pass_hat_k, summarize


def test_hand_computed_values() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # pass^2 = C(2,2)/C(5,2) = 1/10
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_hat_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 0, 3) == 0.0
    assert pass_at_k(4, 2, 3) == 1.0  # any 3 of 4 must include a pass
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(4, 3, 4) == 0.0


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 0)


@st.composite
def nck(draw: st.DrawFn) -> tuple[int, int, int]:
    n = draw(st.integers(1, 40))
    c = draw(st.integers(0, n))
    k = draw(st.integers(1, n))
    return n, c, k


@given(nck())
def test_bounds_and_k1(args: tuple[int, int, int]) -> None:
    n, c, k = args
    at, hat = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    assert 0.0 <= hat <= at + 1e-12 and at <= 1.0  # all k pass implies one of k passes
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    assert pass_hat_k(n, c, 1) == pytest.approx(c / n)


@given(nck())
def test_monotone_in_k(args: tuple[int, int, int]) -> None:
    n, c, k = args
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12
        assert pass_hat_k(n, c, k + 1) <= pass_hat_k(n, c, k) + 1e-12


@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.booleans(), min_size=n, max_size=n), st.integers(1, n))))
def test_matches_enumeration_of_subsets(args: tuple[int, list[bool], int]) -> None:
    """The estimators equal the exact average over every k-subset of the attempts."""
    n, outcomes, k = args
    subsets = list(itertools.combinations(outcomes, k))
    any_pass = sum(any(s) for s in subsets) / len(subsets)
    all_pass = sum(all(s) for s in subsets) / len(subsets)
    c = sum(outcomes)
    assert pass_at_k(n, c, k) == pytest.approx(any_pass)
    assert pass_hat_k(n, c, k) == pytest.approx(all_pass)


def test_summary_excludes_infra_failures() -> None:
    outcomes = [
        AttemptOutcome(task_id="a", attempt=0, reward=1.0, passed=True),
        AttemptOutcome(task_id="a", attempt=1, reward=0.0, passed=False),
        AttemptOutcome(task_id="b", attempt=0, reward=0.5, passed=False),
        AttemptOutcome(task_id="b", attempt=1, status="infra_error"),
        AttemptOutcome(task_id="b", attempt=2, reward=1.0, passed=True),
    ]
    s = summarize(outcomes, max_k=2, task_ids=["a", "b", "c"])
    assert s.tasks == 3 and s.attempts == 5 and s.scored == 4 and s.infra_failures == 1
    rows = {r.task_id: r for r in s.rows}
    assert rows["b"].n == 2 and rows["b"].infra_failures == 1
    assert rows["c"].n == 0 and rows["c"].pass_at == {}
    assert s.pass_at[1] == pytest.approx(0.5)  # (1/2 + 1/2) / 2
    assert s.pass_at[2] == pytest.approx(1.0)
    assert s.pass_hat[2] == pytest.approx(0.0)
    assert s.mean_reward == pytest.approx(2.5 / 4)
