"""Time on links: profiles, the time model on a hand-computed example, the measured fields,
the summary's table and the plot."""

from __future__ import annotations

import pytest

from dq_flower.compare import write_reports
from dq_flower.compare.links import (
    BUILTIN_LINKS,
    LinkProfile,
    cumulative_times,
    parse_link,
    parse_links,
    round_time,
    time_to_target,
)
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from tests.compare.test_compare import _results, _run


def test_builtin_and_user_profiles():
    assert parse_link("lte") == LinkProfile("lte", 10e6, 1e6, 0.05)
    assert BUILTIN_LINKS["wifi"] == LinkProfile("wifi", 50e6, 20e6, 0.01)
    assert parse_link("datacenter").rtt_s == pytest.approx(1e-4)
    sat = parse_link("sat=20Mbit/2mbps/0.6s")
    assert (sat.name, sat.down_bps, sat.up_bps, sat.rtt_s) == ("sat", 20e6, 2e6, 0.6)
    assert parse_link(" slow = 512kbit/64kbit/250ms ").up_bps == 64e3
    assert [x.name for x in parse_links([])] == ["lte", "wifi", "datacenter"]


@pytest.mark.parametrize(("spec", "message"), [
    ("5g", "unknown link"), ("x=1mbit/1mbit", "down/up/latency"), ("x=1mb/1mbit/1ms", "unit"),
    ("x=0mbit/1mbit/1ms", "positive"), ("x=1mbit/1mbit/-1ms", "unit"),
    ("bad name=1mbit/1mbit/1ms", "link name"),
])
def test_bad_profiles_are_refused_with_the_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_link(spec)
    with pytest.raises(ValueError, match="unique"):
        parse_links(["lte", "lte"])


def test_round_time_on_a_hand_computed_example():
    # Prepare: two clients; 10 Mbit/s down, 1 Mbit/s up, 50 ms round trip
    link = LinkProfile("t", 10e6, 1e6, 0.05)
    row = {"round": 1, "server_compute_s": 0.2,
           "clients": [[0.5, 125_000, 12_500],     # 0.5 + 0.1 (1 Mbit down) + 0.1 (0.1 Mbit up)
                       [0.3, 125_000, 125_000]]}   # 0.3 + 0.1 + 1.0 = 1.4: the slowest
    # Execute / Assert: 0.2 server + 0.05 round trip + 1.4
    assert round_time(row, link) == pytest.approx(1.65)
    # a round in which nobody replied (DQ training on its store) costs the server's time
    assert round_time({"round": 2, "server_compute_s": 0.3, "clients": []}, link) == 0.3
    assert round_time({"round": 0}, link) == 0.0
    assert round_time({"round": 1, "accuracy": 0.5}, link) is None  # older results
    history = [{"round": 0, "accuracy": 0.1}, {**row, "accuracy": 0.5},
               {"round": 2, "server_compute_s": 0.3, "clients": [], "accuracy": 0.9}]
    assert cumulative_times(history, link) == pytest.approx([0.0, 1.65, 1.95])
    assert time_to_target(history, link, 0.9) == pytest.approx(1.95)
    assert time_to_target(history, link, 0.95) is None


def test_every_round_records_each_clients_measured_compute_and_bytes():
    result = run_server(InProcessGrid(client_app, 2),
                        build_run_config("qsgd", num_clients=2, rounds=2))
    for row in result.history[1:]:
        assert len(row["clients"]) == 2 and row["server_compute_s"] > 0
        assert row["client_time_s"] == max(c[0] for c in row["clients"]) > 0
        assert sum(c[1] for c in row["clients"]) == row["down_bytes"]
        assert sum(c[2] for c in row["clients"]) == row["up_bytes"]
    fedavg = run_server(InProcessGrid(client_app, 2),  # Flower's own strategy, measured alike
                        build_run_config("fedavg", num_clients=2, rounds=1))
    assert fedavg.history[1]["client_time_s"] > 0 and fedavg.history[1]["server_compute_s"] > 0


def _timed(label, accs, up, family="gradient", codec="qsgd"):
    run = _run(label, accs, up, family=family, codec=codec)
    for row in run["history"][1:]:
        row.update(server_compute_s=0.1, clients=[[1.0, 1_250_000, row["up_bytes"] // 2]] * 2)
    return run


def test_summary_reports_time_to_target_per_link_and_draws_the_time_plot(tmp_path):
    # Prepare: dq sends 100 B per round, qsgd 1 MB; 10 Mbit/s down = 1 s per client and round
    res = _results([_timed("dq", [0.1, 0.5, 0.85, 0.9], 100, family="dq"),
                    _timed("qsgd", [0.1, 0.81, 0.85, 0.9], 1_000_000)])
    res["links"] = [BUILTIN_LINKS["lte"].to_json()]
    # Execute
    paths = write_reports(res, tmp_path)
    text = paths["summary"].read_text()
    # Assert: dq: 2 rounds of 0.1 + 0.05 + (1 + 1 + 400 bits / 1 Mbit/s); qsgd: 1 round of
    # 0.15 + 1 + 1 + 4 s (500 kB up)
    assert "## Time on links" in text and "| method | lte |" in text
    assert "| dq | 4.3 s |" in text and "| qsgd | 6.15 s |" in text
    assert "Fastest to 80.0% on lte: dq (4.3 s simulated)." in text
    assert (tmp_path / "accuracy_vs_time_lte.png").is_file()
    assert "clients" not in paths["csv"].read_text().splitlines()[0]


def test_compute_is_cpu_time_so_waiting_on_a_shared_machine_does_not_count(monkeypatch):
    # A process that waits (here: sleeps) uses no CPU; on a machine shared with other work
    # wall-clock compute would grow with the load. Each client and the server wait 1.5 s in
    # their step; a round of FedAvg on the digits MLP computes well under a second of each.
    import time

    from dq_flower.harness import fedavg_client
    from dq_flower.harness.server_app import FlowerStrategy

    real_epochs, real_aggregate = fedavg_client.local_epochs, FlowerStrategy.aggregate_round

    def slow_epochs(*args, **kwargs):
        time.sleep(1.5)
        return real_epochs(*args, **kwargs)

    def slow_aggregate(self, *args, **kwargs):
        time.sleep(1.5)
        return real_aggregate(self, *args, **kwargs)

    monkeypatch.setattr(fedavg_client, "local_epochs", slow_epochs)
    monkeypatch.setattr(FlowerStrategy, "aggregate_round", slow_aggregate)
    t0 = time.perf_counter()
    row = run_server(InProcessGrid(client_app, 2),
                     build_run_config("fedavg", num_clients=2, rounds=1)).history[1]
    assert time.perf_counter() - t0 > 3 * 1.5  # the waits happened
    assert 0 < min(c[0] for c in row["clients"]) < 1.0
    assert 0 < row["server_compute_s"] < 1.0
