import numpy as np
import pytest

from dq_flower.dq.client.selection import inclusion_probabilities, select


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


def test_sample_rule_inclusion_frequencies_match_capped_pps_on_skewed_scores():
    # Prepare: skewed scores: two that hit the cap (pi = 1), two zeros (kept alive by the
    # floor 1e-3 * mean), four small and eight large ones; budget 6. Target probabilities,
    # computed by hand: the two 500s are capped (6 * 500 / 1068.1 > 1); the rest share the
    # remaining 4 in proportion to max(score, floor): 0.0039, 0.0587 and 0.4697.
    scores = np.array([500, 500, 0, 0, 1, 1, 1, 1] + [8] * 8, dtype=float)
    m = 6
    floor = 1e-3 * scores.mean()
    s = np.maximum(scores, floor)
    capped = scores == 500
    target = np.where(capped, 1.0, (m - 2) * s / s[~capped].sum())
    np.testing.assert_allclose(inclusion_probabilities(scores, m), target, rtol=1e-12)
    rng = np.random.default_rng(2024)
    draws = 20_000
    counts = np.zeros(scores.size)
    # Execute
    for _ in range(draws):
        sel = select(scores, m, "sample", rng)
        assert len(sel) == m
        counts[sel.indices] += 1
    freq = counts / draws
    # Assert: capped rows are always taken; every other row's frequency is within 4.5
    # binomial standard errors of its target (16 rows: a false alarm about 1 in 10,000;
    # measured max 3.1). Without the floor the zeros are never drawn (8.9 SE off); a fixed
    # systematic start instead of a uniform one misses by 9 to 10^6 SE (start 0, .25, .5, .9).
    assert (freq[capped] == 1.0).all()
    assert (counts[2:4] > 0).all()
    se = np.sqrt(target * (1 - target) / draws)
    free = ~capped
    z = (freq[free] - target[free]) / se[free]
    assert np.abs(z).max() < 4.5, np.round(z, 1)


def test_all_zero_scores_fall_back_to_uniform_inclusion():
    # no information: every candidate gets m / n (and the sample rule still returns m picks
    # with Horvitz-Thompson weights 1 / (n * m / n) = 1 / m)
    np.testing.assert_array_equal(inclusion_probabilities(np.zeros(8), 2), np.full(8, 0.25))
    sel = select(np.zeros(8), 2, "sample", np.random.default_rng(0))
    assert len(sel) == 2
    np.testing.assert_allclose(sel.weights, [0.5, 0.5])
    np.testing.assert_array_equal(inclusion_probabilities(np.ones(3), 3), np.ones(3))


def test_selection_dtypes_and_the_default_threshold():
    scores = np.array([0.0, 2.0, 0.5, 3.0])
    for rule in ("topk", "threshold", "sample"):
        sel = select(scores, 2, rule, np.random.default_rng(0))
        assert sel.indices.dtype == np.int64 and sel.weights.dtype == np.float32, rule
        assert len(sel) == 2 and (np.diff(sel.indices) > 0).all(), rule  # sorted, distinct
    # the default threshold is 0: every non-negative score is eligible
    sel = select(scores, 10, "threshold", np.random.default_rng(0))
    assert sel.indices.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(sel.weights, 0.25)
    empty = select(scores, 0, "sample", np.random.default_rng(0))
    assert len(empty) == 0 and empty.weights.dtype == np.float32
    with pytest.raises(ValueError, match="1-D"):
        select(np.ones((2, 2)), 1, "topk", np.random.default_rng(0))


def test_capping_takes_several_passes_and_does_not_depend_on_the_scale():
    # m = 3: pass 1 caps 100 (3 * 100 / 114 > 1); pass 2 shares 2 over 14: 10 gets
    # 20/14 > 1 and is capped too; pass 3 shares the last 1 over the four 1s: 1/4 each
    scores = np.array([100.0, 10.0, 1.0, 1.0, 1.0, 1.0])
    expected = [1.0, 1.0, 0.25, 0.25, 0.25, 0.25]
    np.testing.assert_allclose(inclusion_probabilities(scores, 3), expected, rtol=1e-12)
    # the same scores a thousand times smaller (mean below 1) give the same probabilities
    np.testing.assert_allclose(inclusion_probabilities(scores / 1000, 3), expected, rtol=1e-12)
