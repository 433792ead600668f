"""DQ's default adaptive schedule end to end, in-process on the digits MLP."""

import math
from pathlib import Path

import pytest

from dq_flower.dq.server.store import SampleStore
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

from .helpers import run_inprocess

# a first ask of ``budget`` per node (no held-out rows required) and a fixed step cap
_KNOBS = dict(budget=32, max_server_steps=300, plateau_eval_every=25, plateau_patience=2,
              min_holdout_rows=0, max_server_epochs=1)


def _keys(row):
    return {k: row.get(k) for k in ("round", "accuracy", "cum_up_bytes", "stored",
                                    "server_steps", "holdout_rows", "next_ask",
                                    "schedule_done", "upload_gain", "ended_early")}


@pytest.fixture(scope="module")
def adaptive_run():
    return run_inprocess(num_clients=3, rounds=12, **_KNOBS)


def test_the_schedule_grows_the_store_then_stops_asking_and_only_probes(adaptive_run):
    result, _ = adaptive_run
    rows = [r for r in result.history if r["round"] >= 1]
    assert rows[0]["stored"] == 3 * 32 and rows[0]["next_ask"] == 96  # growth 2
    stored = [r["stored"] for r in rows if r["selected"]]
    assert all(b > a for a, b in zip(stored, stored[1:], strict=False))
    # the 3 nodes have sent all their rows by round 5: round 6 asks none, and probes of
    # one node follow 2 and then 4 data rounds later, each a reply with no row
    assert stored[-1] == 1437 and [r["schedule_done"] for r in rows[5:]] == [2] * 7
    assert [r["round"] for r in rows[5:] if r["replies"]] == [8, 12]
    probes = [r for r in rows[5:] if r["replies"]]
    assert all(r["replies"] == 1 and r["selected"] == 0 for r in probes)
    quoted = probes[0]["up_bytes"]  # docs/method.md quotes what such a reply costs
    assert probes[1]["up_bytes"] == quoted and f"({quoted} B on the digits MLP:" in " ".join(
        (Path(__file__).parents[2] / "docs" / "method.md").read_text().split())
    assert not any(r.get("ended_early") for r in rows) and rows[-1]["accuracy"] > 0.85
    # every held-out share is the configured tenth (per node and class, rounded)
    assert all(abs(r["holdout_rows"] - 0.1 * r["stored"]) <= 3 * 10 for r in rows)
    assert all(0 < r["server_steps"] <= 300 for r in rows if r["selected"])


def test_rounds_after_the_curve_is_flat_cost_no_uplink():
    result, _ = run_inprocess(num_clients=3, rounds=12, min_gain=0.5, probe_after=0,
                              **_KNOBS)
    rows = [r for r in result.history if r["round"] >= 1]
    # half the accuracy per doubling is never reached: the second comparison (the third
    # upload) shows the curve flat; a phase on the store it has makes no progress in the
    # next round, and without probes the run ends there
    assert [r["schedule_done"] for r in rows] == [0, 0, 1, 1]
    assert rows[-1]["ended_early"] and rows[-1]["next_ask"] == 0
    assert rows[-1]["idle_kept"] == 0 and rows[-1]["up_bytes"] == 0


def test_a_flat_curve_is_probed_and_rounds_between_probes_cost_no_uplink():
    result, _ = run_inprocess(num_clients=3, rounds=8, min_gain=0.5, probe_after=1,
                              **_KNOBS)
    rows = [r for r in result.history if r["round"] >= 1]
    assert [r["schedule_done"] for r in rows[:3]] == [0, 0, 1]
    # flat after round 3: a probe in round 4 (still flat), then a wait of 2 rounds
    uploads = [r["selected"] > 0 for r in rows]
    assert uploads == [True, True, True, True, False, True, False, False]
    assert rows[3]["selected"] == math.ceil(0.1 * rows[2]["stored"] - 1e-9)
    assert all(r["up_bytes"] == 0 for r, up in zip(rows, uploads, strict=True) if not up)
    assert not rows[-1].get("ended_early")
    # a round that trained nothing reports no training loss (not a NaN one); a round
    # without uploads trains on the store until a phase there makes no progress
    assert all("train_loss" not in r for r in rows if not r["server_steps"])
    assert all(math.isfinite(r["train_loss"]) for r in rows if r["server_steps"])
    assert [r["server_steps"] > 0 for r in rows] == [True] * 7 + [False]


def test_the_held_out_rows_are_never_trained_on(monkeypatch):
    drawn_from_holdout = []
    real_draw, real_take = SampleStore.draw_batches, SampleStore._take
    drawing = []

    def spy(self, count, batch_size, rng, weights="importance", skip=frozenset(), **kwargs):
        assert not skip  # honest clients: the agreement screen excludes nobody
        batches = real_draw(self, count, batch_size, rng, weights, skip, **kwargs)
        while True:  # the rows the minibatches are read from are noted by _take below
            drawing.append(True)
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                drawing.pop()
            yield batch

    def take(self, idx):
        if drawing:
            drawn_from_holdout.append(bool(self.holdout_mask[idx].any()))
        return real_take(self, idx)

    monkeypatch.setattr(SampleStore, "draw_batches", spy)
    monkeypatch.setattr(SampleStore, "_take", take)
    result, _ = run_inprocess(num_clients=2, rounds=2, **_KNOBS)
    assert result.history[-1]["holdout_rows"] > 0
    assert drawn_from_holdout and not any(drawn_from_holdout)


def test_the_same_seed_gives_the_same_run_and_another_seed_another(adaptive_run):
    first, _ = adaptive_run
    again, _ = run_inprocess(num_clients=3, rounds=12, **_KNOBS)
    assert [_keys(r) for r in again.history] == [_keys(r) for r in first.history]
    other, _ = run_inprocess(num_clients=3, rounds=2, seed=1, **_KNOBS)
    assert _keys(other.history[1]) != _keys(first.history[1])


def test_resume_after_a_kill_ends_where_the_uninterrupted_run_ends(tmp_path, adaptive_run):
    full, _ = adaptive_run
    ckpt, nodes = tmp_path / "ckpt", tmp_path / "nodes"
    # the server stops after 2 rounds (as if killed there) and a new one resumes from its
    # checkpoint; the nodes keep their state (SuperNodes outlive a SuperLink restart)
    for rounds in (2, 12):
        config = build_run_config("dq", num_clients=3, rounds=rounds,
                                  checkpoint_dir=str(ckpt), **_KNOBS)
        resumed = run_server(InProcessGrid(client_app, 3, state_dir=str(nodes)), config)
    assert [_keys(r) for r in resumed.history] == [_keys(r) for r in full.history]


def test_the_fixed_schedule_keeps_todays_behaviour():
    result, _ = run_inprocess(num_clients=2, rounds=3, budget=20, server_steps=3,
                              upload_schedule="fixed")
    rows = [r for r in result.history if r["round"] >= 1]
    assert [r["stored"] for r in rows] == [40, 80, 120]
    assert "next_ask" not in rows[0] and "holdout_rows" not in rows[0]


@pytest.mark.parametrize("scorer", ["entropy", "margin"])
def test_a_model_scorer_starts_uniform_and_the_model_travels_at_the_chosen_precision(scorer):
    knobs = dict(_KNOBS, scorer=scorer, selection_rule="sample")
    full, _ = run_inprocess(num_clients=2, rounds=2, model_precision="fp32", **knobs)
    half, _ = run_inprocess(num_clients=2, rounds=2, model_precision="fp16", **knobs)
    auto, _ = run_inprocess(num_clients=2, rounds=2, **knobs)  # auto: int8 to score with
    r1, r2 = full.history[1], full.history[2]
    params = full.num_params
    assert r1["down_bytes"] < 2 * 1000  # round 1: the round config only, no model
    assert r2["down_bytes"] > 2 * 4 * params  # round 2: the trained model, float32
    assert half.history[1]["down_bytes"] == auto.history[1]["down_bytes"] == r1["down_bytes"]
    saved = r2["down_bytes"] - half.history[2]["down_bytes"]
    assert abs(saved - 2 * 2 * params) < 2 * 200  # two bytes per parameter and client
    # int8: a byte per parameter (padded to buckets of 256) and 8 bytes of range per bucket
    int8 = auto.history[2]["down_bytes"] - (r2["down_bytes"] - 2 * 4 * params)
    buckets = math.ceil(params / 256)
    assert 2 * 0.85 * params < int8 < 2 * buckets * (256 + 8) + 2 * 300
    assert min(r["history"][2]["selected"] for r in
               ({"history": full.history}, {"history": half.history},
                {"history": auto.history})) > 0


def test_a_phase_that_makes_the_model_worse_on_its_new_rows_keeps_the_previous_model(
        monkeypatch):
    import torch

    import dq_flower.dq.server.training as training_module

    real_phase = training_module.train_phase
    kept = {}

    def spoiling_phase(model, optimizer, base_lr, rule, step, evaluate, **kwargs):
        kept["start"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        result = real_phase(model, optimizer, base_lr, rule, step, evaluate, **kwargs)
        if kept.setdefault("calls", 0) >= 1:  # from the second upload on: a ruined model
            with torch.no_grad():  # constant outputs: class 0 for every row
                for p in model.parameters():
                    p.zero_()
            result.final = evaluate()
        kept["calls"] += 1
        return result

    monkeypatch.setattr(training_module, "train_phase", spoiling_phase)
    # the optimizer given: no probe phases before the first real one
    result, _ = run_inprocess(num_clients=2, rounds=2,
                              **dict(_KNOBS, budget=200, optimizer="sgd"))
    rows = result.history
    assert rows[1]["reverted"] == 0 and rows[2]["reverted"] == 1
    assert rows[2]["upload_gain"] < 0
    assert rows[2]["accuracy"] == rows[1]["accuracy"]  # the round-1 model, unchanged


def test_partial_participation_over_many_nodes_stores_samples_every_round_that_asks():
    # 150 nodes of about 10 digits each, 15 sampled a round: a node uploads all its rows
    # when first asked, so the nodes the server knows have nothing left and most sampled
    # nodes are new to it; new nodes must still be asked
    result, grid = run_inprocess(num_clients=150, rounds=6, fraction_train=0.1,
                                 **dict(_KNOBS, budget=32))
    rows = [r for r in result.history if r["round"] >= 1]
    assert all(r["selected"] > 0 for r in rows), [r["selected"] for r in rows]
    # round 2 stores at least half of what round 1 asked for (new nodes used to be
    # weighted by what the exhausted known ones had left: 12 of 73)
    assert rows[1]["selected"] >= rows[0]["next_ask"] / 2
    asked = {m.metadata.dst_node_id for m in grid.sent}
    assert len(asked) > 15 * 4  # new nodes are asked, not only those already known


def test_flowers_reply_count_line_counts_every_rounds_replies(caplog):
    import logging

    caplog.set_level(logging.INFO)
    run_inprocess(num_clients=3, rounds=2, **_KNOBS)
    counts = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("aggregate_train: Received")]
    # round 2 trains on a non-empty store; its replies are still counted, not "0 results"
    assert counts == ["aggregate_train: Received 3 results and 0 failures"] * 2
