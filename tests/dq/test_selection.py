import numpy as np
import pytest

from dq_flower.dq.selection import inclusion_probabilities, select


def test_topk_picks_highest_scores():
    scores = np.array([0.1, 5.0, 0.3, 4.0, 2.0])
    sel = select(scores, 2, "topk", np.random.default_rng(0))
    assert sorted(sel.indices.tolist()) == [1, 3]
    np.testing.assert_allclose(sel.weights, [0.5, 0.5])


def test_threshold_caps_by_budget():
    scores = np.array([0.1, 5.0, 0.3, 4.0, 2.0])
    sel = select(scores, 2, "threshold", np.random.default_rng(0), threshold=1.0)
    assert sorted(sel.indices.tolist()) == [1, 3]
    sel = select(scores, 10, "threshold", np.random.default_rng(0), threshold=1.0)
    assert sorted(sel.indices.tolist()) == [1, 3, 4]


def test_inclusion_probabilities_sum_to_budget_and_cap_at_one():
    scores = np.array([100.0, 1, 1, 1, 1, 1, 1, 1])
    pi = inclusion_probabilities(scores, 3)
    assert pi.sum() == pytest.approx(3.0)
    assert pi.max() == pytest.approx(1.0)
    assert (pi > 0).all()


def test_sample_rule_returns_exact_budget_without_duplicates():
    rng = np.random.default_rng(1)
    scores = rng.exponential(size=200)
    sel = select(scores, 17, "sample", rng)
    assert len(sel) == 17
    assert np.unique(sel.indices).size == 17


def test_sample_rule_is_unbiased_monte_carlo():
    # Estimate the mean of g over 60 candidates from 8 picks, 20,000 seeded draws.
    # Tolerance: 4 standard errors of the Monte-Carlo mean.
    rng = np.random.default_rng(123)
    g = rng.normal(size=60) + 3.0
    scores = np.abs(g) + rng.exponential(size=60)  # correlated, non-uniform scores
    draws = 20_000
    est = np.empty(draws)
    for t in range(draws):
        sel = select(scores, 8, "sample", rng)
        est[t] = (sel.weights * g[sel.indices]).sum()
    se = est.std() / np.sqrt(draws)
    assert abs(est.mean() - g.mean()) < 4 * se


def test_topk_with_informative_scores_is_biased_so_the_check_can_fail():
    rng = np.random.default_rng(5)
    g = rng.normal(size=60) + 3.0
    scores = np.abs(g)
    est = np.array([(s.weights * g[s.indices]).sum()
                    for s in (select(scores, 8, "topk", rng) for _ in range(2000))])
    se = max(est.std(), 1e-12) / np.sqrt(est.size)
    assert abs(est.mean() - g.mean()) > 4 * se


def test_bad_rule_and_scores_raise():
    with pytest.raises(ValueError, match="selection-rule"):
        select(np.ones(3), 1, "best", np.random.default_rng(0))
    with pytest.raises(ValueError, match="finite"):
        select(np.array([1.0, np.nan]), 1, "topk", np.random.default_rng(0))
