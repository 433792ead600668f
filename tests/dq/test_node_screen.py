"""The screens of one node's data (copies, held-out agreement) and the per-client row cap."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.near_copies import CopyScreen, row_keys
from dq_flower.dq.server.node_screen import MIN_ROWS, AgreementScreen, excess
from dq_flower.dq.server.plateau import HeldOutScores
from dq_flower.dq.server.store import SampleStore, StoredRows
from dq_flower.dq.server.strategy import DQStrategy


def _codes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 8), dtype=np.uint8)


def test_row_keys_tell_rows_apart_by_codes_and_side():
    codes = _codes(3, 0)
    codes[2] = codes[0]
    side = np.zeros((3, 2), dtype=np.float32)
    keys = row_keys(codes, side)
    assert keys[0] == keys[2] != keys[1]
    side[2, 0] = 1.0
    assert len(set(row_keys(codes, side))) == 3


def test_rows_of_a_small_table_differing_in_a_code_or_a_target_are_no_copies():
    """A 5-column table at 4 bits: honest houses often share all codes but one, or all codes
    and another price; the screen kept out 836 of a node's 1,000 rows as copies."""
    screen = CopyScreen(margin=0.1, bits=4)
    codes = np.tile(_codes(1, 3)[:, :3], (4, 1))  # 3 bytes: 6 codes of 4 bits
    codes[1, 0] ^= 1  # one code differs
    side = np.zeros((4, 2), dtype=np.float32)
    prices = np.array([1.0, 1.0, 2.0, 1.0], dtype=np.float32)  # row 2: another price
    assert screen.copied(0, codes, side, prices).tolist() == [False, False, False, True]


def test_copies_are_counted_per_client_and_a_copying_client_found():
    screen = CopyScreen(margin=0.1)
    side = np.zeros((40, 0), dtype=np.float32)
    for node in (1, 2, 3):
        assert not screen.copied(node, _codes(40, node), side).any()
    rows = np.tile(_codes(10, 9), (4, 1))  # 10 rows, each sent 4 times
    mask = screen.copied(0, rows, side)
    assert mask.sum() == 30 and not mask[:10].any()
    assert screen.copied(0, rows[:5], side[:5]).all()  # sent again in a later round
    assert screen.review(1) == {0}
    assert screen.copies == {1: 0, 2: 0, 3: 0, 0: 35}
    restored = CopyScreen()
    restored.load_state(screen.state())
    assert restored.state() == screen.state()
    assert restored.copied(0, rows[:1], side[:1]).all()


def test_copies_every_client_shares_are_not_acted_on():
    screen = CopyScreen(margin=0.1)
    side = np.zeros((20, 0), dtype=np.float32)
    for node in range(4):  # every client repeats its rows alike (low-cardinality data)
        screen.copied(node, np.tile(_codes(10, node), (2, 1)), side)
    assert screen.review(1) == set()
    assert CopyScreen(margin=0).review(1) == set()


def test_honest_repeats_of_rows_other_clients_sent_too_are_no_copying():
    """The more rows a client sends, the more of a small table's common rows it repeats: a
    credit table of 5 columns at 4 bits, one client asked for all its 500 rows, the others
    for about 170, was judged copying (23% against 8%) and 113 of its rows dropped (here:
    1,200 rows against 300, 21% against 7%). Rows
    other clients sent too are no evidence; a client repeating its own rows is still found."""
    rng = np.random.default_rng(0)
    common = 1.0 / np.arange(1, 3001) ** 0.4  # a few common rows, many rare ones

    def table(n: int) -> np.ndarray:  # rows of 2 bytes drawn from one distribution
        keys = rng.choice(common.size, size=n, p=common / common.sum()).astype(np.uint16)
        return keys.view(np.uint8).reshape(n, 2)

    screen = CopyScreen(margin=0.1, bits=4)
    side = np.zeros((1200, 0), dtype=np.float32)
    for node, n in enumerate([1200, 300, 300, 300, 300, 300]):
        screen.copied(node, table(n), side[:n])
    others = np.median([screen.copies[i] / 300 for i in range(1, 6)])
    assert screen.copies[0] / 1200 > others + 0.1  # counted: its share is far above theirs
    assert screen.review(1) == set()
    rows = (np.arange(4000, 4100, dtype=np.uint16)).view(np.uint8).reshape(100, 2)
    screen.copied(7, np.concatenate([rows, rows[:60]]), side[:160])  # rows of its own, again
    assert screen.review(2) == {7}
    restored = CopyScreen()
    restored.load_state(screen.state())
    assert restored.repeats == screen.repeats and restored.evidence(7) == 60


def _scores(errors: dict[int, float], rows: int = 20, seed: int = 0) -> HeldOutScores:
    rng = np.random.default_rng(seed)
    correct, nodes = [], []
    for node, err in errors.items():
        wrong = np.zeros(rows, dtype=bool)
        wrong[:round(err * rows)] = True
        correct.append(~rng.permutation(wrong))
        nodes.append(np.full(rows, node, dtype=np.uint64))
    c = np.concatenate(correct)
    return HeldOutScores(np.where(c, 0.1, 2.0), c, np.concatenate(nodes))


def test_a_client_far_worse_on_its_own_rows_is_excluded_then_restored():
    screen = AgreementScreen(margin=0.4)
    assert screen.review(1, _scores({0: 0.9, 1: 0.05, 2: 0.1, 3: 0.05, 4: 0.1}))
    assert set(screen.excluded) == {0} and "held-out error 0.9" in screen.excluded[0]
    assert not screen.review(2, _scores({0: 0.5, 1: 0.05, 2: 0.1, 3: 0.05, 4: 0.1}))
    assert set(screen.excluded) == {0}  # hysteresis: restored under half the margin only
    assert screen.review(3, _scores({0: 0.15, 1: 0.05, 2: 0.1, 3: 0.05, 4: 0.1}))
    assert screen.excluded == {}
    assert [r["round"] for r in screen.reviews] == [1, 2, 3]


def test_the_agreement_screen_needs_rows_clients_and_a_margin():
    # a skewed honest client within the margin; too few rows; too few clients; off
    assert not AgreementScreen().review(1, _scores({0: 0.35, 1: 0.0, 2: 0.05, 3: 0.0}))
    few = _scores({0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}, rows=MIN_ROWS - 1)
    assert AgreementScreen().verdicts(few) == []
    assert AgreementScreen().verdicts(_scores({0: 1.0, 1: 0.0})) == []
    assert not AgreementScreen(margin=0).review(1, _scores({0: 1.0, 1: 0.0, 2: 0.0}))


def test_float_targets_are_judged_by_relative_loss():
    assert excess(4.0, 1.0, classes=False) == pytest.approx(0.75)
    assert excess(0.5, 1.0, classes=False) == 0.0
    loss = np.concatenate([np.full(20, 10.0), np.full(60, 1.0)]) + np.tile([0, 0.01], 40)
    nodes = np.repeat(np.arange(4, dtype=np.uint64), 20)
    screen = AgreementScreen()
    assert screen.review(1, HeldOutScores(loss, None, nodes))
    assert set(screen.excluded) == {0}


def _store() -> SampleStore:
    store = SampleStore(lambda c, s, d: c.astype(np.float32))
    n = 6
    store.add(StoredRows(np.arange(n, dtype=np.uint8).reshape(n, 1), np.zeros((n, 0)),
                         np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.float32),
                         np.array([7, 7, 7, 8, 8, 9], dtype=np.uint64), np.arange(n),
                         np.zeros((n, 0), dtype=np.int64)))
    return store


def test_the_store_draws_no_row_of_a_skipped_client_and_remembers_dropped_ids():
    store = _store()
    x, _, _ = store.draw(10, np.random.default_rng(0), "node", skip=frozenset({7, 5}))
    assert sorted(x.ravel().tolist()) == [3.0, 4.0, 5.0]
    assert store.rows_of(frozenset({8})).tolist() == [False] * 3 + [True] * 2 + [False]
    store.note_received(9, np.array([40, 41]))
    assert store.received(9).tolist() == [5, 40, 41]
    assert len(store) == 6


@pytest.mark.parametrize("knob,value", [("node_rows_cap", 0.5), ("node_rows_cap", float("nan")),
                                        ("screen_margin", -0.1), ("screen_margin", 2.0),
                                        ("copy_margin", float("nan"))])
def test_bad_screen_knobs_fail_naming_the_key(knob, value):
    with pytest.raises(ValueError, match=knob.replace("_", "-")):
        DQConfig(**{knob: value})


def test_no_client_is_asked_past_the_row_cap_nor_once_excluded():
    strategy = DQStrategy(torch.nn.Linear(4, 2))
    strategy.data.sent = {0: [9000, 0], 1: [300, 0], 2: [300, 0], 3: [300, 0],
                          4: [300, 100]}
    assert strategy.asks.rows_cap() == 1200  # 4 times the median client's 300 rows
    schedule = strategy.trainer.schedule
    schedule.next_total = 1000
    asks = strategy.asks.adaptive_asks([0, 1, 2, 3, 4])
    left = {0: 1200, 1: 300, 2: 300, 3: 300, 4: 200}  # node 0 capped; node 4 sent 100
    assert sum(asks.values()) == 1000
    assert all(abs(asks[n] - 1000 * v / 2300) < 1 for n, v in left.items()), asks
    # the cap grows with what a client has sent: 4 times its 1,200 rows, 3,600 more
    strategy.data.sent[0][1] = 1200
    assert strategy.asks.rows_cap(1200) == 4800
    schedule.next_total = 10000
    assert strategy.asks.adaptive_asks([0, 1, 2, 3, 4])[0] == 3600
    strategy.data.sent[0][1] = 0
    schedule.next_total = 1000
    strategy.trainer.screen.excluded[0] = "held-out error"
    assert strategy.asks.adaptive_asks([0, 1, 2, 3, 4])[0] == 0
    assert DQStrategy(torch.nn.Linear(4, 2), node_rows_cap=0).asks.rows_cap() == float("inf")


def test_a_row_two_codes_from_an_earlier_one_is_a_near_copy():
    from dq_flower.codecs.bitpack import pack
    from dq_flower.dq.server.near_copies import REFERENCE_ROWS, NearCopies, near_codes

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 4, (40, 64))  # 2-bit rows of 64 codes, about 48 apart
    moved = codes[:10].copy()
    moved[:, [5, 9]] = (moved[:, [5, 9]] + 1) % 4  # two codes moved by one level

    def packed(rows):
        return pack(rows.reshape(-1), 2).reshape(len(rows), 16)

    screen = CopyScreen(margin=0.1, bits=2)
    assert near_codes(64) == 4
    assert not screen.copied(7, packed(codes), np.zeros((40, 0))).any()
    assert screen.copied(7, packed(moved), np.zeros((10, 0))).all()  # exact hashes differ
    assert not screen.copied(8, packed(moved), np.zeros((10, 0))).any()  # another client's
    assert screen.copies == {7: 10, 8: 0}
    again = CopyScreen(margin=0.1, bits=2)
    again.load_state(screen.state())
    assert again.copied(7, packed(moved[:3]), np.zeros((3, 0))).all()
    # the reservoir is bounded and seeded
    big = NearCopies(2)
    big.mask(1, packed(rng.integers(0, 4, (REFERENCE_ROWS + 500, 64))))
    assert big.reference[1].shape == (REFERENCE_ROWS, 16) and big.seen[1] == REFERENCE_ROWS + 500


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_packed_code_distances_count_the_codes_that_differ(bits):
    from dq_flower.codecs.bitpack import pack
    from dq_flower.dq.server.near_copies import NearCopies, code_distance

    rng = np.random.default_rng(bits)
    dim = 60
    padded = -(-dim // (8 // np.gcd(8, bits))) * (8 // np.gcd(8, bits))
    a = rng.integers(0, 1 << bits, (7, dim))
    b = rng.integers(0, 1 << bits, (9, dim))
    b[0], b[1] = a[0], a[1]
    b[1, :3] ^= 1  # three codes moved

    def packed(rows):
        return pack(np.pad(rows, ((0, 0), (0, padded - dim))).reshape(-1), bits).reshape(
            len(rows), -1)

    got = NearCopies(bits).distance(packed(a), packed(b))
    np.testing.assert_array_equal(got, code_distance(a, b))
    assert got[0, 0] == 0 and got[1, 1] == 3


def test_the_near_copy_reservoir_keeps_a_uniform_sample_of_a_clients_rows(monkeypatch):
    # seeded Monte Carlo: 400 clients send rows 0..499 in two uploads into a reservoir of 50;
    # each row should stay with probability 0.1, 40 times in expectation (sd 6): the first
    # upload's rows and the second's within 3 of it on average, every row within 5 sd
    from dq_flower.dq.server import near_copies

    monkeypatch.setattr(near_copies, "REFERENCE_ROWS", 50)
    rows = np.arange(500, dtype=np.uint16)
    packed = np.stack([rows & 255, rows >> 8], axis=1).astype(np.uint8)
    kept = np.zeros(500)
    for client in range(400):
        screen = near_copies.NearCopies(bits=8)
        screen._remember(client, packed[:120])
        screen._remember(client, packed[120:])
        ref = screen.reference[client].astype(np.int64)
        ids = ref[:, 0] + 256 * ref[:, 1]
        assert len(set(ids.tolist())) == 50  # 50 distinct rows
        kept[ids] += 1
    assert abs(kept[:120].mean() - 40) < 3 and abs(kept[120:].mean() - 40) < 3
    assert np.all(np.abs(kept - 40) < 5 * 6)



def _still_windows(node: int, still: float, seconds: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """2-bit packed windows of 64 steps every 32 of a 6-channel sensor, and their ranges.

    A share ``still`` of the recording is still: each channel constant at its own level (its
    own units, gravity on one axis) plus a little noise; the rest moves. One range a window:
    a still window's codes are one level per channel, nearly those of every other still one.
    """
    from dq_flower.codecs.bitpack import pack

    rng = np.random.default_rng(node)
    steps = seconds * 50
    level = np.array([9.8, 0.3, -0.2, 0.0, 0.05, -0.05]) + rng.normal(0, 0.05, 6)
    still_steps = np.repeat(rng.permutation(10) < round(10 * still), steps // 10)
    moving = 2 * np.sin(np.arange(steps)[:, None] * rng.uniform(0.1, 0.3, 6))
    signal = level + np.where(still_steps[:, None], 0.0, moving) + rng.normal(0, 0.01,
                                                                            (steps, 6))
    windows = np.stack([signal[s:s + 64] for s in range(0, steps - 63, 32)]).reshape(-1, 384)
    lo, hi = windows.min(1, keepdims=True), windows.max(1, keepdims=True)
    codes = np.rint((windows - lo) / (hi - lo) * 3).astype(np.int64)
    return (pack(codes.reshape(-1), 2).reshape(len(codes), 96),
            np.concatenate([lo, hi], axis=1).astype(np.float32))


def test_honest_overlapping_still_windows_are_no_copying_but_padding_is():
    """People who sit still longer send more near-copies, honestly (a still window is near
    its own shift, so near every still window): none is copying. A client padding its rows
    with near-copies of them is (the screen used to flag the 3 stillest honest clients)."""
    from dq_flower.codecs.bitpack import pack, unpack

    screen = CopyScreen(margin=0.1, bits=2)
    for node, still in enumerate([0.1, 0.2, 0.3, 0.3, 0.4, 0.5, 0.6, 0.7]):
        screen.copied(node, *_still_windows(node, still))
    assert screen.review(1) == set()
    rows, side = _still_windows(9, 0.3)
    codes = np.repeat(unpack(rows.reshape(-1), 2, len(rows) * 384).reshape(-1, 384), 3, 0)
    rng = np.random.default_rng(9)
    for row in codes:  # three near-copies of each row, two codes moved a level each
        j = rng.choice(384, 2, replace=False)
        row[j] = np.where(row[j] < 3, row[j] + 1, row[j] - 1)
    mask = screen.copied(9, np.concatenate([rows, pack(codes.reshape(-1), 2).reshape(-1, 96)]),
                         np.concatenate([side, np.repeat(side, 3, 0)]))
    assert mask[len(rows):].mean() > 0.5  # the copies of its moving windows
    assert screen.review(1) == {9}
