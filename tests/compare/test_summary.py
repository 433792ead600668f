"""The comparison summary's numbers: FedAvg's wire bits per coordinate (fraction-train
included) and the verdict's lower bound when no quantized-gradient baseline reaches the
target. Records are synthetic: every expected number is computed by hand here."""

import math

import pytest

from dq_flower import compare
from dq_flower.compare import LinkProfile, run_summaries, summary_markdown
from dq_flower.compare import run as compare_run
from dq_flower.compare.presets import Preset
from dq_flower.compare.summary import (
    coder_of_run,
    step_size_lines,
    time_table,
    verdict_extras,
)

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


def _results(runs, target=0.8, preset=None, **extra):
    """``results.json`` content; ``preset``: Preset fields, ``extra``: top-level keys."""
    preset = compare_run._preset_json(Preset(name="syn", target_accuracy=target,
                                             **(preset or {})))
    return {"format": compare.RESULTS_FORMAT, "preset": preset, "engine": "inprocess",
            "target_accuracy": target, "runs": runs, **extra}


def _failed(label, error="RuntimeError: boom", wall_s=3.0):
    """A failed run record as ``dq-flower compare`` writes it."""
    return {"label": label, "method": label, "family": "gradient", "failed": True,
            "status": "failed", "error": error, "config": {"codec": "qsgd"}, "history": [],
            "num_params": 0, "data_dim": 0, "wall_s": wall_s}


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


def test_a_lower_bound_from_the_only_quantized_baseline_speaks_of_no_others():
    runs = [_record("dq", [0.1, 0.5, 0.85, 0.9], 100, family="dq"),
            _record("qsgd", [0.1, 0.3, 0.5, 0.6], 1000)]
    text = summary_markdown(_results(runs))
    assert ("at least 15x (qsgd sent 3 kB without reaching 80.0%). More rounds would tell "
            "the real ratio.") in text
    assert "the others" not in text


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
    assert ("- Best quantized-gradient baseline to reach 80.0%: qsgd with 500 B: dq used 1x "
            "fewer uplink bytes.") in text.split("\n")
    assert ("- **Strongest competitor overall** (fewest uplink bytes to 80.0% of every other "
            "method): qsgd with 500 B: dq used 1x fewer uplink bytes.") in text.split("\n")
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


# ------------------------------------------------------------------ the whole summary.md text

HEADER = ("| method | D | d | uplink payload | coder | rounds | final acc | best acc "
          "| rounds to 80.0% | uplink to 80.0% | uplink vs {ref} | total uplink "
          "| total downlink | wall s |")
RULE = "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
EXPLAINED = (
    '"uplink vs {ref}" is the method\'s uplink bytes to reach the target divided by {ref}\'s: '
    'above 1x, {ref} needed fewer bytes; "> Nx (not reached)" divides all the bytes the '
    "method sent without reaching it. Bytes are measured from the serialized Flower "
    'messages; "uplink payload" counts the codec\'s exact bits (side information included) '
    "per uploaded sample or per model coordinate and upload, as sent (after the lossless "
    '"coder", applied per message where it shrinks it). "unstable": the final accuracy is '
    'more than 5 points below the best. "wall s" is the method\'s whole run, starting the '
    "engine (Ray, in simulation) included.")
PRIVACY = ("DQ uploads quantized raw training samples to the server: use it on trusted "
           "networks only; it is not a privacy mechanism.")


def _sections(results):
    """What :mod:`dq_flower.compare.summary` adds: (before the verdict, after its lines)."""
    stats = run_summaries(results)
    return (time_table(results, stats) + step_size_lines(results),
            verdict_extras(results, stats))


def test_the_whole_summary_of_a_comparison_line_by_line():
    # Prepare: dq reaches 80 % at round 2 with 200 B; qsgd (reused, unstable) and topk
    # reach it in round 1 with 300 B and 250 B; signsgd failed; sgd (another model size)
    # never reaches it
    dq = _record("dq", [0.1, 0.5, 0.85], 100, family="dq", config={"entropy-coder": "zlib"})
    qsgd = _record("qsgd", [0.1, 0.9, 0.84], 300,
                   config={"codec-params": "bits=4,entropy=zstd", "entropy-coder": "zlib"})
    qsgd.update(wall_s=12.34, reused=True)
    topk = _record("topk", [0.1, 0.8, 0.82], 250, codec="topk")
    topk["reused"] = True
    sgd = _record("sgd", [0.1, 0.6, 0.7], 1000, codec="identity")
    sgd.update(num_params=123_456, data_dim=64)
    failed = _failed("signsgd", error="RuntimeError: boom\n   at line 3")
    results = _results(
        [dq, qsgd, topk, failed, sgd],
        preset={"description": "Five methods on synthetic rows.", "partition": "dirichlet",
                "dirichlet_alpha": 0.3, "fraction_train": 0.5, "rounds": 3, "seed": 7},
        command="dq-flower compare syn --out x", total_wall_s=95.6,
        environment={"cpus": 16, "load_average": 2.345, "git_commit": "0123456789abcdef" * 2,
                     "git_modified": ["a.py", "b.py"]})
    before_verdict, after_verdict = _sections(results)
    # Execute
    text = summary_markdown(results)
    # Assert: sgd sends 16,000 bits over 2 rounds x 2 replies x 123,456 coordinates
    assert text.split("\n") == [
        "# Comparison: syn",
        "",
        "Five methods on synthetic rows.",
        "",
        "Scenario: data set `digits`, model `mlp`, 4 clients, `dirichlet` partition (alpha "
        "0.3), fraction-train 0.5, 3 rounds, seed 7, engine `inprocess`. Target test accuracy: "
        "80.0%.",
        "",
        "D = 1,000 model parameters, d = 10 data coordinates, D/d = 100; D = 123,456 model "
        "parameters, d = 64 data coordinates, D/d = 1,929.",
        "",
        HEADER.format(ref="dq"),
        RULE,
        "| dq | 1,000 | 10 | 200 b/sample (20.00 b/coord, 2 b quantizer) | zlib | 2 | 85.0% "
        "| 85.0% | 2 | 200 B | 1x | 200 B | 20 B | 1.0 |",
        "| qsgd | 1,000 | 10 | 1.2 b/coord | zstd | 2 | 84.0% **unstable** | 90.0% | 1 "
        "| 300 B | 1.5x | 600 B | 20 B | 12.3 |",
        "| topk | 1,000 | 10 | 1 b/coord | none | 2 | 82.0% | 82.0% | 1 | 250 B | 1.25x "
        "| 500 B | 20 B | 1.0 |",
        "| signsgd | - | - | - | - | - | failed | - | - | - | n/a | - | - | 3.0 |",
        "| sgd | 123,456 | 64 | 0.0324 b/coord | none | 2 | 70.0% | 70.0% | not reached "
        "| not reached | > 10x (not reached) | 2 kB | 20 B | 1.0 |",
        "",
        EXPLAINED.format(ref="dq"),
        "",
        *before_verdict,
        "## Verdict",
        "",
        "- dq reached 80.0% at round 2 with 200 B of uplink.",
        "- Best quantized-gradient baseline to reach 80.0%: topk with 250 B: dq used 1.25x "
        "fewer uplink bytes.",
        "- **Strongest competitor overall** (fewest uplink bytes to 80.0% of every other "
        "method): topk with 250 B: dq used 1.25x fewer uplink bytes.",
        "- Every other method that reached 80.0% needed more uplink bytes than dq.",
        "- Did not reach 80.0% within the rounds: sgd (best 70.0%).",
        "- Fewer rounds than dq to reach 80.0%: qsgd, topk.",
        *after_verdict,
        "",
        "## Failed runs",
        "",
        "- signsgd: RuntimeError: boom at line 3",
        "",
        PRIVACY,
        "",
        "Run: `dq-flower compare syn --out x`; total wall time 96 s; 16 CPU cores, load "
        "average 2.3 at the start; commit 0123456789 with 2 modified file(s); reused from an "
        "earlier invocation (`--resume`): qsgd, topk.",
        "",
    ]


def test_the_first_run_is_the_reference_without_dq_and_a_bare_results_ends_with_the_note():
    # Prepare: no dq run, no description, an iid partition, no command nor environment
    runs = [_record("qsgd", [0.1, 0.9], 500), _record("topk", [0.1, 0.4, 0.5], 400,
                                                      codec="topk")]
    results = _results(runs)
    before_verdict, after_verdict = _sections(results)
    # Execute
    text = summary_markdown(results)
    # Assert: topk sends 800 B without reaching 80 %: at least 1.6x qsgd's 500 B
    assert text.split("\n") == [
        "# Comparison: syn",
        "",
        "Scenario: data set `digits`, model `mlp`, 4 clients, `iid` partition, fraction-train "
        "1.0, 20 rounds, seed 0, engine `inprocess`. Target test accuracy: 80.0%.",
        "",
        "D = 1,000 model parameters, d = 10 data coordinates, D/d = 100.",
        "",
        HEADER.format(ref="qsgd"),
        RULE,
        "| qsgd | 1,000 | 10 | 2 b/coord | none | 1 | 90.0% | 90.0% | 1 | 500 B | 1x | 500 B "
        "| 10 B | 1.0 |",
        "| topk | 1,000 | 10 | 1.6 b/coord | none | 2 | 50.0% | 50.0% | not reached "
        "| not reached | > 1.6x (not reached) | 800 B | 20 B | 1.0 |",
        "",
        EXPLAINED.format(ref="qsgd"),
        "",
        *before_verdict,
        "## Verdict",
        "",
        "- qsgd reached 80.0% at round 1 with 500 B of uplink.",
        "- No quantized-gradient baseline reached 80.0% in these rounds, so the ratio to the "
        "best of them is a lower bound: at least 1.6x (topk sent 800 B without reaching "
        "80.0%). More rounds would tell the real ratio.",
        "- **Strongest competitor overall**: no other method reached 80.0%; qsgd used at least "
        "1.6x fewer uplink bytes than any of them (topk sent the least, 800 B).",
        "- No other method reached 80.0% within the rounds.",
        "- Did not reach 80.0% within the rounds: topk (best 50.0%).",
        *after_verdict,
        "",
        PRIVACY,
        "",
    ]


def test_when_every_method_failed_the_summary_says_so_and_gives_no_dimensions():
    results = _results([_failed("dq", error="ValueError: no data"), _failed("qsgd", wall_s=0)])
    before_verdict, after_verdict = _sections(results)
    text = summary_markdown(results)
    assert text.split("\n") == [
        "# Comparison: syn",
        "",
        "Scenario: data set `digits`, model `mlp`, 4 clients, `iid` partition, fraction-train "
        "1.0, 20 rounds, seed 0, engine `inprocess`. Target test accuracy: 80.0%.",
        "",
        "",
        "",
        HEADER.format(ref="dq"),
        RULE,
        "| dq | - | - | - | - | - | failed | - | - | - | n/a | - | - | 3.0 |",
        "| qsgd | - | - | - | - | - | failed | - | - | - | n/a | - | - | 0.0 |",
        "",
        EXPLAINED.format(ref="dq"),
        "",
        *before_verdict,
        "## Verdict",
        "",
        "- dq did not run successfully; no ratios to it can be given.",
        *after_verdict,
        "",
        "## Failed runs",
        "",
        "- dq: ValueError: no data",
        "- qsgd: RuntimeError: boom",
        "",
        "Every method failed: there is nothing to compare.",
        "",
        PRIVACY,
        "",
    ]


def _block(text, heading):
    """The lines after ``heading`` and its blank line, up to the next blank line."""
    lines = text.split("\n")
    start = lines.index(heading) + 2
    return lines[start:lines.index("", start)]


def _row(text, label):
    [row] = [line for line in text.split("\n") if line.startswith(f"| {label} |")]
    return row


def test_verdict_and_ratio_cells_when_dq_does_not_reach_the_target():
    runs = [_record("dq", [0.1, 0.4, 0.5], 100, family="dq"),
            _record("qsgd", [0.1, 0.9], 500),
            _record("topk", [0.1, 0.5, 0.8], 400, codec="topk")]
    results = _results(runs)
    text = summary_markdown(results)
    assert _block(text, "## Verdict")[:2] == [
        "- **dq did not reach 80.0%** in 2 rounds (best 50.0%, 200 B uplink); no byte ratio "
        "to it can be given.",
        "- Reached the target: qsgd (500 B), topk (800 B).",
    ]
    # no ratio to a reference that did not reach the target
    assert _row(text, "qsgd").endswith("| 1 | 500 B | n/a | 500 B | 10 B | 1.0 |")
    assert _row(text, "dq").endswith("| not reached | not reached | n/a | 200 B | 20 B | 1.0 |")


def test_a_reference_that_reaches_the_target_with_no_bytes_counts_as_one_byte():
    # dq's initial model already reaches 80 %: ratios divide by 1 byte, not by 0
    runs = [_record("dq", [0.85, 0.9], 100, family="dq"), _record("qsgd", [0.1, 0.9], 500)]
    text = summary_markdown(_results(runs))
    assert _block(text, "## Verdict")[:2] == [
        "- dq reached 80.0% at round 0 with 0 B of uplink.",
        "- Best quantized-gradient baseline to reach 80.0%: qsgd with 500 B: dq used 500x "
        "fewer uplink bytes."]
    assert "| 1 | 500 B | 500x | 500 B |" in _row(text, "qsgd")


def test_dq_is_the_reference_wherever_it_sits_in_the_run_order():
    runs = [_record("qsgd", [0.1, 0.9], 500), _record("dq", [0.1, 0.9], 100, family="dq")]
    text = summary_markdown(_results(runs))
    assert HEADER.format(ref="dq") in text.split("\n")
    assert "| 500 B | 5x | 500 B |" in _row(text, "qsgd")
    assert _block(text, "## Verdict")[0] == "- dq reached 80.0% at round 1 with 100 B of uplink."



def test_without_another_method_reaching_the_target_the_least_sending_one_sets_the_bound():
    # topk sent 400 B in total, qsgd 1,000 B; neither reached 80 %; dq needed 100 B
    runs = [_record("dq", [0.1, 0.9], 100, family="dq"),
            _record("qsgd", [0.1, 0.5, 0.6], 500),
            _record("topk", [0.1, 0.5, 0.6], 200, codec="topk")]
    verdict = _block(summary_markdown(_results(runs)), "## Verdict")
    assert verdict[2] == ("- **Strongest competitor overall**: no other method reached 80.0%; "
                          "dq used at least 4x fewer uplink bytes than any of them (topk sent "
                          "the least, 400 B).")

@pytest.mark.parametrize(("extra", "line"), [
    ({"command": "dq-flower compare syn"}, "Run: `dq-flower compare syn`."),
    ({"command": "c", "environment": None, "total_wall_s": 0.0}, "Run: `c`."),
    ({"command": "c", "environment": {"cpus": 2, "load_average": 0.0, "git_commit": "",
                                       "git_modified": []}},
     "Run: `c`; 2 CPU cores, load average 0.0 at the start."),
    ({"command": "c", "total_wall_s": 3600.4,
      "environment": {"git_commit": "abcdef0123456789", "git_modified": ["x.py"]}},
     "Run: `c`; total wall time 3600 s; commit abcdef0123 with 1 modified file(s)."),
])
def test_the_run_line_names_only_what_results_json_recorded(extra, line):
    runs = [_record("dq", [0.1, 0.9], 100, family="dq"), _record("qsgd", [0.1, 0.9], 500)]
    text = summary_markdown(_results(runs, **extra))
    assert text.endswith(f"{PRIVACY}\n\n{line}\n")


def test_the_run_line_without_a_command_gives_the_environment():
    runs = [_record("dq", [0.1, 0.9], 100, family="dq")]
    runs[0]["reused"] = True
    text = summary_markdown(_results(runs, environment={"cpus": 8}))
    last = text.split("\n")[-2]
    assert last == "Run: ; 8 CPU cores; reused from an earlier invocation (`--resume`): dq."


@pytest.mark.parametrize(("record", "coder"), [
    ({"family": "fedavg", "config": {"entropy-coder": "zlib"}}, "none"),  # Flower's own
    ({"family": "gradient", "config": {"entropy-coder": "zlib"}}, "zlib"),
    ({"family": "dq", "config": {"codec-params": "bits=4, entropy = zstd",
                                 "entropy-coder": "zlib"}}, "zstd"),
    ({"family": "gradient", "config": {"codec-params": "bits=4", "entropy-coder": "lzma"}},
     "lzma"),
    ({"family": "gradient", "config": {"codec-params": "bits=4"}}, "none"),
    ({"family": "gradient", "config": {"entropy-coder": None}}, "none"),
    ({"family": "gradient", "config": None}, "none"),
    ({"family": "gradient"}, "none"),
    ({"config": {"entropy-coder": "zlib"}}, "zlib"),  # no family recorded: a coded update
])
def test_the_coder_of_a_run(record, coder):
    assert coder_of_run(record) == coder


def test_the_table_gives_each_run_its_coder():
    runs = [_record("dq", [0.1, 0.9], 100, family="dq", config={"entropy-coder": "zlib"}),
            _record("qsgd", [0.1, 0.9], 500, config={"codec-params": "entropy=lzma"})]
    text = summary_markdown(_results(runs))
    assert "| zlib | 1 |" in _row(text, "dq") and "| lzma | 1 |" in _row(text, "qsgd")


def _timed(record, clients, server_s=0.25):
    for row in record["history"]:
        row.update(clients=clients, server_compute_s=server_s)
    return record


def test_time_to_target_and_total_time_per_link_profile():
    # Prepare: per round on "slow" (8 kbit/s down, 4 kbit/s up, 0.5 s round trip): 0.25 s
    # server + 0.5 s + the slowest client, 1 s compute + 8,000 / 8,000 s down + 4,000 /
    # 4,000 s up = 3.75 s; round 0 costs nothing
    links = [LinkProfile("slow", 8000.0, 4000.0, 0.5).to_json()]
    reaches = _timed(_record("dq", [0.1, 0.5, 0.85, 0.9], 100, family="dq"),
                     [[1.0, 1000, 500], [0.5, 0, 0]])
    misses = _timed(_record("qsgd", [0.1, 0.5, 0.6, 0.7], 100), [[1.0, 1000, 500]])
    untimed = _record("topk", [0.1, 0.9], 100)  # results written before the timing fields
    # Execute
    stats = run_summaries(_results([reaches, misses, untimed, _failed("x")], links=links))
    # Assert
    assert [(s["time_to_target"], s["total_time"]) for s in stats] == [
        ({"slow": 7.5}, {"slow": 11.25}), ({"slow": None}, {"slow": 11.25}),
        ({"slow": None}, {"slow": None}), ({}, {})]
    assert run_summaries(_results([reaches]))[0]["total_time"] == {}  # no links, no times


def test_statistics_of_a_failed_run_and_of_a_run_without_rounds():
    failed, empty = run_summaries(_results([
        _failed("topk", error="boom"),
        {"label": "sgd", "status": "ok", "history": []}]))
    assert math.isnan(failed.pop("final_accuracy")) and math.isnan(failed.pop("best_accuracy"))
    assert failed == {"label": "topk", "status": "failed", "rounds_to_target": None,
                      "up_bytes_to_target": None, "down_bytes_to_target": None,
                      "total_up_bytes": 0, "total_down_bytes": 0, "rounds": 0,
                      "unstable": False, "time_to_target": {}, "total_time": {},
                      "wall_s": 3.0, "error": "boom"}
    # a run that recorded no round is not failed: no error, no time
    assert math.isnan(empty.pop("final_accuracy")) and math.isnan(empty.pop("best_accuracy"))
    no_error = {k: v for k, v in failed.items() if k != "error"}
    assert empty == {**no_error, "label": "sgd", "status": "ok", "wall_s": 0.0}



def _rows(record, rows):
    """``record`` with rounds 1, 2, ... holding only the fields of ``rows`` (plus round,
    accuracy and bytes); round 0 kept."""
    record["history"] = record["history"][:1] + [
        {"round": r, "accuracy": 0.5, "up_bytes": 100, "cum_up_bytes": 100 * r,
         "cum_down_bytes": 10 * r, **row} for r, row in enumerate(rows, start=1)]
    return record


def test_gradient_rounds_without_payload_or_reply_counts_count_zero():
    # Prepare: round 2 lacks the fields (older results), round 3 holds nulls
    run = _rows(_record("qsgd", [0.1], 0), [
        {"up_payload_bits": 16000, "replies": 2, "up_raw_payload_bits": 24000},
        {"up_raw_payload_bits": 0},
        {"up_payload_bits": None, "replies": None, "up_raw_payload_bits": None}])
    # Execute
    unit = run_summaries(_results([run]))[0]["uplink"]
    # Assert: 16,000 bits / (2 replies x 1000), 24,000 raw bits likewise
    assert unit == {"unit": "coord", "bits": 8.0, "bits_per_coord": 8.0,
                    "configured_bits": None, "raw_bits_per_coord": 12.0}


def test_gradient_bits_without_any_reply_are_nan_not_a_division_error():
    run = _rows(_record("qsgd", [0.1], 0), [
        {"up_payload_bits": 800, "replies": 0, "up_raw_payload_bits": 800}])
    unit = run_summaries(_results([run]))[0]["uplink"]
    assert unit["unit"] == "coord"
    assert math.isnan(unit["bits"]) and math.isnan(unit["raw_bits_per_coord"])


def test_dq_rounds_without_payload_selected_or_reply_counts_count_zero():
    # Prepare: sample rounds 1-3 and gradient rounds 4-6; the second of each lacks the
    # fields, the third holds nulls
    run = _rows(_record("dq", [0.1], 0, family="dq"), [
        {"up_payload_bits": 1600, "selected": 4}, {},
        {"up_payload_bits": None, "selected": None},
        {"gradient_round": 1, "up_payload_bits": 8000, "replies": 2},
        {"gradient_round": 1},
        {"gradient_round": 1, "up_payload_bits": None, "replies": None}])
    # Execute
    unit = run_summaries(_results([run]))[0]["uplink"]
    # Assert: 1,600 bits / 4 samples = 400 b/sample over d = 10; 8,000 / (2 x 1000)
    assert unit == {"unit": "sample", "bits": 400.0, "bits_per_coord": 40.0,
                    "configured_bits": 2, "gradient_rounds": 3,
                    "gradient_bits_per_coord": 4.0}
    text = summary_markdown(_results([run]))
    assert ("| 400 b/sample (40.00 b/coord, 2 b quantizer); 4 b/coord in 3 gradient rounds |"
            in text)


def test_dq_without_sample_rounds_or_replies_gives_nan_and_the_table_the_gradient_only():
    run = _rows(_record("dq", [0.1], 0, family="dq"), [
        {"gradient_round": 1, "up_payload_bits": 8000, "replies": 2}])
    unit = run_summaries(_results([run]))[0]["uplink"]
    assert math.isnan(unit["bits"]) and math.isnan(unit["bits_per_coord"])
    assert (unit["gradient_rounds"], unit["gradient_bits_per_coord"]) == (1, 4.0)
    # one gradient round, singular
    assert "| 4 b/coord in 1 gradient round | none |" in _row(
        summary_markdown(_results([run])), "dq")
    no_replies = _rows(_record("dq", [0.1], 0, family="dq"), [
        {"up_payload_bits": 800, "selected": 4},
        {"gradient_round": 1, "up_payload_bits": 8000, "replies": 0}])
    assert math.isnan(run_summaries(_results([no_replies]))[0]["uplink"][
        "gradient_bits_per_coord"])


def test_dq_without_a_configured_bit_width_names_no_quantizer():
    run = _record("dq", [0.1, 0.9], 100, family="dq", config={"bits": None})
    assert "| 200 b/sample (20.00 b/coord) | none |" in _row(
        summary_markdown(_results([run])), "dq")


@pytest.mark.parametrize(("config", "replies_per_round"), [
    ({}, 1),                      # no num-partitions: one client, all of it sampled
    ({"num-partitions": 4}, 4),   # no fraction-train: every client
])
def test_fedavg_defaults_one_client_and_every_client_sampled(config, replies_per_round):
    run = _record("fedavg", [0.1, 0.5, 0.9], replies_per_round * 4 * D, family="fedavg",
                  codec=None)
    run["config"] = config
    unit = run_summaries(_results([run]))[0]["uplink"]
    assert unit == {"unit": "coord (wire)", "bits": 32.0, "bits_per_coord": 32.0,
                    "configured_bits": None}


def test_fedavg_is_measured_on_the_wire_even_when_payload_bits_are_reported():
    # the payload bits of a FedAvg record are not the codec's: they are ignored; a
    # gradient run that reports no payload bits is measured on the wire too
    fedavg = _record("fedavg", [0.1, 0.9], 2 * 4 * D, family="fedavg", codec=None)
    for row in fedavg["history"]:
        row["up_payload_bits"] = 1
    plain = _record("sgd", [0.1, 0.9], 2 * 4 * D, codec="identity")
    for row in plain["history"]:
        row["up_payload_bits"] = 0
    stats = run_summaries(_results([fedavg, plain]))
    assert [s["uplink"]["unit"] for s in stats] == ["coord (wire)", "coord (wire)"]
    assert [s["uplink"]["bits"] for s in stats] == [32.0, 32.0]


def test_fedavg_without_a_training_round_has_nan_bits():
    run = _record("fedavg", [0.1], 0, family="fedavg", codec=None)
    unit = run_summaries(_results([run]))[0]["uplink"]
    assert unit["unit"] == "coord (wire)" and math.isnan(unit["bits"])


def test_rounding_noise_between_raw_and_coded_bits_gives_no_before_coding_note():
    # 16 b/coord coded, 16 x (1 + 1e-11) before: float noise, not a coding gain
    grad = _record("qsgd", [0.1, 0.9], 4 * D)
    for row in grad["history"]:
        row["up_raw_payload_bits"] = row["up_payload_bits"] * (1 + 1e-11)
    text = summary_markdown(_results([grad]))
    assert "| 16 b/coord | none |" in _row(text, "qsgd")


def test_error_line_cuts_at_a_space_without_a_space_before_the_ellipsis():
    assert compare.error_line({"error": "x" * 296 + " yyyy"}) == "x" * 296 + "..."
    assert compare.error_line({"error": None}) == "unknown error"


def test_exactly_five_points_below_the_best_is_not_unstable():
    # 0.16 - 0.11 == 0.05 exactly in binary floating point
    assert compare.UNSTABLE_DROP == 0.16 - 0.11  # the premise of this test
    run = _record("sgd", [0.1, 0.16, 0.11], 100)
    assert not run_summaries(_results([run]))[0]["unstable"]
    assert "| 11.0% | 16.0% |" in _row(summary_markdown(_results([run])), "sgd")


def test_wall_time_falls_back_to_the_last_rounds_then_to_zero():
    run = _record("sgd", [0.1, 0.5, 0.6], 100)
    del run["wall_s"]
    assert run_summaries(_results([run]))[0]["wall_s"] == 2.0  # the last row's
    for row in run["history"]:
        del row["wall_s"]
    failed = _failed("x")
    del failed["wall_s"]
    assert [s["wall_s"] for s in run_summaries(_results([run, failed]))] == [0.0, 0.0]


def test_a_finished_run_without_any_round_gets_a_row_not_a_crash():
    # a record that is "ok" but has no history (no round was recorded)
    empty = {**_record("dq", [0.1, 0.9], 100, family="dq"), "history": []}
    text = summary_markdown(_results([empty, _record("qsgd", [0.1, 0.5], 10)]))
    assert "| dq | - | - | - | - | - | no rounds | - | - | - | n/a | - | - | 1.0 |" in text
    assert "**dq did not reach 80.0%**" in text


def test_gradient_bits_per_coordinate_count_the_replies_the_norm_screen_rejected():
    # 2 replies a round carry 8 x 500 payload bits; in round 2 the norm screen rejected
    # both (0 accepted, 2 coded): the bits per coordinate stay 4,000 / (2 x 1000) = 2, not
    # 8,000 / (2 x 1000) = 4 as they would dividing by the accepted replies only
    grad = _record("topk", [0.1, 0.5, 0.6], [0, 500, 500])
    for row in grad["history"]:
        row["coded_replies"] = 2
    grad["history"][2]["replies"] = 0
    results = _results([_record("dq", [0.1, 0.9], 100, family="dq"), grad])
    assert run_summaries(results)[1]["uplink"]["bits"] == pytest.approx(2.0)
    # an older record without coded_replies divides by its accepted replies
    for row in grad["history"]:
        del row["coded_replies"]
    assert run_summaries(results)[1]["uplink"]["bits"] == pytest.approx(4.0)


def test_dqs_gradient_rounds_count_the_replies_the_norm_screen_rejected():
    # DQ's gradient rounds: 8,000 payload bits a round from 4 decoded replies, 2 of them
    # accepted: 8,000 / (4 x 1000) = 2 b/coord, not 8,000 / (2 x 1000) = 4
    run = _rows(_record("dq", [0.1], 0, family="dq"), [
        {"up_payload_bits": 800, "selected": 4},
        {"gradient_round": 1, "up_payload_bits": 8000, "replies": 2, "coded_replies": 4}])
    assert run_summaries(_results([run]))[0]["uplink"]["gradient_bits_per_coord"] == 2.0
    del run["history"][-1]["coded_replies"]  # an older record: its accepted replies
    assert run_summaries(_results([run]))[0]["uplink"]["gradient_bits_per_coord"] == 4.0


def test_a_higher_target_gets_its_own_column_and_an_early_end_is_marked():
    dq = _record("dq", [0.1, 0.7, 0.85, 0.9], 100, family="dq")
    dq["history"][-1]["ended_early"] = True
    other = _record("qsgd", [0.1, 0.6, 0.82, 0.86, 0.87], 50)
    results = _results([dq, other], target=0.8, high_target_accuracy=0.88)
    stats = {s["label"]: s for s in run_summaries(results)}
    assert stats["dq"]["up_bytes_to_high"] == 300 and stats["dq"]["ended_early"]
    assert stats["qsgd"]["up_bytes_to_high"] is None and not stats["qsgd"]["ended_early"]
    text = summary_markdown(results)
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    assert "| uplink to 88.0% |" in header
    dq_row = next(line for line in text.splitlines() if line.startswith("| dq |"))
    qsgd_row = next(line for line in text.splitlines() if line.startswith("| qsgd |"))
    high_column = header.split("|").index(" uplink to 88.0% ")
    assert "| 3 (ended early) |" in dq_row
    assert dq_row.split("|")[high_column] == " 300 B "
    assert qsgd_row.split("|")[high_column] == " not reached "
    assert len(dq_row.split("|")) == len(header.split("|"))
    # the alignment line and a failed run's row have the higher target's column too
    lines = summary_markdown(_results([dq, other, _failed("sign")], target=0.8,
                                      high_target_accuracy=0.88)).splitlines()
    align = lines[lines.index(header) + 1]
    assert align == "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    failed_row = next(line for line in lines if line.startswith("| sign |"))
    assert failed_row == ("| sign | - | - | - | - | - | failed | - | - | - | n/a | - | - | - "
                          "| 3.0 |")
    assert ('"ended early": DQ\'s adaptive schedule stopped asking for samples and its '
            "training reached a plateau, so the run stopped before its last round. "
            '"unstable": the final accuracy is more than 5 points below the best.') in text
    plain = summary_markdown(_results([other], target=0.8))
    assert "uplink to 88" not in plain and '"ended early"' not in plain


def test_the_coder_column_names_the_coder_each_run_used():
    from dq_flower.compare.summary import coder_of_run

    def run(family, **config):
        return {"family": family, "config": config}

    assert coder_of_run(run("gradient", codec="qsgd", **{"entropy-coder": "context"})) == \
        "context"
    assert coder_of_run(run("gradient", codec="sign", **{"entropy-coder": "context"})) == "zlib"
    assert coder_of_run(run("compressed", codec="topk", **{"entropy-coder": "context"})) == \
        "zlib"
    assert coder_of_run(run("dq", **{"entropy-coder": "context"})) == "context"
    assert coder_of_run(run("fedavg", **{"entropy-coder": "zlib"})) == "none"
