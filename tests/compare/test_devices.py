"""Compute profiles, FLOP counting, the work model, framed links and the (device, link)
table, on hand-checkable examples."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dq_flower.compare.devices import (
    BUILTIN_DEVICES,
    BUILTIN_SERVERS,
    MEASURED,
    ComputeProfile,
    ModelFlops,
    model_flops,
    parse_device,
    parse_server,
)
from dq_flower.compare.framing import (
    EU868_MAX_PAYLOAD,
    Framing,
    iridium_sbd_seconds,
    lora_airtime,
    lorawan_framing,
)
from dq_flower.compare.links import (
    BUILTIN_LINKS,
    LinkProfile,
    round_time,
    time_to_target,
)
from dq_flower.compare.summary import run_summaries, summary_markdown
from dq_flower.compare.work import (
    RoundWork,
    Workload,
    device_link_table,
    device_section,
    pair_times,
    profiled_history,
    round_work,
)

# --------------------------------------------------------------------------- FLOPs


def test_flops_of_a_two_layer_mlp_are_counted_by_hand():
    # Linear(4, 3) then Linear(3, 2): a forward pass is 2 * (4*3 + 3*2) = 36 FLOPs per sample;
    # the backward pass adds both weight gradients (2*12 + 2*6) and the second layer's input
    # gradient (2*6), not the first's (the input needs none): 36 + 48 = 84
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flops = model_flops(model, (4,))
    assert flops == ModelFlops(36.0, 84.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_flops_of_the_wide_cnn_training_step_are_about_three_forward_passes():
    from dq_flower.harness.tasks import make_model

    flops = model_flops(make_model("wide-cnn", (1, 28, 28), 10), (1, 28, 28))
    assert flops.forward == pytest.approx(22_935_552)
    assert 2.5 < flops.train / flops.forward < 3.0


# --------------------------------------------------------------------------- profiles


def test_builtin_profiles_name_their_source_and_parse():
    for profile in [*BUILTIN_DEVICES.values(), *BUILTIN_SERVERS.values()]:
        assert profile.source, profile.name
    assert BUILTIN_DEVICES["measured"] is MEASURED and MEASURED.measured
    assert not BUILTIN_DEVICES["mcu"].can_train
    assert parse_device("rpi4").flops == 8e9
    assert parse_device("tiny=0.5") == ComputeProfile("tiny", 0.5e9, True,
                                                      "given on the command line")
    assert parse_server("gpu").flops == 19.5e12
    with pytest.raises(ValueError, match="unknown device profile"):
        parse_device("abacus")
    with pytest.raises(ValueError, match="positive"):
        parse_server("x=0")
    with pytest.raises(ValueError, match="measured"):
        ComputeProfile("nameless", 0.0)
    assert ComputeProfile("x", 2e9).seconds(1e9) == 0.5
    assert ComputeProfile.from_json(BUILTIN_DEVICES["mcu"].to_json()) == BUILTIN_DEVICES["mcu"]


# --------------------------------------------------------------------------- work model

_FLOPS = ModelFlops(forward=1_000.0, train=3_000.0)


def _fedavg_record(epochs=2):
    return {"label": "fedavg", "family": "fedavg", "num_params": 10,
            "config": {"local-epochs": epochs, "batch-size": 32},
            "history": [{"round": 0, "accuracy": 0.1},
                        {"round": 1, "accuracy": 0.9, "server_compute_s": 0.5,
                         "clients": [[7.0, 1_000, 500], [9.0, 1_000, 500]]}]}


def test_a_training_client_takes_its_epochs_flops_over_the_profiles_rate():
    # 2 epochs of 100 rows at 3,000 FLOPs each = 600,000 FLOPs; at 1 MFLOP/s: 0.6 s
    rec = _fedavg_record()
    work = round_work(rec, rec["history"][1], None, rows=100)
    assert work == RoundWork(client_train=200.0)
    hist = profiled_history(rec, Workload(_FLOPS, (100, 80)), ComputeProfile("d", 1e6),
                            ComputeProfile("s", 1e9))
    assert hist is not None
    assert hist[1]["clients"] == [[pytest.approx(0.6), 1_000, 500]] * 2
    assert hist[1]["server_compute_s"] == 0.0  # the server trains nothing
    assert hist[0] == rec["history"][0]
    # the measured profiles keep the measured times: the history as it was
    assert profiled_history(rec, Workload(_FLOPS, (100,)), MEASURED, MEASURED) \
        == rec["history"]
    # a device that cannot train cannot run FedAvg
    assert profiled_history(rec, Workload(_FLOPS, (100,)), BUILTIN_DEVICES["mcu"],
                            MEASURED) is None


def test_gradient_clients_train_local_steps_of_a_batch():
    rec = {"family": "gradient", "config": {"local-steps": 5, "batch-size": 32}}
    assert round_work(rec, {"round": 1, "clients": [[0, 0, 0]]}, None, rows=1_000) \
        == RoundWork(client_train=160.0)


def _dq_record(scorer="uniform", compensation="none"):
    return {"label": "dq", "family": "dq", "num_params": 10,
            "config": {"scorer": scorer, "compensation": compensation, "num-partitions": 2,
                       "server-batch-size": 4, "plateau-eval-every": 5},
            "history": [{"round": 0, "accuracy": 0.1},
                        {"round": 1, "accuracy": 0.5, "server_compute_s": 3.0,
                         "server_steps": 10, "holdout_rows": 3, "selected": 8, "stored": 8,
                         "clients": [[0.01, 20, 400], [0.02, 20, 400]]},
                        {"round": 2, "accuracy": 0.9, "server_compute_s": 2.0,
                         "server_steps": 5, "holdout_rows": 3, "selected": 0, "stored": 8,
                         "clients": []}]}


def test_dq_clients_train_nothing_and_the_server_trains_its_steps():
    rec = _dq_record()
    # server: 10 steps of 4 rows trained; 10 / 5 = 2 plateau checks of 3 held-out rows
    assert round_work(rec, rec["history"][1], None, rows=100) \
        == RoundWork(0.0, 0.0, 40.0, 6.0)
    hist = profiled_history(rec, Workload(_FLOPS, (100, 100)), BUILTIN_DEVICES["mcu"],
                            ComputeProfile("s", 1e6))
    assert hist is not None  # the microcontroller runs DQ's client: it trains nothing
    assert hist[1]["clients"] == [[0.0, 20, 400]] * 2
    assert hist[1]["server_compute_s"] == pytest.approx((40 * 3_000 + 6 * 1_000) / 1e6)
    assert hist[2]["server_compute_s"] == pytest.approx((20 * 3_000 + 3 * 1_000) / 1e6)


def test_a_dq_client_that_scores_forwards_its_candidates_and_compensation_trains():
    rec = _dq_record(scorer="loss", compensation="qsgd")
    row = {**rec["history"][1], "selected": 7}
    # candidates: 100 rows less an even share of the 6 stored before (3); chosen ceil(7/2)=4
    work = round_work(rec, row, {"round": 0, "stored": 6}, rows=100)
    assert (work.client_forward, work.client_train) == (97.0, 8.0)
    assert work.client_flops(_FLOPS) == 97 * 1_000 + 8 * 3_000
    # compensation needs a backward pass: the microcontroller cannot send it
    assert profiled_history(rec, Workload(_FLOPS, (100,)), BUILTIN_DEVICES["mcu"],
                            MEASURED) is None
    # "auto" scores where the round sent the model (a byte per parameter at least)
    auto = _dq_record(scorer="auto")
    assert round_work(auto, auto["history"][1], None, 100, num_params=10).client_forward \
        == 100.0
    small = {**auto["history"][1], "clients": [[0.0, 5, 400]]}
    assert round_work(auto, small, None, 100, num_params=10).client_forward == 0.0


# --------------------------------------------------------------------------- framed links


def test_lora_airtime_matches_the_datasheet_formula_by_hand():
    # SF7/125 kHz: T_sym = 1.024 ms; 235-byte PHY payload (222 + 13):
    # 8 + ceil((1880 - 28 + 28 + 16) / 28) * 5 = 348 symbols, + 12.25 preamble = 360.25
    assert lora_airtime(235, 7) == pytest.approx(360.25 * 1.024e-3)
    # SF12: T_sym = 32.768 ms, low data rate optimisation on; 64 bytes (51 + 13):
    # 8 + ceil((512 - 48 + 28 + 16) / 40) * 5 = 73 symbols, + 12.25 = 85.25
    assert lora_airtime(64, 12) == pytest.approx(85.25 * 32.768e-3)
    assert EU868_MAX_PAYLOAD[0] == 51 and EU868_MAX_PAYLOAD[5] == 222
    assert lorawan_framing(5, 0.01) == Framing(222, lora_airtime(235, 7), 0.01)
    with pytest.raises(ValueError, match="data rate"):
        lorawan_framing(7, 0.01)


def test_a_message_is_split_into_frames_with_the_duty_cycle_between_them():
    f = Framing(222, 0.5, 0.01)
    assert [f.frames(b) for b in (0, 1, 222, 223, 444, 445)] == [0, 1, 1, 2, 2, 3]
    # 2 frames: 2 * 0.5 s on air + one silence of 0.5 * (100 - 1) = 49.5 s
    assert f.seconds(223) == pytest.approx(50.5)
    assert f.seconds(0) == 0.0
    assert Framing(340, 7.0).seconds(681) == pytest.approx(21.0)  # 3 messages, no duty cycle
    with pytest.raises(ValueError, match="duty_cycle"):
        Framing(10, 1.0, 0.0)
    with pytest.raises(ValueError, match="payload_bytes"):
        Framing(0, 1.0)


def test_round_time_on_lorawan_counts_frames_airtime_and_silences():
    link = BUILTIN_LINKS["lorawan"]
    air = lora_airtime(235, 7)
    # 500 B up = 3 frames; 100 B down = 1 frame; 2 s compute; 1 s round trip
    row = {"round": 1, "server_compute_s": 0.0, "clients": [[2.0, 100, 500]]}
    expected = 1.0 + 2.0 + air + (3 * air + 2 * air * 99)
    assert round_time(row, link) == pytest.approx(expected)
    assert LinkProfile.from_json(link.to_json()) == link
    assert "frames of 222 B" in link.describe() and "1% duty cycle" in link.describe()


def test_constrained_links_name_their_sources_and_the_default_ones_are_unchanged():
    for name in ("nbiot", "lorawan", "lorawan-sf12", "iridium"):
        assert BUILTIN_LINKS[name].source
    iridium = BUILTIN_LINKS["iridium"]
    assert iridium.up_framing == Framing(340, iridium_sbd_seconds(340))
    assert iridium_sbd_seconds(1960) == pytest.approx(20.0)
    assert iridium.up_seconds(1_000) == pytest.approx(3 * iridium_sbd_seconds(340))
    lte = BUILTIN_LINKS["lte"]
    assert lte.up_seconds(125_000) == pytest.approx(1.0)
    old = {"name": "lte", "down_bps": 10e6, "up_bps": 1e6, "rtt_s": 0.05}  # older results
    assert LinkProfile.from_json(old).up_framing is None
    assert {k: lte.to_json()[k] for k in old} == old


# --------------------------------------------------------------------------- the table


def _results():
    dq = _dq_record()
    fedavg = _fedavg_record(epochs=1)
    fedavg["history"][1]["accuracy"] = 0.9
    for rec in (dq, fedavg):
        rec.update(num_params=10, data_dim=4, status="ok")
        rec["config"]["bits"] = 2
        for row in rec["history"]:
            row.update(cum_up_bytes=0, cum_down_bytes=0, up_bytes=0, down_bytes=0)
    return {"target_accuracy": 0.85, "runs": [dq, fedavg], "engine": "inprocess",
            "links": [BUILTIN_LINKS["lte"].to_json(), BUILTIN_LINKS["lorawan"].to_json()],
            "preset": {"name": "t", "dataset": "digits", "model": "mlp", "num_clients": 2,
                       "partition": "iid", "fraction_train": 1.0, "rounds": 2, "seed": 0}}


def test_the_table_has_a_row_per_device_and_link_pair_with_the_fastest_method():
    res = _results()
    work = Workload(_FLOPS, (100, 100))
    devices = [MEASURED, ComputeProfile("slow", 1e3, True, "a test device"),
               BUILTIN_DEVICES["mcu"]]
    server = ComputeProfile("fast", 1e9, True, "a test server")
    links = [BUILTIN_LINKS["lte"], BUILTIN_LINKS["lorawan"]]
    lines = device_link_table(res, work, devices, server, links)
    rows = [x for x in lines if x.startswith("| ") and not x.startswith("| device")]
    assert len(rows) == 6
    # slow device on lte: fedavg trains 100 rows * 3,000 FLOPs at 1 kFLOP/s = 300 s; dq's
    # clients train nothing and its server takes 0.126 + 0.063 ms: dq is the fastest
    slow = pair_times(res, work, devices[1], server, links[0])
    fedavg_t = 0.05 + 300 + 8 * 1_000 / 10e6 + 8 * 500 / 1e6
    assert [t.label for t in slow] == ["dq", "fedavg"]
    assert slow[1].to_target == pytest.approx(fedavg_t)
    dq_t = (0.05 + 8 * 20 / 10e6 + 8 * 400 / 1e6 + 126_000 / 1e9) + 63_000 / 1e9
    assert slow[0].to_target == pytest.approx(dq_t)
    assert "| slow | lte | " in lines[lines.index(rows[2])] and rows[2].endswith("| dq |")
    assert rows[4].startswith("| mcu | lte | ") and "cannot train" in rows[4]
    # measured, measured: the times of the "Time on links" table
    measured = pair_times(res, work, MEASURED, MEASURED, links[0])
    stats = run_summaries(res)
    assert [t.to_target for t in measured] == [s["time_to_target"]["lte"] for s in stats]
    assert "a test device" in "\n".join(lines) and "LoRaWAN EU868 DR5" in "\n".join(lines)


def test_the_summary_shows_the_section_only_with_a_workload_and_devices():
    res = _results()
    assert device_section(res) == []
    before = summary_markdown(res)
    assert "Time on devices and links" not in before
    res.update(workload=Workload(_FLOPS, (100, 100)).to_json(),
               devices=[MEASURED.to_json(), BUILTIN_DEVICES["rpi4"].to_json()],
               server_device=BUILTIN_SERVERS["gpu"].to_json())
    after = summary_markdown(res)
    assert "## Time on devices and links" in after and "| rpi4 | lorawan |" in after
    assert after.startswith(before.split("## Step sizes")[0])
    assert math.isfinite(time_to_target(res["runs"][1]["history"], BUILTIN_LINKS["lte"], 0.85))
