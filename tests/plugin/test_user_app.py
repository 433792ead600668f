"""Acceptance: a user's own Flower app (own model, own standardized tabular data) run by
Flower's own ``run_simulation`` trains with DQStrategy + dq_train as well as FedAvg.

FedAvg, the reference, runs the same ServerApp and ClientApp on the in-process grid (no
second Ray start): its accuracy in every round and its bytes are those of Flower's
simulation engine (measured: identical).
"""

from __future__ import annotations

import warnings

import cloudpickle
import numpy as np
import pytest
import torch

from . import user_app


def _simulate(kinds: tuple[str, ...]) -> dict:
    """Each kind's run of the user app (12 rounds) in Flower's simulation engine."""
    from flwr.simulation import run_simulation

    cloudpickle.register_pickle_by_value(user_app)  # Ray workers need not import tests/
    out: dict = {}
    for kind in kinds:
        out[kind] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(server_app=user_app.make_server_app(kind, 12, out[kind]),
                           client_app=user_app.make_client_app(kind),
                           num_supernodes=user_app.NUM_NODES,
                           backend_config={"client_resources": {"num_cpus": 1},
                                           "init_args": {"num_cpus": 2,
                                                         "include_dashboard": False}})
    return out


def _inprocess(kind: str) -> dict:
    """The user app's run of ``kind`` (12 rounds) on the in-process grid."""
    from flwr.app import Context, RecordDict

    from dq_flower.harness.inprocess import InProcessGrid

    out: dict = {}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    user_app.make_server_app(kind, 12, out)(
        InProcessGrid(user_app.make_client_app(kind), user_app.NUM_NODES), context)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {**_simulate(("dq",)), "fedavg": _inprocess("fedavg")}


def test_dq_trains_a_user_app_to_within_two_points_of_fedavg(runs):
    dq, fedavg = runs["dq"], runs["fedavg"]
    assert len(dq["accuracy"]) == 13  # rounds 0..12, evaluated by the user's evaluate_fn
    assert dq["accuracy"][-1] >= fedavg["accuracy"][-1] - 0.02, (dq["accuracy"],
                                                                 fedavg["accuracy"])
    assert dq["accuracy"][-1] > 0.9  # far above the majority class (about 0.63)
    raw_float32 = 455 * 30 * 4  # every training sample as float32 features
    assert 0 < dq["up_bytes"] < raw_float32


def test_result_arrays_are_the_trained_model(runs):
    model = user_app.Net()
    model.load_state_dict(runs["dq"]["state"])
    xt, yt = user_app.test_set()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())
    assert acc == pytest.approx(runs["dq"]["accuracy"][-1])
    assert not np.allclose(runs["dq"]["accuracy"][0], acc)


@pytest.mark.slow  # a third simulation; tests/baselines runs a gradient baseline under Ray
def test_gradient_strategy_with_ef_sign_learns_a_user_app(runs):
    ef, fedavg = _simulate(("ef-sign",))["ef-sign"], runs["fedavg"]
    assert ef["accuracy"][-1] >= fedavg["accuracy"][-1] - 0.05, (ef["accuracy"],
                                                                 fedavg["accuracy"])
    assert ef["up_bytes"] < runs["fedavg"]["up_bytes"] / 10  # 1 bit vs 32 per coordinate
