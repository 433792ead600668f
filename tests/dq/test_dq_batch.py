"""The payload bits of a DQ upload, counted by hand: the client's count (encode_batch), the
server's (decode_batch) and the strategy's up_payload_bits metric must all agree with it."""

import warnings

import numpy as np
import pytest
from flwr.app import Array, Message

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.dq.config import DQConfig
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.wire.dq_batch import (
    COMPENSATION_KEY,
    INFO_KEY,
    SAMPLES_KEY,
    decode_batch,
    label_width,
    payload_quantizer,
    raw_array,
    width_for,
)
from dq_flower.wire.dq_upload import encode_batch

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
    inexact = (exact + np.float32(2000.3)).astype(np.float32)  # float16 steps of 1 there
    for targets, width in ((exact, 16), (inexact, 32)):
        content, client_bits = encode_batch(samples, targets, ids, w, CLASSES, ID_UPPER,
                                            compensation=comp)
        batch = decode_batch(content, None, D, 3, max_samples=N, id_upper=ID_UPPER,
                             float_targets=True)
        expected = samples.nbits + N * width + 8 * -(-N * 9 // 8) + 32 + comp.nbits
        assert client_bits == batch.payload_bits == expected
        np.testing.assert_array_equal(batch.labels, targets)


def test_strategy_metric_is_the_hand_count_of_the_replies_it_stored():
    # Capture every reply of a 1-round DQ run and count its bits from the wire content
    # alone: samples payload (codes and side information), the raw label, id and weight
    # bytes, the compensation payload.
    replies = []

    def capturing(msg, context):
        reply = client_app(msg, context)
        replies.append(reply)
        return reply

    run_config = build_run_config("dq", num_clients=3, rounds=1, seed=3, budget=20,
                                  server_steps=1, upload_schedule="fixed", scorer="loss",
                                  selection_rule="sample",
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

    assert len(replies) == 3
    assert all(len(r.content.array_records[INFO_KEY]["weights"].data) > 4 for r in replies)
    assert all(COMPENSATION_KEY in r.content.array_records for r in replies)
    assert result.history[1]["up_payload_bits"] == sum(wire_bits(r) for r in replies)


def test_a_single_sample_wide_labels_and_float64_inputs_round_trip():
    samples1 = make("uniform", bits=2, stochastic=False).encode(
        np.random.default_rng(0).random((1, D)).astype(np.float32))
    content, bits = encode_batch(samples1, np.array([7]), np.array([3]), np.array([2.0]),
                                 CLASSES, ID_UPPER)  # one sample, float64 weights
    batch = decode_batch(content, CLASSES, D, 2, max_samples=1, id_upper=ID_UPPER)
    assert bits == batch.payload_bits == samples1.nbits + 8 + 16 + 32
    assert batch.labels.tolist() == [7] and batch.weights.tolist() == [2.0]
    # 1000 classes: 10-bit labels, packed wide
    samples = _samples()
    labels = np.random.default_rng(1).integers(0, 1000, N)
    content, bits = encode_batch(samples, labels, np.arange(N), np.ones(N), 1000, ID_UPPER)
    batch = decode_batch(content, 1000, D, 2, max_samples=N, id_upper=ID_UPPER)
    np.testing.assert_array_equal(batch.labels, labels)
    assert bits == batch.payload_bits == _hand_count(samples, 10, 9, 1)
    # float64 regression targets travel as float32 (0.1 is not a float16)
    targets = np.full(N, 0.1)
    content, _ = encode_batch(samples, targets, np.arange(N), np.ones(N), CLASSES, ID_UPPER)
    batch = decode_batch(content, None, D, 2, max_samples=N, float_targets=True)
    np.testing.assert_array_equal(batch.labels, np.full(N, 0.1, np.float32))


def _content():
    rng = np.random.default_rng(3)
    content, _ = encode_batch(_samples(), rng.integers(0, CLASSES, N), np.arange(N),
                              np.ones(N, np.float32), CLASSES, ID_UPPER)
    return content


@pytest.mark.parametrize(("tamper", "message"), [
    (lambda info: info.pop("ids"), "sample-info misses 'ids'"),
    (lambda info: info.__setitem__("weights", Array(np.ones(1, np.float64))),
     "sample-info 'weights' is float64, expected float32"),
    (lambda info: info.__setitem__("weights", Array(
        dtype="float32", shape=(1,), stype="raw", data=b"\x00" * 6)),
     "sample-info 'weights' carries 6 bytes"),
    (lambda info: info.__setitem__("counts", raw_array(np.array([N, 4, 9], np.int64))),
     "'counts' must hold 4 values"),
])
def test_malformed_sample_info_is_refused_with_its_reason(tamper, message):
    content = _content()
    tamper(content.array_records[INFO_KEY])
    with pytest.raises(PayloadError, match=message):
        decode_batch(content, CLASSES, D, 2, max_samples=N, id_upper=ID_UPPER)


def test_labels_where_targets_are_expected_are_refused():
    with pytest.raises(PayloadError, match="class labels sent where float targets"):
        decode_batch(_content(), CLASSES, D, 2, max_samples=N, float_targets=True)
    with pytest.raises(PayloadError, match="class labels sent where float targets"):
        decode_batch(_content(), CLASSES, D, 2, max_samples=N, target_dim=3)


@pytest.mark.parametrize(("mode", "channels", "dither", "expected"), [
    ("sample", 0, None, {"per_channel": 0, "fixed_range": False, "dither_seed": None}),
    ("channel", 3, None, {"per_channel": 3, "fixed_range": False, "dither_seed": None}),
    ("channel", 1, None, {"per_channel": 0, "fixed_range": False, "dither_seed": None}),
    ("feature", 0, None, {"per_channel": 0, "fixed_range": True, "dither_seed": None}),
    ("sample", 0, 11, {"per_channel": 0, "fixed_range": False, "dither_seed": 11}),
])
def test_sample_quantizer_for_each_range_mode(mode, channels, dither, expected):
    cfg = DQConfig(bits=3, stochastic=False, entropy_coder="zlib",
                   dither=dither is not None)
    q = cfg.sample_quantizer(mode, channels, dither_seed=dither if dither is not None else 5)
    assert (q.bits, q.stochastic, q.entropy) == (3, False, "zlib")
    assert {k: getattr(q, k) for k in expected} == expected


@pytest.mark.parametrize("params", [
    {"bits": 2},
    {"bits": 3, "per_channel": 3, "entropy": "zlib"},
    {"bits": 4, "dither_seed": 9},
    {"bits": 2, "fixed_range": True, "dither_seed": 4},
])
def test_payload_quantizer_decodes_what_the_client_encoded(params):
    x = np.random.default_rng(5).random((6, D)).astype(np.float32)
    codec = make("uniform", **params)
    p = codec.encode(x, np.random.default_rng(6))
    fixed = params.get("fixed_range", False)
    q = payload_quantizer(p, params["bits"], params.get("per_channel", 0), fixed)
    np.testing.assert_array_equal(q.decode(p), codec.decode(p))
    assert (q.bits, q.per_channel, q.fixed_range) == (
        params["bits"], params.get("per_channel", 0), fixed)
    assert q.dither_seed == params.get("dither_seed")
    # a payload made with other fixed settings than the server's is refused, saying both
    with pytest.raises(PayloadError, match=f"bits={params['bits']}.*expected {params['bits'] + 1}"):
        payload_quantizer(p, params["bits"] + 1, params.get("per_channel", 0), fixed)
    with pytest.raises(PayloadError, match="per_channel"):
        payload_quantizer(p, params["bits"], 2, fixed)
    with pytest.raises(PayloadError, match=f"fixed_range={fixed!r}"):
        payload_quantizer(p, params["bits"], params.get("per_channel", 0), not fixed)
    with pytest.raises(PayloadError) as refused:  # the whole reason, word for word
        payload_quantizer(p, params["bits"], 5, fixed)
    assert str(refused.value) == (
        f"samples use bits={params['bits']}, per_channel={p.meta.get('per_channel')!r}, "
        f"fixed_range={p.meta.get('fixed_range', False)!r}; expected {params['bits']}, 5, "
        f"{fixed}")


def test_payload_quantizer_refuses_invalid_settings_in_the_header():
    p = make("uniform", bits=2).encode(np.ones((2, D), np.float32), np.random.default_rng(0))
    p.meta["entropy"] = 5  # not a method name
    with pytest.raises(PayloadError, match="^samples carry invalid quantizer settings: "):
        payload_quantizer(p, 2, 0)


def test_widths_at_their_boundaries():
    assert [label_width(c) for c in (1, 2, 3, 4, 5, 16, 17, 256, 257)] == [
        1, 1, 2, 2, 3, 4, 5, 8, 9]
    assert [width_for(u) for u in (1, 2, 3, 1024, 1025)] == [1, 1, 2, 10, 11]


def _encoded(labels=None, ids=None, weights=None, num_classes=CLASSES, id_upper=ID_UPPER):
    labels = np.zeros(N, np.int64) if labels is None else np.asarray(labels)
    ids = np.arange(N) if ids is None else np.asarray(ids)
    weights = np.ones(N, np.float32) if weights is None else np.asarray(weights, np.float32)
    content, _ = encode_batch(_samples(), labels, ids, weights, num_classes, id_upper)
    return content


def test_decoder_bounds_labels_ids_and_weights_exactly():
    def decode(content, num_classes=CLASSES, id_upper=ID_UPPER):
        return decode_batch(content, num_classes, D, 2, max_samples=N, id_upper=id_upper)

    top_label = np.full(N, CLASSES - 1)
    assert decode(_encoded(labels=top_label)).labels.max() == CLASSES - 1
    # a client packing 4-bit labels for 16 classes sends label 10 to a 10-class server
    with pytest.raises(PayloadError, match="label 10 is out of range"):
        decode(_encoded(labels=np.full(N, 10), num_classes=16))
    ids = np.arange(N) + ID_UPPER - N  # the largest id is ID_UPPER - 1
    assert decode(_encoded(ids=ids)).ids.max() == ID_UPPER - 1
    with pytest.raises(PayloadError, match=f"sample id {ID_UPPER} is out of range"):
        decode(_encoded(ids=ids + 1, id_upper=512))
    with pytest.raises(PayloadError, match="duplicated sample ids"):
        decode(_encoded(ids=np.zeros(N)))
    for bad in (0.0, -1.0, np.inf):
        w = np.linspace(1, 2, N)
        w[3] = bad
        with pytest.raises(PayloadError, match="finite and positive"):
            decode(_encoded(weights=w))


def test_float_targets_of_several_columns_keep_their_shape():
    targets = np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4
    content, bits = encode_batch(_samples(), targets, np.arange(N), np.ones(N), CLASSES,
                                 ID_UPPER)
    batch = decode_batch(content, None, D, 2, max_samples=N, target_dim=3,
                         float_targets=True)
    assert batch.labels.shape == (N, 3) and batch.labels.dtype == np.float32
    np.testing.assert_array_equal(batch.labels, targets)
    assert bits == batch.payload_bits == _samples().nbits + 16 * 3 * N + 8 * -(-N * 9 // 8) + 32
    with pytest.raises(PayloadError, match="'targets' carries 66 bytes"):  # 3 columns, not 2
        decode_batch(content, None, D, 2, max_samples=N, target_dim=2, float_targets=True)
    with pytest.raises(PayloadError, match="33 target values for 11 samples of width 4"):
        decode_batch(content, None, D, 2, max_samples=N, target_dim=4, float_targets=True)


def _set_counts(n=N, lw=4, iw=9, wn=1):
    def tamper(content):
        content.array_records[INFO_KEY]["counts"] = raw_array(np.array([n, lw, iw, wn],
                                                                       np.int64))
    return tamper


def _set_info(key, array):
    def tamper(content):
        content.array_records[INFO_KEY][key] = array
    return tamper


def _recode_samples(**changes):
    def tamper(content):
        payload = Payload.from_record(content.array_records[SAMPLES_KEY])
        for name, value in changes.items():
            setattr(payload, name, value)
        content[SAMPLES_KEY] = payload.to_record()
    return tamper


def _float_content(targets=None):
    targets = np.linspace(0, 1, N) if targets is None else targets
    content, _ = encode_batch(_samples(), targets, np.arange(N), np.ones(N), CLASSES, ID_UPPER)
    return content


#: (content, tamper, decode_batch's arguments beyond the defaults, the reason word for word)
REFUSALS = [
    (_content, lambda c: c.__delitem__(INFO_KEY), {}, "reply misses 'samples' or 'sample-info'"),
    (_content, _recode_samples(codec="fp16"), {},
     "samples were encoded with 'fp16', expected 'uniform'"),
    (_content, None, {"dim": D + 1}, f"samples have shape ({N}, {D}), expected (n, {D + 1})"),
    (_content, None, {"max_samples": N - 1}, f"{N} samples exceed the budget of {N - 1}"),
    (_content, None, {"bits": 3}, "samples use 2 bits, expected 3"),
    (_content, _set_info("counts", raw_array(np.array([N, 4, 9], np.int64))), {},
     "sample-info 'counts' must hold 4 values"),
    (_content, _set_counts(n=N + 1), {}, f"sample-info declares {N + 1} samples, payload "
     f"carries {N}"),
    (_content, _set_counts(iw=0), {}, "sample-info widths are inconsistent (labels 4, ids 0)"),
    (_content, _set_counts(iw=33), {}, "sample-info widths are inconsistent (labels 4, ids 33)"),
    (_content, _set_counts(lw=33), {}, "sample-info widths are inconsistent (labels 33, ids 9)"),
    (_content, _set_counts(wn=3), {}, "sample-info widths are inconsistent (labels 4, ids 9)"),
    (_content, _set_counts(lw=32), {}, "labels use 32 bits; at most 4 expected"),
    (_content, _set_counts(lw=5), {}, "labels use 5 bits; at most 4 expected"),
    (_content, _set_counts(lw=17), {"num_classes": None}, "labels use 17 bits; at most 16 "
     "expected"),
    (_content, _set_info("labels", raw_array(np.zeros(2, np.uint8))), {},
     "sample-info 'labels' carries 2 bytes; 11 labels of 4 bits take 6"),
    (_content, None, {"float_targets": True},
     "class labels sent where float targets are expected"),
    (_content, None, {"target_dim": 3}, "class labels sent where float targets are expected"),
    (_float_content, None, {}, "float targets sent where class labels are expected"),
    (_float_content, lambda c: c.array_records[INFO_KEY].pop("targets"),
     {"float_targets": True, "num_classes": None}, "sample-info misses its 'targets'"),
    (_float_content, _set_info("targets", Array(np.zeros(N, np.float64))),
     {"float_targets": True, "num_classes": None}, "targets are float64, expected float16 or "
     "float32"),
    (_float_content, _set_info("targets", raw_array(np.full(N, np.nan, np.float32))),
     {"float_targets": True, "num_classes": None}, "targets must be finite"),
    (lambda: _encoded(ids=np.zeros(N)), None, {}, "duplicated sample ids"),
    (lambda: _encoded(weights=np.zeros(N)), None, {},
     "sample weights must be finite and positive"),
]


@pytest.mark.parametrize(("make_content", "tamper", "args", "reason"), REFUSALS)
def test_each_refusal_of_an_upload_gives_its_reason_word_for_word(make_content, tamper, args,
                                                                    reason):
    content = make_content()
    if tamper is not None:
        tamper(content)
    kwargs = {"num_classes": CLASSES, "dim": D, "bits": 2, "max_samples": N,
              "id_upper": ID_UPPER, **args}
    with pytest.raises(PayloadError) as refused:
        decode_batch(content, **kwargs)
    assert str(refused.value) == reason


def test_ids_too_short_to_unpack_are_refused_with_the_unpackers_reason():
    from dq_flower.codecs.bitpack import unpack_wide

    with pytest.raises(ValueError) as short:
        unpack_wide(np.zeros(1, np.uint8), 9, N)
    content = _content()
    content.array_records[INFO_KEY]["ids"] = raw_array(np.zeros(1, np.uint8))
    with pytest.raises(PayloadError) as refused:
        decode_batch(content, CLASSES, D, 2, max_samples=N, id_upper=ID_UPPER)
    assert str(refused.value) == str(short.value) != ""


def test_float_targets_travel_as_float16_where_it_moves_none_beyond_a_hundredth_of_the_spread():
    from dq_flower.dq.server.store import _narrow_float
    from dq_flower.wire.targets import travelling_targets

    rng = np.random.default_rng(5)
    temperatures = rng.normal(28, 4, (200, 12)).astype(np.float32)  # a 12-hour forecast
    sent = travelling_targets(temperatures)
    assert sent.dtype == np.float16
    moved = np.abs(sent.astype(np.float32) - temperatures)
    assert moved.max() <= 0.01 * temperatures.std(axis=0).min()
    years = rng.normal(2000, 5, 200).astype(np.float32)  # float16 steps of whole years
    assert travelling_targets(years).dtype == np.float32
    prices = rng.normal(500_000, 50_000, 200).astype(np.float32)  # past float16's range
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in cast" in a user's log
        assert travelling_targets(prices).dtype == np.float32
        assert _narrow_float(prices).dtype == np.float32
    counts = rng.integers(0, 300, 200).astype(np.float32)  # exact in float16
    assert travelling_targets(counts).dtype == np.float16
    assert travelling_targets(temperatures[:1]).dtype == np.float32  # one row: no spread
    wide = np.stack([temperatures[:, 0], years], axis=1)  # one column it would move too far
    assert travelling_targets(wide).dtype == np.float32
