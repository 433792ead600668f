"""One real Flower simulation (Ray backend), 2 clients, 2 rounds, DQ at its defaults.

The fixed schedule's stored counts are checked in-process (``tests/dq/test_adaptive_schedule``
and the reference histories); one Ray start here covers the engine's path for both.
"""

import dq_flower


def test_dq_at_its_defaults_runs_in_flowers_simulation_engine():
    result = dq_flower.simulate(method="dq", dataset="digits", model="mlp", num_clients=2,
                                rounds=2, seed=1, budget=32, min_holdout_rows=2,
                                max_server_steps=200, max_server_epochs=1)
    rows = result.history
    assert [r["round"] for r in rows] == [0, 1, 2]
    for key in ("accuracy", "loss", "up_bytes", "down_bytes", "cum_up_bytes",
                "cum_down_bytes", "wall_s"):
        assert key in rows[-1]
    assert rows[1]["up_bytes"] > 0 and rows[1]["down_bytes"] > 0
    assert rows[2]["cum_up_bytes"] == rows[1]["up_bytes"] + rows[2]["up_bytes"]
    # measured bytes cover the payload bits
    assert 8 * rows[1]["up_bytes"] >= rows[1]["up_payload_bits"] > 0
    # the first ask holds out 2 rows per class at 10%: 200 in all, then growth 2
    assert rows[1]["stored"] == 200 and rows[2]["stored"] == 400
    assert 0 < rows[1]["server_steps"] <= 200 and rows[1]["holdout_rows"] > 0
    assert rows[2]["accuracy"] > rows[0]["accuracy"]
