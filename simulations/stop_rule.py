"""False stops of DQ's adaptive schedule on simulated learning curves, old rule against new.

A learning curve ``e(N) = a N^-b`` (error at store size ``N``) with the gain per doubling
``e(N) (1 - 2^-b)`` given at a reference size. Each upload round the schedule's ask grows
the store from ``N0`` to ``N1``; the server's held-out rows (a tenth of the store) are
scored by the model before and after, each a fresh draw of the training noise
(``tau``: the standard deviation of a trained model's error around the curve, from SGD
and from where the plateau phase stops), and the rows' outcomes are paired: rows both
models get wrong, rows only one of them gets wrong, plus a ``churn`` of rows on which the
two models err independently (as two trainings of one model do: about 10% of the rows
then tell them apart). The comparison's figures go to
:class:`~dq_flower.dq.server.schedule.AdaptiveSchedule` exactly as the server gives them.

- **new rule**: :class:`~dq_flower.dq.server.schedule.AdaptiveSchedule` as the server runs it
  (every held-out row, per doubling, pooled, 95% bound, two comparisons at least);
- **old rule** (before this change): the rows held out of the round's own uploads only,
  stop at once when ``gain + 1 stderr < min_gain``.

A *false stop* is a stop while the true gain per doubling at the store's size is above
``min_gain``; on a flat curve (``b = 0``) every stop is right and the figure is how often
the schedule stops within the rounds given.

    .venv/bin/python simulations/stop_rule.py --trials 2000
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.schedule import AdaptiveSchedule, PairedGain

HOLDOUT = 0.1
#: The store's largest growth a round: the package's default.
MAX_GROWTH = DQConfig().max_growth


@dataclass(frozen=True)
class Curve:
    """``e(N) = error_at_ref * (N / ref)^-b``, with ``b`` from the gain per doubling at ``ref``."""

    error_at_ref: float
    gain_per_doubling: float  # at ``ref``; 0: a flat curve
    ref: int = 1000
    tau: float = 0.005  # training noise of a model's error
    churn: float = 0.3  # share of rows on which two trainings err independently

    @property
    def b(self) -> float:
        return -math.log2(1 - self.gain_per_doubling / self.error_at_ref)

    def error(self, n: float) -> float:
        return self.error_at_ref * (n / self.ref) ** -self.b

    def true_gain(self, n: float) -> float:
        """The gain of doubling the store at ``n``."""
        return self.error(n) - self.error(2 * n)


def paired_rows(e0: float, e1: float, churn: float, n: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Correct-or-not of the old and the new model on ``n`` paired rows."""
    u = rng.random(n)
    old_wrong, new_wrong = u < e0, u < e1  # nested: the new model errs on easier rows less
    # on a ``churn`` share of rows the two trainings err independently (same marginals)
    own = rng.random(n) < churn
    old_wrong = np.where(own, rng.random(n) < e0, old_wrong)
    new_wrong = np.where(own, rng.random(n) < e1, new_wrong)
    return ~old_wrong, ~new_wrong


def comparison(curve: Curve, n0: int, n1: int, rows: int, rng: np.random.Generator
               ) -> PairedGain:
    """The paired gain of the model trained on ``n1`` rows over the one on ``n0``."""
    e0 = float(np.clip(curve.error(n0) + curve.tau * rng.standard_normal(), 0, 1))
    e1 = float(np.clip(curve.error(n1) + curve.tau * rng.standard_normal(), 0, 1))
    old, new = paired_rows(e0, e1, curve.churn, max(rows, 1), rng)
    diff = new.astype(float) - old.astype(float)  # +1 where only the new one is right
    n = diff.size
    var = max(float(diff.var(ddof=1)) if n > 1 else math.inf, 1.0 / (n + 1))
    return PairedGain(float(diff.mean()), math.sqrt(var / n), 1 - old.mean(),
                      1 - new.mean(), n)


def run_new(curve: Curve, first: int, rounds: int, min_gain: float, min_rows: int,
            rng: np.random.Generator, max_growth: float = MAX_GROWTH) -> tuple[bool, int]:
    """Whether (and at which store size) the schedule stopped on a flat verdict."""
    s = AdaptiveSchedule(min_gain=min_gain, max_growth=max_growth, min_rows=min_rows,
                         probe_after=0)
    n = first
    s.after_upload(0, n, None)
    for _ in range(rounds - 1):
        ask = s.round_ask(n)
        if ask <= 0:
            break
        n1 = n + ask
        s.after_upload(n, n1, comparison(curve, n, n1, int(HOLDOUT * n1), rng))
        n = n1
        if s.flat:
            return True, n
    return False, n


def run_old(curve: Curve, first: int, rounds: int, min_gain: float,
            rng: np.random.Generator) -> tuple[bool, int]:
    """The rule before this change: fresh held-out rows only, one-sigma bound, at once."""
    n, ask = first, math.ceil(first * 0.5)
    for _ in range(rounds - 1):
        n1 = n + ask
        g = comparison(curve, n, n1, int(HOLDOUT * (n1 - n)), rng)
        if g.gain + g.stderr < min_gain:
            return True, n1
        n, ask = n1, math.ceil(n1 * 0.5)
    return False, n


def rates(curve: Curve, *, first: int = 500, rounds: int = 8, min_gain: float = 0.005,
          min_rows: int = 100, trials: int = 500, seed: int = 0,
          max_growth: float = MAX_GROWTH) -> dict[str, float]:
    """Share of trials each rule stopped in, and stopped falsely (true gain > min_gain).

    ``max_growth``: the new rule's (the package's default; the old rule grew by half).
    """
    rng = np.random.default_rng(seed)
    out = {"new_stop": 0.0, "new_false": 0.0, "old_stop": 0.0, "old_false": 0.0}
    for _ in range(trials):
        for name, run in (("new", lambda: run_new(curve, first, rounds, min_gain,
                                                   min_rows, rng, max_growth)),
                          ("old", lambda: run_old(curve, first, rounds, min_gain, rng))):
            stopped, n = run()
            out[f"{name}_stop"] += stopped / trials
            out[f"{name}_false"] += (stopped and curve.true_gain(n) > min_gain) / trials
    return out


CURVES = {
    "steep (3 points per doubling at 1,000)": Curve(0.20, 0.03),
    "flattening (1 point per doubling at 1,000)": Curve(0.15, 0.01),
    "flat (0 per doubling)": Curve(0.10, 0.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-growth", type=float, default=MAX_GROWTH)
    args = parser.parse_args()
    print(f"{args.trials} trials per curve, {args.rounds} rounds, first upload 500 rows, "
          f"max-growth {args.max_growth:g}, min-gain 0.005, held-out a tenth of the store, "
          "training noise 0.5 points")
    print("| curve | new rule: stops | new rule: false stops | old rule: stops | "
          "old rule: false stops |")
    print("|---|---:|---:|---:|---:|")
    for name, curve in CURVES.items():
        r = rates(curve, rounds=args.rounds, trials=args.trials, seed=args.seed,
                  max_growth=args.max_growth)
        print(f"| {name} | {r['new_stop']:.1%} | {r['new_false']:.1%} | "
              f"{r['old_stop']:.1%} | {r['old_false']:.1%} |")


if __name__ == "__main__":
    main()
