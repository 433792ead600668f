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
    """A run record; ``up_per_round`` is one number for every round, or a list (round 0 on)."""
    ups = (up_per_round if isinstance(up_per_round, list)
           else [0] + [up_per_round] * (len(accs) - 1))
    hist, cum = [], 0
    for r, acc in enumerate(accs):
        up = ups[r]
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
    # Prepare: 3 rounds whose replies carry D float32 weights plus 100, 300 and 500 bytes
    # of framing; round 0 (before training) carries bytes that must not count
    per_reply = [4 * D + 100, 4 * D + 300, 4 * D + 500]
    run = _record("fedavg", [0.1, 0.5, 0.7, 0.9],
                  [7777] + [replies_per_round * b for b in per_reply], family="fedavg",
                  codec=None, config={"num-partitions": clients, "fraction-train": fraction})
    results = _results([_record("dq", [0.1, 0.9], 100, family="dq"), run])
    # Execute
    unit = run_summaries(results)[1]["uplink"]
    # Assert: 8 bits a byte over (3 rounds x replies) x D coordinates: 34.4 b/coord
    assert unit["unit"] == "coord (wire)"
    assert unit["bits"] == pytest.approx(8 * sum(per_reply) / (3 * D)) == unit["bits_per_coord"]
    assert unit["bits"] == pytest.approx(34.4)
    assert "| 34.40 b/coord (float32, wire) |" in summary_markdown(results)


def test_gradient_and_dq_units_are_bits_per_coordinate_and_per_sample():
    # gradient: 2 replies a round, 8 x (400, 500, 600) payload bits in rounds 1-3 (round 0's
    # 8 x 9,999 do not count): 12,000 / (3 x 2 x 1000) = 2 b/coord; before the lossless
    # coder 3 b/coord
    grad = _record("qsgd", [0.1, 0.5, 0.6, 0.7], [9999, 400, 500, 600])
    for row in grad["history"]:
        row["up_raw_payload_bits"] = 1.5 * row["up_payload_bits"]
    # DQ: 8 x (300, 500) bits for 4 and 6 samples: 6,400 / 10 = 640 b/sample, 64 b/coord
    dq = _record("dq", [0.1, 0.5, 0.9], [5000, 300, 500], family="dq")
    dq["history"][2]["selected"] = 6
    results = _results([dq, grad])
    stats = run_summaries(results)
    assert stats[1]["uplink"]["bits"] == pytest.approx(2.0)
    assert stats[1]["uplink"]["raw_bits_per_coord"] == pytest.approx(3.0)
    assert stats[0]["uplink"]["bits"] == pytest.approx(640.0)
    assert stats[0]["uplink"]["bits_per_coord"] == pytest.approx(64.0)
    assert stats[0]["uplink"]["configured_bits"] == 2
    text = summary_markdown(results)
    assert "| 2 b/coord (3 before coding) |" in text
    assert "| 640 b/sample (64.00 b/coord, 2 b quantizer) |" in text


def test_run_statistics_of_a_run_and_of_a_failed_one():
    run = _record("qsgd", [0.1, 0.85, 0.7, 0.82], [0, 100, 200, 300])
    run["wall_s"] = 12.5
    failed = {"label": "topk", "method": "topk", "family": "gradient", "failed": True,
              "error": "boom", "config": {}, "wall_s": 3.0}
    ok, bad = run_summaries(_results([run, failed], target=0.8))
    assert (ok["final_accuracy"], ok["best_accuracy"], ok["rounds"]) == (0.82, 0.85, 3)
    assert (ok["rounds_to_target"], ok["up_bytes_to_target"], ok["down_bytes_to_target"]) == (
        1, 100, 10)
    assert (ok["total_up_bytes"], ok["total_down_bytes"], ok["wall_s"]) == (600, 30, 12.5)
    assert ok["status"] == "ok" and not ok["unstable"]  # 3 points below its best
    assert bad == {**bad, "status": "failed", "rounds_to_target": None, "total_up_bytes": 0,
                   "rounds": 0, "wall_s": 3.0, "error": "boom"}
    assert bad["final_accuracy"] != bad["final_accuracy"]  # nan
    unstable = _record("sgd", [0.1, 0.9, 0.84], 100)
    assert run_summaries(_results([unstable]))[0]["unstable"]  # 6 points below its best


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


def test_boundaries_reaching_exactly_the_target_and_ties_with_dq():
    # accuracy exactly 0.8 reaches a target of 0.8; a method with exactly dq's bytes to the
    # target does not lose to dq ("no more uplink bytes than dq")
    runs = [_record("dq", [0.1, 0.8], 500, family="dq"),
            _record("qsgd", [0.1, 0.8], 500)]
    stats = run_summaries(_results(runs, target=0.8))
    assert [s["rounds_to_target"] for s in stats] == [1, 1]
    text = summary_markdown(_results(runs, target=0.8))
    assert "dq used 1x fewer uplink bytes." in text
    assert "**dq does not win against qsgd (500 B, 1x)**" in text


def test_gradient_rounds_of_dq_and_coding_notes_in_the_table():
    run = _record("dq-auto", [0.1, 0.5, 0.6, 0.7], 100, family="dq")
    for row in run["history"][2:]:
        row.update({"gradient_round": 1, "up_payload_bits": 8000, "selected": 0})
    text = summary_markdown(_results([run]))
    assert "200 b/sample (20.00 b/coord, 2 b quantizer); 4 b/coord in 2 gradient rounds" in text
    # payload bits equal before and after the lossless coder: no "before coding" note
    grad = _record("qsgd", [0.1, 0.5], 500)
    for row in grad["history"]:
        row["up_raw_payload_bits"] = row["up_payload_bits"]
    text = summary_markdown(_results([_record("dq", [0.1, 0.9], 100, family="dq"), grad]))
    assert "| 2 b/coord |" in text and "before coding" not in text


def test_error_line_keeps_a_line_of_exactly_the_limit():
    assert compare.error_line({"error": "x" * 300}) == "x" * 300
    assert compare.error_line({"error": "x" * 301}) == "x" * 297 + "..."
    assert compare.error_line({"error": "  ValueError:\n  boom  "}) == "ValueError: boom"
    assert compare.is_failed({"status": "failed"}) and not compare.is_failed({})
