"""The direction screen: a node that keeps pointing against the others is left out; an
honest non-IID node, whose single rounds often do, is not."""

from __future__ import annotations

import numpy as np
import pytest

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.server.robust import DirectionScreen


def _round(rng, flipped: int | None, d: int = 50, n: int = 5,
           noise: float = 1.5) -> list[np.ndarray]:
    """``n`` noisy updates around one direction; node ``flipped`` sends its negative."""
    common = np.ones(d)
    out = [common + noise * rng.standard_normal(d) for _ in range(n)]
    if flipped is not None:
        out[flipped] = -out[flipped]
    return out


def test_a_node_that_keeps_pointing_against_the_others_is_left_out_after_its_warmup():
    rng = np.random.default_rng(0)
    screen = DirectionScreen(-0.1, window=10, warmup=3)
    kept = [screen.keep([1, 2, 3, 4, 5], _round(rng, flipped=4)) for _ in range(20)]
    assert all(k[:4] == [True] * 4 for k in kept)
    assert [k[4] for k in kept[:2]] == [True, True]  # not judged before 3 rounds
    assert not any(k[4] for k in kept[3:])


def test_honest_nodes_whose_single_rounds_point_away_stay_in():
    rng = np.random.default_rng(1)
    screen = DirectionScreen(-0.1)
    negative, kept = 0, []
    for _ in range(50):
        vectors = _round(rng, flipped=None, d=400, noise=6.0)
        negative += sum(c < 0 for c in _cosines(vectors))
        kept.append(screen.keep([1, 2, 3, 4, 5], vectors))
    assert negative >= 10  # single rounds do point against the others
    assert all(all(k) for k in kept)


def _cosines(vectors):
    total = np.sum(vectors, axis=0)
    return [float(v @ (total - v)) / (np.linalg.norm(v) * np.linalg.norm(total - v))
            for v in vectors]


def test_the_screen_is_off_at_minus_one_and_needs_three_vectors():
    rng = np.random.default_rng(2)
    off = DirectionScreen(-1.0)
    assert all(all(off.keep([1, 2, 3], _round(rng, 2, n=3))) for _ in range(10))
    on = DirectionScreen(-0.1, warmup=1)
    assert on.keep([1, 2], _round(rng, 1, n=2)) == [True, True] and on.cosines == {}


def test_a_restored_screen_judges_like_the_one_it_was_saved_from():
    rng = np.random.default_rng(3)
    screen = DirectionScreen(-0.1)
    for _ in range(4):
        screen.keep([1, 2, 3, 4], _round(rng, flipped=3, n=4))
    restored = DirectionScreen(-0.1)
    restored.load_state_dict(screen.state_dict())
    vectors = _round(rng, flipped=3, n=4)
    assert restored.keep([1, 2, 3, 4], vectors) == screen.keep([1, 2, 3, 4], vectors) == \
        [True, True, True, False]


@pytest.mark.parametrize("method", ["qsgd"])
def test_honest_non_iid_clients_are_not_left_out_at_the_defaults(method):
    # Dirichlet(0.1) over 4 clients: a third of the honest updates point against the
    # others' mean in their round; a rule on the single round left ~20 out in 30 rounds
    result = run_server(InProcessGrid(client_app, 4),
                        build_run_config(method, num_clients=4, rounds=30, seed=0,
                                         partition="dirichlet", dirichlet_alpha=0.1,
                                         lr=1.0, entropy_coder="zlib"))
    assert sum(int(r.get("misaligned", 0) or 0) for r in result.history) <= 2
