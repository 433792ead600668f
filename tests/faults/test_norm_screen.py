"""The norm screen's reference: robust to hostile rounds, never a permanent lockout."""

from __future__ import annotations

from dq_flower.server.robust import NormScreen


def test_first_round_uses_its_own_median_and_rejects_outliers():
    screen = NormScreen(factor=5.0)
    assert screen.keep([1.0, 1.1, 0.9, 100.0]) == [True, True, True, False]
    assert screen.state_dict()["medians"] == [1.0]


def test_a_hostile_minority_cannot_raise_the_bar():
    screen = NormScreen(factor=5.0)
    screen.keep([1.0, 1.0, 1.0])
    for _ in range(10):
        assert screen.keep([1.0, 1e6, 1e6, 1.2]) == [True, False, False, True]
    assert max(screen.state_dict()["medians"]) < 1.5


def test_honest_norms_that_outgrow_the_bar_are_accepted_again_within_rounds():
    """Norms jump 20x (a large step): the reference doubles per all-rejected round."""
    screen = NormScreen(factor=5.0)
    screen.keep([1.0, 1.0, 1.0])
    accepted_at = None
    for rnd in range(1, 10):
        if all(screen.keep([20.0, 21.0, 19.0])):
            accepted_at = rnd
            break
    # After k all-rejected rounds the bar is 5 * 2**k; it first exceeds 21 at k = 3, so
    # rounds 1-3 are rejected and round 4 is accepted.
    assert accepted_at == 4


def test_one_all_hostile_round_raises_the_bar_by_at_most_the_growth_factor():
    screen = NormScreen(factor=5.0, growth=2.0)
    screen.keep([1.0, 1.0, 1.0])
    assert screen.keep([1e30, 1e30, 1e30]) == [False, False, False]
    assert max(screen.state_dict()["medians"]) == 2.0
    assert screen.keep([1e30, 9.0]) == [False, True]


def test_state_round_trips_and_zero_factor_disables():
    screen = NormScreen(factor=5.0)
    screen.keep([1.0, 2.0, 3.0])
    screen.keep([50.0])
    other = NormScreen(factor=5.0)
    other.load_state_dict(screen.state_dict())
    assert other.keep([30.0, 50.0]) == screen.keep([30.0, 50.0])
    assert NormScreen(factor=0.0).keep([1e30]) == [True]
