"""A user's text app (their tokenizer, model and ``datasets.Dataset``) in Flower's simulation
engine: DQ uploads the devices' windows once, losslessly, and the server's model learns."""

from __future__ import annotations

import warnings

import cloudpickle
import pytest

from dq_flower.text_input import token_windows
from tests.text import text_app


def _simulate(**knobs) -> dict:
    from flwr.simulation import run_simulation

    cloudpickle.register_pickle_by_value(text_app)  # Ray workers need not import tests/
    out: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app=text_app.make_server_app(2, out, **knobs),
                       client_app=text_app.make_client_app(),
                       num_supernodes=len(text_app.DEVICES),
                       backend_config={"client_resources": {"num_cpus": 1},
                                       "init_args": {"num_cpus": 2,
                                                     "include_dashboard": False}})
    return out


def test_dq_trains_a_users_text_app_in_flowers_simulation_engine():
    out = _simulate(max_server_steps=200, optimizer="adam", lr=0.01)
    first, *_, last = out["perplexity"]
    assert last < 0.4 * first  # measured on Python 3.11: 100.1 -> 27.5
    windows = sum(len(token_windows(text_app.device_text(k), text_app.WINDOW,
                                    tokenizer=text_app.CharTokenizer())[0])
                  for k in range(len(text_app.DEVICES)))
    # the first ask is 200 windows shared by the three devices (120 sent: one holds fewer),
    # the second doubles the store: 240 of the 309 windows, each once
    assert 200 // 3 < out["stored"] < windows
    # the uplink, messages and all, is smaller than the text itself (lossless coding)
    assert 0 < out["up_bytes"] < text_app.text_bytes()


@pytest.mark.slow
def test_dq_at_its_defaults_trains_a_users_text_app():
    out = _simulate()  # the server's phase at its defaults: about 40 s in-process
    first, *_, last = out["perplexity"]
    assert last < 0.4 * first  # measured in-process on Python 3.11: 100.1 -> 28.6
    assert 0 < out["up_bytes"] < text_app.text_bytes()
