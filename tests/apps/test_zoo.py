"""The zoo's verdict: each user app with DQ at its defaults against Flower's FedAvg.

For every app of ``tests/apps`` (its data available), DQ's final central accuracy must be
within :data:`MARGIN` (2 points) of FedAvg's final accuracy or above, with at most a fifth
of FedAvg's uplink bytes (an app whose model weighs little beside its data states a larger
share, ``UPLINK_SHARE``, and why), and both must end well above chance (the majority class's share
of the test set plus half the gap to 100%). A regression app scores a loss instead (its
``METRIC``, lower is better): DQ's may be at most ``1 + TOLERANCE`` times FedAvg's (the
app justifies its tolerance), and both must end at most 3/4 of the loss of always
predicting the training mean (its ``chance_score()``). The runs here are sized for CI with the
in-process grid: apps whose full run is slow get fewer rounds (:data:`CI_ROUNDS`), the
same for both kinds, and the apps whose CI runs take a minute or more (:data:`SLOW`) run
with ``-m slow`` only; ``benchmarks/user_apps.py`` runs every app at full size through
Flower's simulation engine. Each pair of runs is made once and shared by the assertions.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np
import pytest

from tests.apps.runner import AppRun, dq_keeps_up, lower_is_better, run_app

APPS = ("fmnist_cnn", "digits_skew_mlp", "tabular_mlp", "fmnist_partial", "wine_raw",
        "giant_node", "many_small", "cancer_raw", "diabetes_regression", "tiny_nodes",
        "hapt_cnn", "cancer_binary", "diabetes_raw", "load_forecast",
        "digits_frozen", "tab_embeddings", "hf_tutorial", "keras_images", "hapt_stream",
        "onehot_labels", "cancer_sigmoid", "wine_dummies", "cancer_batchnorm",
        "fmnist_autoencoder", "large_site", "sensor_glitch", "huber_prices",
        "long_waves", "clinic_columns")
#: Rounds of the CI runs (None: the app's own ``ROUNDS``).
CI_ROUNDS = {"fmnist_cnn": 3, "digits_skew_mlp": None, "tabular_mlp": None,
             "fmnist_partial": 4, "wine_raw": None, "giant_node": None, "many_small": None,
             "cancer_raw": None, "diabetes_regression": None, "tiny_nodes": None,
             "hapt_cnn": 2, "cancer_binary": None, "diabetes_raw": None,
             "load_forecast": None, "digits_frozen": None, "tab_embeddings": None,
             "hf_tutorial": None, "keras_images": 3, "hapt_stream": None, "onehot_labels": None,
             "cancer_sigmoid": None, "wine_dummies": None,
             "cancer_batchnorm": None,
             "fmnist_autoencoder": None, "large_site": None,
             "sensor_glitch": None, "huber_prices": None,
             "long_waves": None, "clinic_columns": None}
#: The apps whose CI runs take a minute or more on 2 cores: ``slow`` (the others, unmarked,
#: are the suite's version of the check).
SLOW = ("fmnist_cnn", "hapt_cnn", "fmnist_partial", "giant_node", "many_small", "hf_tutorial",
        "keras_images", "hapt_stream", "fmnist_autoencoder")
PARAMS = [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
          for name in APPS]
#: DQ's final accuracy may trail FedAvg's by at most this much.
MARGIN = 0.02
#: DQ's uplink may be at most this share of FedAvg's.
UPLINK_SHARE = 1 / 5


def load(name: str):
    app = importlib.import_module(f"tests.apps.{name}")
    if not app.available():
        pytest.skip(f"{app.NAME}: its data is not available here")
    return app


@functools.cache
def runs(name: str) -> dict[str, AppRun]:
    """FedAvg's and DQ's runs of app ``name`` at its CI size (made once per session)."""
    app = load(name)
    return {kind: run_app(app, kind, CI_ROUNDS[name]) for kind in ("fedavg", "dq")}


def chance(app) -> float:
    """The accuracy of always answering the test set's most common class (or the app's
    ``chance_score()``: a regression app's loss of always predicting the training mean)."""
    if hasattr(app, "chance_score"):
        return float(app.chance_score())
    _, y = app.test_set()
    return float(np.bincount(np.asarray(y)).max() / len(y))


def describe(r: dict[str, AppRun]) -> str:
    fed, dq = r["fedavg"], r["dq"]
    return (f"FedAvg {fed.final:.3f} with {fed.up_bytes:,} B up, "
            f"DQ {dq.final:.3f} with {dq.up_bytes:,} B up")


def check_accuracy(app, r: dict[str, AppRun]) -> None:
    assert dq_keeps_up(app, r["fedavg"].final, r["dq"].final, MARGIN), (
        f"DQ trails FedAvg by more than its tolerance: {describe(r)}")


def check_uplink(r: dict[str, AppRun], share: float = UPLINK_SHARE) -> None:
    assert r["dq"].up_bytes > 0 and r["fedavg"].up_bytes > 0
    assert r["dq"].up_bytes <= share * r["fedavg"].up_bytes, (
        f"DQ's uplink is above {share:.0%} of FedAvg's: {describe(r)}")


def check_above_chance(app, r: dict[str, AppRun], rounds: int) -> None:
    floor = chance(app)
    if lower_is_better(app):
        floor *= 3 / 4
    else:
        floor += (1.0 - floor) / 2
    for kind, run in r.items():
        assert len(run.scores) == rounds + 1, f"{kind}: {run.scores}"  # round 0 too
        if lower_is_better(app):
            assert run.final <= floor, f"{kind} ends at {run.final:.3f}, not below {floor:.3f}"
        else:
            assert run.final >= floor, f"{kind} ends at {run.final:.3f}, not above {floor:.3f}"


@pytest.mark.parametrize("name", PARAMS)
def test_dq_accuracy_within_two_points_of_fedavg_or_above(name):
    check_accuracy(load(name), runs(name))


@pytest.mark.parametrize("name", PARAMS)
def test_dq_uplink_at_most_a_fifth_of_fedavgs(name):
    """A fifth, or the app's own ``UPLINK_SHARE`` where it says why (a model far smaller
    than its data)."""
    check_uplink(runs(name), getattr(load(name), "UPLINK_SHARE", UPLINK_SHARE))


@pytest.mark.parametrize("name", PARAMS)
def test_both_end_well_above_chance(name):
    app = load(name)
    check_above_chance(app, runs(name), CI_ROUNDS[name] or app.ROUNDS)


@pytest.mark.slow
def test_the_same_app_under_flowers_simulation_engine():
    """``tabular_mlp`` through ``flwr.simulation.run_simulation`` (Ray), both kinds."""
    app = load("tabular_mlp")
    r = {kind: run_app(app, kind, engine="simulation") for kind in ("fedavg", "dq")}
    check_accuracy(app, r)
    check_uplink(r)
    check_above_chance(app, r, app.ROUNDS)
