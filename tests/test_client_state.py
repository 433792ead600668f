"""The clients' replayable ``Context.state`` (Prepare / Execute / Assert)."""

import numpy as np
from flwr.app import Context, RecordDict

from dq_flower.client_state import (
    STATE_HISTORY,
    begin_round,
    encode_with_feedback,
    end_round,
    load_state_dict,
    save_state_dict,
)
from dq_flower.codecs import make

PREFIX = "test-"


def _context() -> Context:
    return Context(run_id=1, node_id=1, state=RecordDict(), run_config={}, node_config={})


def _serve(context: Context, rnd: int, value: float) -> bool:
    """One round that sets entry ``test-x`` to ``value``; whether it was a repeat."""
    repeated = begin_round(context, rnd, PREFIX)
    save_state_dict(context, PREFIX + "x", {"v": np.array([value]), "round": rnd})
    end_round(context, rnd, PREFIX)
    return repeated


def _value(context: Context) -> float | None:
    state = load_state_dict(context, PREFIX + "x")
    return None if state is None else float(state["v"][0])


def test_a_repeated_round_starts_from_the_state_before_it():
    # Prepare
    ctx = _context()
    for rnd, value in ((1, 10.0), (2, 20.0), (3, 30.0)):
        assert not _serve(ctx, rnd, value)
    # Execute: round 2 again (a server resumed from its round-1 checkpoint)
    repeated = begin_round(ctx, 2, PREFIX)
    # Assert: the state after round 1, and the snapshots of rounds 2 and 3 are gone
    assert repeated and _value(ctx) == 10.0
    assert not any(k.startswith(PREFIX + "after@2/") or k.startswith(PREFIX + "after@3/")
                   for k in ctx.state)
    assert load_state_dict(ctx, PREFIX + "x")["round"] == 1


def test_a_round_that_failed_half_way_leaves_nothing_behind():
    # Prepare: round 1 served; round 2 changes the state, then fails before end_round
    ctx = _context()
    _serve(ctx, 1, 1.0)
    begin_round(ctx, 2, PREFIX)
    save_state_dict(ctx, PREFIX + "x", {"v": np.array([99.0])})
    save_state_dict(ctx, PREFIX + "y", {"v": np.array([5.0])})
    # Execute: the server retries round 2
    begin_round(ctx, 2, PREFIX)
    # Assert
    assert _value(ctx) == 1.0 and load_state_dict(ctx, PREFIX + "y") is None


def test_before_the_first_round_there_is_no_state_and_other_prefixes_are_left_alone():
    # Prepare
    ctx = _context()
    save_state_dict(ctx, "other-x", {"v": np.array([3.0])})
    save_state_dict(ctx, PREFIX + "x", {"v": np.array([4.0])})  # not from a served round
    # Execute
    begin_round(ctx, 1, PREFIX)
    # Assert
    assert _value(ctx) is None
    assert float(load_state_dict(ctx, "other-x")["v"][0]) == 3.0


def test_only_the_last_rounds_are_kept():
    # Prepare / Execute
    ctx = _context()
    for rnd in range(1, STATE_HISTORY + 4):
        _serve(ctx, rnd, float(rnd))
    # Assert
    kept = {int(k[len(PREFIX + "after@"):].split("/")[0]) for k in ctx.state
            if k.startswith(PREFIX + "after@")}
    assert kept == set(range(4, STATE_HISTORY + 4))


def test_error_feedback_replays_the_same_payload_and_an_unbiased_codec_keeps_nothing():
    # Prepare
    ctx = _context()
    sign = make("sign")
    vectors = [np.random.default_rng(i).normal(size=64).astype(np.float32) for i in range(3)]

    def round_payload(rnd):
        begin_round(ctx, rnd, PREFIX)
        payload = encode_with_feedback(sign, vectors[rnd - 1], np.random.default_rng(rnd), ctx,
                                       PREFIX + "ef")
        end_round(ctx, rnd, PREFIX)
        return payload

    # Execute
    first = [round_payload(r) for r in (1, 2, 3)]
    replayed = round_payload(2)
    # Assert: the residual of round 1 is what round 2 starts from, both times
    assert first[1].buffers.keys() == replayed.buffers.keys()
    for name, buf in first[1].buffers.items():
        np.testing.assert_array_equal(buf, replayed.buffers[name])
    fresh = encode_with_feedback(sign, vectors[1], np.random.default_rng(2), _context(),
                                 PREFIX + "ef")
    assert any(not np.array_equal(buf, fresh.buffers[name])
               for name, buf in first[1].buffers.items())
    residual = load_state_dict(ctx, PREFIX + "ef")
    assert residual is not None and any(np.abs(v).sum() > 0 for v in residual.values()
                                        if isinstance(v, np.ndarray))
    qsgd_ctx = _context()
    encode_with_feedback(make("qsgd", levels=4), vectors[0], np.random.default_rng(0), qsgd_ctx,
                         PREFIX + "ef")
    assert load_state_dict(qsgd_ctx, PREFIX + "ef") is None
