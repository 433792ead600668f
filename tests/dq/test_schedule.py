"""The adaptive upload schedule on hand-made learning curves, and how asks are split."""

import math

import numpy as np
import pytest

from dq_flower.dq.plateau import HeldOutScores
from dq_flower.dq.schedule import AdaptiveSchedule, PairedGain, allocate, paired_gain


def _scores(correct, loss=None):
    correct = np.asarray(correct, dtype=bool)
    loss = np.where(correct, 0.1, 2.0) if loss is None else np.asarray(loss, dtype=float)
    return HeldOutScores(loss, correct, np.zeros(correct.size, dtype=np.uint64))


def _gain(gain, stderr, e0=0.3, rows=500):
    return PairedGain(gain, stderr, e0, e0 - gain, rows)


def test_first_upload_grows_the_store_by_max_growth():
    s = AdaptiveSchedule(min_gain=0.005, max_growth=1.5)
    s.after_upload(0, 640, None)
    assert s.next_total == 320 and not s.done


def test_a_steep_curve_keeps_asking_at_the_largest_growth():
    s = AdaptiveSchedule(min_gain=0.005, max_growth=1.5)
    s.after_upload(0, 1000, None)
    s.after_upload(1000, 1500, _gain(0.05, 0.01, e0=0.30))  # 5 points for +50%
    assert s.next_total == 750 and not s.done


def test_a_flattening_curve_asks_for_less_than_the_largest_growth():
    s = AdaptiveSchedule(min_gain=0.005, max_growth=1.5, min_growth=1.1)
    s.after_upload(0, 4000, None)
    # 0.6 points for +50% at 1.8% error: the power law through both points (b = 1)
    # predicts that a doubling gains min_gain at N* = 7,200, so the ask is N* - N = 1,200
    s.after_upload(4000, 6000, _gain(0.006, 0.001, e0=0.018))
    assert 600 <= s.next_total < 3000 and not s.done
    b = math.log(0.018 / 0.012) / math.log(1.5)
    star = 6000 * (0.012 * (1 - 2 ** -b) / 0.005) ** (1 / b)
    assert star == pytest.approx(7200)
    assert s.next_total == max(math.ceil(min(max(star - 6000, 600), 3000)), 1)


def test_a_flat_curve_stops_asking_and_stays_stopped():
    s = AdaptiveSchedule(min_gain=0.005)
    s.after_upload(0, 1000, None)
    s.after_upload(1000, 1500, _gain(0.001, 0.002))  # upper bound 0.3 points < 0.5
    assert s.done and s.next_total == 0
    assert [p["ask"] for p in s.curve] == [500.0, 0.0]


def test_an_uncertain_small_gain_keeps_asking():
    s = AdaptiveSchedule(min_gain=0.005)
    s.after_upload(0, 200, None)
    s.after_upload(200, 300, _gain(0.0, 0.02, rows=30))  # 0 +- 2 points: no proof of flat
    assert not s.done and s.next_total >= 30


def test_paired_gain_counts_rows_the_models_disagree_on():
    before = _scores([1, 0, 0, 1, 0, 1, 1, 0, 1, 1])
    after = _scores([1, 1, 0, 1, 1, 1, 1, 0, 1, 0])
    g = paired_gain(before, after)
    diff = np.array([0, 1, 0, 0, 1, 0, 0, 0, 0, -1], dtype=float)
    assert g.gain == pytest.approx(0.1)
    assert g.stderr == pytest.approx(diff.std(ddof=1) / math.sqrt(10))
    assert (g.error_before, g.error_after) == pytest.approx((0.4, 0.3))


def test_paired_gain_of_identical_models_is_not_certain_on_few_rows():
    same = _scores([1] * 40 + [0] * 10)
    g = paired_gain(same, same)
    assert g.gain == 0.0 and g.stderr == pytest.approx(math.sqrt(1 / 51 / 50))
    assert g.gain + g.stderr > 0.005  # 50 rows cannot show a flat curve at half a point


def test_paired_gain_of_float_targets_is_relative_to_the_loss_before():
    nodes = np.zeros(4, dtype=np.uint64)
    before = HeldOutScores(np.array([1.0, 2.0, 3.0, 2.0]), None, nodes)
    after = HeldOutScores(np.array([0.5, 1.0, 1.5, 1.0]), None, nodes)
    assert paired_gain(before, after).gain == pytest.approx(0.5)


def test_allocate_splits_in_proportion_to_what_is_left_and_caps_at_it():
    asks = allocate(300, {1: 1000, 2: 1000, 3: 500}, {})
    assert asks == {1: 120, 2: 120, 3: 60}
    # node 3 fits worst: its share (150) is over the 20 it has left; the rest goes on
    asks = allocate(300, {1: 200, 2: 200, 3: 20}, {1: 1.0, 2: 1.0, 3: 20.0})
    assert asks == {1: 140, 2: 140, 3: 20}
    assert allocate(10_000, {1: 30, 2: 40}, {}) == {1: 30, 2: 40}


def test_allocate_leans_towards_the_nodes_the_model_fits_worst():
    asks = allocate(400, {1: 1000, 2: 1000}, {1: 0.3, 2: 0.9})
    assert asks == {1: 100, 2: 300}


def test_allocate_gives_unknown_nodes_the_mean_of_the_known():
    asks = allocate(300, {1: 100, 2: None, 3: 100}, {})
    assert sum(asks.values()) == 300 and asks[2] == 100


def test_schedule_state_round_trips():
    s = AdaptiveSchedule()
    s.after_upload(0, 100, None)
    t = AdaptiveSchedule()
    t.load_state(s.state())
    assert t.state() == s.state()


@pytest.mark.parametrize("kwargs", [{"min_gain": 0}, {"max_growth": 1.0},
                                    {"min_growth": 2.0, "max_growth": 1.5}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        AdaptiveSchedule(**kwargs)
