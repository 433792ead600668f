"""``entropy-coder`` on the gradient strategy: lossless end to end, fewer bytes, bounded
model broadcasts."""

from __future__ import annotations

import numpy as np
import pytest

from dq_flower.codecs import PayloadError, make
from dq_flower.codecs import lossless as lossless_module
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.wire.model import decode_model_payload


def test_zlib_changes_the_bytes_and_nothing_else():
    # Execute: the same seeded run without and with the lossless stage
    runs = {coder: run_server(InProcessGrid(client_app, 2),
                              build_run_config("qsgd", num_clients=2, rounds=3,
                                               entropy_coder=coder))
            for coder in ("none", "zlib")}
    plain, coded = runs["none"].history, runs["zlib"].history
    # Assert: identical training, about 4x fewer uplink payload bits (QSGD codes are
    # mostly zeros), the raw bits equal to the fixed-length code, a smaller broadcast
    assert [r["accuracy"] for r in plain] == [r["accuracy"] for r in coded]
    for p, c in zip(plain[1:], coded[1:], strict=True):
        assert c["up_raw_payload_bits"] == p["up_payload_bits"] == p["up_raw_payload_bits"]
        assert c["up_payload_bits"] < 0.4 * p["up_payload_bits"]
        assert 8 * c["up_bytes"] >= c["up_payload_bits"]
        assert c["down_payload_bits"] < p["down_payload_bits"] == 2 * 32 * runs["none"].num_params
        assert c["down_bytes"] < p["down_bytes"]


def test_a_model_broadcast_declaring_another_size_is_refused_before_decompressing(
        monkeypatch):
    w = np.zeros(5000, np.float32)  # compresses to almost nothing
    payload = make("identity", entropy="zlib").encode(w)
    assert payload.meta.get("entropy-coder") == "zlib"
    calls = []
    monkeypatch.setattr(lossless_module, "decompress", lambda *a: calls.append(a))
    with pytest.raises(PayloadError, match="expected 100"):
        decode_model_payload(payload, 100, "zlib")
    with pytest.raises(PayloadError, match="unsupported codec"):
        decode_model_payload(make("qsgd").encode(w, np.random.default_rng(0)), 5000)
    assert calls == []
    monkeypatch.undo()
    np.testing.assert_array_equal(decode_model_payload(payload, 5000), w)  # any known coder
    with pytest.raises(PayloadError):  # a receiver configured without a coder
        decode_model_payload(payload, 5000, "none")
