"""The payload bits of a DQ upload, counted by hand: the client's count (encode_batch), the
server's (decode_batch) and the strategy's up_payload_bits metric must all agree with it."""

import numpy as np
import pytest
from flwr.app import Message

from dq_flower.codecs import Payload, make
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.protocol.dq_batch import (
    COMPENSATION_KEY,
    INFO_KEY,
    SAMPLES_KEY,
    decode_batch,
    encode_batch,
)

N, D, CLASSES, ID_UPPER = 11, 24, 10, 300


def _samples(bits=2, seed=0):
    x = np.random.default_rng(seed).random((N, D)).astype(np.float32)
    return make("uniform", bits=bits, stochastic=False).encode(x)


def _hand_count(samples, label_bits, id_bits, n_weights, comp=None):
    """Codes and side information, labels and ids packed to whole bytes, 32 bits a weight."""
    return (samples.nbits + 8 * -(-N * label_bits // 8) + 8 * -(-N * id_bits // 8)
            + 32 * n_weights + (comp.nbits if comp is not None else 0))


@pytest.mark.parametrize("weights", ["equal", "per-row"])
def test_client_and_server_count_the_same_bits_as_the_hand_count(weights):
    samples = _samples()
    rng = np.random.default_rng(1)
    labels = rng.integers(0, CLASSES, N)
    ids = rng.choice(ID_UPPER, N, replace=False)
    w = (np.full(N, 2.5, np.float32) if weights == "equal"
         else rng.uniform(1, 3, N).astype(np.float32))
    n_weights = 1 if weights == "equal" else N  # equal weights travel as one float32
    # 10 classes: 4-bit labels; ids below 300: 9 bits
    expected = _hand_count(samples, 4, 9, n_weights)

    content, client_bits = encode_batch(samples, labels, ids, w, CLASSES, ID_UPPER)
    batch = decode_batch(content, CLASSES, D, 2, max_samples=N, id_upper=ID_UPPER)

    assert client_bits == expected
    assert batch.payload_bits == expected
    assert batch.info_nbits == expected - samples.nbits
    info = content.array_records[INFO_KEY]
    assert len(info["weights"].data) == 4 * n_weights
    np.testing.assert_array_equal(batch.labels, labels)
    np.testing.assert_array_equal(batch.ids, ids)
    np.testing.assert_array_equal(batch.weights, w)


def test_float_targets_and_compensation_bits():
    samples = _samples(bits=3)
    rng = np.random.default_rng(2)
    ids = np.arange(N)
    w = np.ones(N, np.float32)
    comp = make("fp16").encode(rng.standard_normal(50).astype(np.float32))
    exact = np.round(rng.uniform(-4, 4, N) * 4).astype(np.float32) / 4  # exact in float16
    inexact = (exact + np.float32(1e-3)).astype(np.float32)
    for targets, width in ((exact, 16), (inexact, 32)):
        content, client_bits = encode_batch(samples, targets, ids, w, CLASSES, ID_UPPER,
                                            compensation=comp)
        batch = decode_batch(content, None, D, 3, max_samples=N, id_upper=ID_UPPER,
                             float_targets=True)
        expected = samples.nbits + N * width + 8 * -(-N * 9 // 8) + 32 + comp.nbits
        assert client_bits == batch.payload_bits == expected
        np.testing.assert_array_equal(batch.labels, targets)


def test_strategy_metric_is_the_hand_count_of_the_replies_it_stored():
    # Capture every reply of a 2-round DQ run and count its bits from the wire content
    # alone: samples payload (codes and side information), the raw label, id and weight
    # bytes, the compensation payload.
    replies = []

    def capturing(msg, context):
        reply = client_app(msg, context)
        replies.append(reply)
        return reply

    run_config = build_run_config("dq", num_clients=3, rounds=2, seed=3, budget=20,
                                  server_steps=2, scorer="loss", selection_rule="sample",
                                  compensation="fp16")
    result = run_server(InProcessGrid(capturing, 3), run_config)

    def wire_bits(reply: Message) -> int:
        records = reply.content.array_records
        info = records[INFO_KEY]
        bits = Payload.from_record(records[SAMPLES_KEY]).nbits
        bits += 8 * sum(len(info[k].data) for k in ("labels", "ids", "weights"))
        if COMPENSATION_KEY in records:
            bits += Payload.from_record(records[COMPENSATION_KEY]).nbits
        return bits

    assert len(replies) == 6
    for rnd in (1, 2):
        mine = replies[3 * (rnd - 1): 3 * rnd]
        assert all(len(r.content.array_records[INFO_KEY]["weights"].data) > 4 for r in mine)
        assert result.history[rnd]["up_payload_bits"] == sum(wire_bits(r) for r in mine)
