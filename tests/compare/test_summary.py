"""The comparison summary's numbers: FedAvg's wire bits per coordinate (fraction-train
included) and the verdict's lower bound when no quantized-gradient baseline reaches the
target. Records are synthetic: every expected number is computed by hand here."""

import pytest

from dq_flower import compare
from dq_flower.compare import run as compare_run
from dq_flower.compare import run_summaries, summary_markdown
from dq_flower.compare.presets import Preset

D = 1000  # model parameters


def _record(label, accs, up_per_round, family="gradient", codec="qsgd", config=None):
    hist, cum = [], 0
    for r, acc in enumerate(accs):
        up = 0 if r == 0 else up_per_round
        cum += up
        hist.append({"round": r, "accuracy": acc, "loss": 1.0, "up_bytes": up,
                     "down_bytes": 10, "cum_up_bytes": cum, "cum_down_bytes": 10 * r,
                     "wall_s": float(r), "up_payload_bits": 8 * up, "replies": 2,
                     "selected": 4})
    if family == "fedavg":  # Flower's FedAvg reports no payload bits
        for row in hist:
            del row["up_payload_bits"], row["replies"], row["selected"]
    return {"label": label, "method": label, "family": family, "status": "ok", "error": "",
            "config": {"codec": codec, "bits": 2, "num-partitions": 2, **(config or {})},
            "num_params": D, "data_dim": 10, "history": hist, "wall_s": 1.0}


def _results(runs, target=0.8):
    preset = compare_run._preset_json(Preset(name="syn", target_accuracy=target))
    return {"format": compare.RESULTS_FORMAT, "preset": preset, "engine": "inprocess",
            "target_accuracy": target, "runs": runs}


@pytest.mark.parametrize(("clients", "fraction", "replies_per_round"), [
    (4, 1.0, 4),
    (4, 0.5, 2),
    (4, 0.3, 2),   # ceil(1.2): Flower samples at least the fraction
    (5, 0.1, 1),   # ceil(0.5) = 1
    (10, 0.25, 3),  # ceil(2.5)
])
def test_fedavg_bits_per_coordinate_are_wire_bits_per_reply_and_coordinate(
        clients, fraction, replies_per_round):
    # Prepare: 3 rounds; every reply carries D float32 weights plus 100 bytes of framing
    per_reply = 4 * D + 100
    run = _record("fedavg", [0.1, 0.5, 0.7, 0.9], replies_per_round * per_reply,
                  family="fedavg", codec=None,
                  config={"num-partitions": clients, "fraction-train": fraction})
    # Execute
    unit = run_summaries(_results([_record("dq", [0.1, 0.9], 100, family="dq"), run]))[1][
        "uplink"]
    # Assert: 8 bits a byte over (3 rounds x replies) x D coordinates: 32.8 b/coord
    assert unit["unit"] == "coord (wire)"
    assert unit["bits"] == pytest.approx(8 * per_reply / D) == unit["bits_per_coord"]
    assert unit["bits"] == pytest.approx(32.8)
    assert "| 32.80 b/coord (float32, wire) |" in summary_markdown(
        _results([_record("dq", [0.1, 0.9], 100, family="dq"), run]))


def test_gradient_and_dq_units_are_bits_per_coordinate_and_per_sample():
    # 3 rounds of 2 replies, 8 * 500 payload bits a round: 4000 / (2 * 1000) = 2 b/coord;
    # DQ: 8 * 300 bits a round for 4 samples: 600 b/sample, 60 b/coord (d = 10)
    stats = run_summaries(_results([_record("dq", [0.1, 0.5, 0.9, 0.9], 300, family="dq"),
                                    _record("qsgd", [0.1, 0.5, 0.6, 0.7], 500)]))
    assert stats[1]["uplink"]["bits"] == pytest.approx(2.0)
    assert stats[0]["uplink"]["bits"] == pytest.approx(600.0)
    assert stats[0]["uplink"]["bits_per_coord"] == pytest.approx(60.0)


def test_verdict_gives_a_lower_bound_when_no_quantized_baseline_reaches_the_target():
    # Prepare: dq reaches 80 % at round 2 with 200 bytes; qsgd (3,000 bytes in total) and
    # topk (1,200 bytes) never do; sgd (identity codec, 300 bytes) and fedavg (150 bytes)
    # are not quantized-gradient baselines and must not set the bound
    runs = [_record("dq", [0.1, 0.5, 0.85, 0.9], 100, family="dq"),
            _record("qsgd", [0.1, 0.3, 0.5, 0.6], 1000),
            _record("topk", [0.1, 0.2, 0.4, 0.5], 400, codec="topk"),
            _record("sgd", [0.1, 0.2, 0.3, 0.4], 100, codec="identity"),
            _record("fedavg", [0.1, 0.2, 0.3, 0.4], 50, family="fedavg", codec=None)]
    # Execute
    text = summary_markdown(_results(runs))
    # Assert: 1,200 / 200 = 6x, from the least-sending quantized baseline (topk)
    assert ("No quantized-gradient baseline reached 80.0% in these rounds, so the ratio to "
            "the best of them is a lower bound: at least 6x (topk sent 1.2 kB without "
            "reaching 80.0%; the others sent more)") in text
    assert "| > 6x (not reached) |" in text and "| > 15x (not reached) |" in text
    assert "Best quantized-gradient baseline" not in text
    assert "No other method reached 80.0% within the rounds." in text
    assert "Did not reach 80.0% within the rounds: qsgd (best 60.0%), topk (best 50.0%)" in text


def test_verdict_when_the_best_quantized_baseline_needs_fewer_bytes_than_dq():
    runs = [_record("dq", [0.1, 0.5, 0.85], 1000, family="dq"),
            _record("qsgd", [0.1, 0.9, 0.9], 500),
            _record("topk", [0.1, 0.5, 0.9], 400, codec="topk")]
    text = summary_markdown(_results(runs))
    # qsgd: 500 bytes to target, topk: 800; dq: 2,000 -> the best is qsgd at 0.25x
    assert ("Best quantized-gradient baseline to reach 80.0%: qsgd with 500 B: dq used more "
            "uplink bytes (qsgd needed only 0.25x of dq's).") in text
    assert "**dq does not win against qsgd (500 B, 0.25x), topk (800 B, 0.4x)**" in text
    assert "Fewer rounds than dq to reach 80.0%: qsgd." in text
