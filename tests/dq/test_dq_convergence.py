"""DQ convergence on real and synthetic data (seeded, CI-sized)."""

import numpy as np

from .helpers import run_inprocess

SEEDS = (0, 1, 2, 3, 4, 5)


def _separable(n=1200, d=20, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, 3))
    x = rng.random((n, d)).astype(np.float32)
    logits = (x - 0.5) @ w
    y = logits.argmax(1)
    return x, y


def test_logreg_reaches_full_precision_loss():
    # One compensated step per round on a fresh batch (resend on): with a lossless
    # compensation this is exactly minibatch SGD on the true data. Three seeds, each with
    # three runs: full precision (identity compensation), 4-level QSGD compensation, and
    # the uncompensated control (2-bit data alone).
    x, y = _separable()
    data = (x[:1000], y[:1000], x[1000:], y[1000:])
    common = dict(dataset=data, model="logreg", num_clients=2, rounds=40, budget=50,
                  server_steps=1, lr=1.0, momentum=0.5, weight_decay=0.0, resend=True,
                  bits=2, upload_schedule="fixed", stochastic=True)
    gaps_quant, gaps_plain = [], []
    for seed in SEEDS[:3]:
        full, _ = run_inprocess(compensation="identity", seed=seed, **common)
        quant, _ = run_inprocess(compensation="qsgd", compensation_params="levels=4",
                                 seed=seed, **common)
        plain, _ = run_inprocess(seed=seed, **common)
        assert quant.history[-1]["loss"] < quant.history[0]["loss"] - 0.3  # it trains
        gaps_quant.append(quant.history[-1]["loss"] - full.history[-1]["loss"])
        gaps_plain.append(plain.history[-1]["loss"] - full.history[-1]["loss"])
    gaps_quant, gaps_plain = np.array(gaps_quant), np.array(gaps_plain)
    # The effect: without compensation the final loss is 0.04 to 0.05 nats above full
    # precision (measured 0.053, 0.040, 0.043) on every seed; require 0.025.
    assert (gaps_plain > 0.025).all(), gaps_plain
    # The claim: QSGD compensation closes most of that gap (measured 0.0035, 0.0018, 0.0:
    # 7 % of it). Require it to close 3/4 on average and half on every seed.
    assert gaps_quant.mean() < 0.25 * gaps_plain.mean(), (gaps_quant, gaps_plain)
    assert (gaps_quant < 0.5 * gaps_plain).all(), (gaps_quant, gaps_plain)


def test_mlp_on_digits_reaches_95_percent_with_2bit_data():
    result, _ = run_inprocess(num_clients=4, rounds=8, bits=2, budget=64, server_steps=40,
                              lr=0.05, upload_schedule="fixed", stochastic=True)
    assert result.history[-1]["accuracy"] >= 0.95


def test_importance_half_budget_close_to_uniform_full_budget():
    # Six seeds, three arms: uniform selection at the full budget (16 samples per client
    # and round), uniform at half the budget (the control) and loss-proportional sampling
    # at half the budget. Accuracy after 4 rounds, averaged over the seeds (the digits test
    # set has 360 samples: one sample is 0.28 points).
    common = dict(num_clients=4, rounds=4, bits=2, server_steps=40, lr=0.05,
                  upload_schedule="fixed", stochastic=True)
    arms = {"full": dict(budget=16), "half": dict(budget=8),
            "important": dict(budget=8, scorer="loss", selection_rule="sample")}
    acc, bits, wire = ({arm: [] for arm in arms} for _ in range(3))
    for seed in SEEDS:
        for arm, knobs in arms.items():
            result, _ = run_inprocess(seed=seed, **knobs, **common)
            acc[arm].append(result.history[-1]["accuracy"])
            bits[arm].append(sum(r["up_payload_bits"] for r in result.history[1:]))
            wire[arm].append(result.history[-1]["cum_up_bytes"])
    mean = {arm: float(np.mean(v)) for arm, v in acc.items()}
    # The control: halving the budget with uniform selection costs accuracy (measured
    # 2.4 points: 0.929 -> 0.905); require 1.5 points, else "close to full" means nothing.
    assert mean["full"] - mean["half"] >= 0.015, mean
    # The claim: importance sampling at half the budget is within 1 point of the full
    # budget (measured 0.3 points below it) and recovers at least half of the control's
    # loss (measured 87 %).
    assert mean["important"] >= mean["full"] - 0.01, mean
    assert mean["important"] - mean["half"] >= 0.5 * (mean["full"] - mean["half"]), mean
    # ... for half the samples: 0.68x the uplink payload bits (importance weights travel
    # as one float32 per row, uniform ones as a single float; the per-row ranges of both
    # arms are zlib-coded) and 0.92x the wire bytes (each reply also carries metrics and
    # record headers)
    ratio_bits = np.sum(bits["important"]) / np.sum(bits["full"])
    ratio_wire = np.sum(wire["important"]) / np.sum(wire["full"])
    assert ratio_bits < 0.72 and ratio_wire < 0.95, (ratio_bits, ratio_wire)


def test_compensation_helps_1bit_data():
    # 1-bit rows lose most of the signal of this synthetic set; the compensation (fp16)
    # restores the true-data gradient of each fresh batch.
    x, y = _separable()
    data = (x[:1000], y[:1000], x[1000:], y[1000:])
    common = dict(dataset=data, model="logreg", num_clients=2, rounds=40, bits=1, budget=50,
                  server_steps=1, lr=1.0, momentum=0.5, weight_decay=0.0, resend=True,
                  upload_schedule="fixed", stochastic=True)
    plain, _ = run_inprocess(**common)
    compensated, _ = run_inprocess(compensation="fp16", **common)
    # Measured here: 0.69 without and 0.45 with compensation; require a 0.1 nat gap.
    assert compensated.history[-1]["loss"] < plain.history[-1]["loss"] - 0.1
    assert compensated.history[-1]["accuracy"] > plain.history[-1]["accuracy"]
