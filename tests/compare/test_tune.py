"""Learning-rate tuning that cannot see the test set: the validation split, the grids, the
choice, the tuned preset and what the summary says; unstable runs named."""

from __future__ import annotations

import numpy as np
import pytest

from dq_flower.cli import main
from dq_flower.compare import plan_runs, summary_markdown
from dq_flower.compare.grids import (
    CLIENT_LR,
    DQ_LR,
    GRADIENT_LR,
    SIGN_LR,
    grid_points,
    step_axes,
)
from dq_flower.compare.presets import Preset, load_preset
from dq_flower.compare.tune import (
    TuneSettings,
    apply_tuning,
    choose,
    extend_axes,
    tune_plan,
    tune_runs,
)
from dq_flower.harness import server_app
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.tasks.data import load_dataset_cached, load_partition, validation_view
from tests.compare.test_compare import _results, _run


# ---------------------------------------------------------------------------- validation split
def test_validation_view_holds_out_training_rows_only_deterministically():
    ds = load_dataset_cached("digits", None, 0)
    view = validation_view(ds, 0.2, seed=0)
    again = validation_view(ds, 0.2, seed=0)
    other = validation_view(ds, 0.2, seed=1)
    n = ds.num_train
    assert view.test_x.shape[0] == round(0.2 * n) and view.num_train == n - round(0.2 * n)
    np.testing.assert_array_equal(view.test_x, again.test_x)
    assert not np.array_equal(view.test_x, other.test_x)
    # every held-out and every kept row is a training row, each exactly once
    rows = {r.tobytes() for r in ds.train_x}
    assert all(r.tobytes() in rows for r in np.concatenate([view.train_x, view.test_x]))
    both = np.concatenate([view.train_x, view.test_x])
    assert len({r.tobytes() for r in both}) == len({r.tobytes() for r in ds.train_x})
    # the real test rows are nowhere in it
    test_rows = {r.tobytes() for r in ds.test_x} - rows
    assert test_rows and not any(r.tobytes() in test_rows for r in both)
    with pytest.raises(ValueError, match="validation fraction"):
        validation_view(ds, 1.0)


def test_with_validation_fraction_clients_train_on_the_rest_and_the_server_scores_held_out_rows(
        monkeypatch):
    # Prepare
    ds = load_dataset_cached("digits", None, 0)
    view = validation_view(ds, 0.25, seed=0)
    sizes = [load_partition("digits", i, 2, validation_fraction=0.25)[0].shape[0]
             for i in range(2)]
    seen = []
    real = server_app.evaluate
    monkeypatch.setattr(server_app, "evaluate",
                        lambda model, x, y: seen.append(x) or real(model, x, y))
    # Execute
    server_app.run_server(InProcessGrid(client_app, 2),
                          build_run_config("qsgd", num_clients=2, rounds=1,
                                           validation_fraction=0.25))
    # Assert
    assert sum(sizes) == view.num_train
    assert len(seen) == 2 and all(np.array_equal(x, view.test_x) for x in seen)


def test_validation_fraction_is_a_scenario_key_compare_refuses_as_a_knob():
    with pytest.raises(ValueError, match="part of the scenario"):
        plan_runs(Preset(name="t", methods=("qsgd",)), [(None, "validation-fraction", 0.2)])
    with pytest.raises(ValueError, match="validation-fraction"):
        build_run_config("qsgd", validation_fraction=1.0)


# ---------------------------------------------------------------------------- grids, choice
def test_each_family_tunes_its_own_step_sizes():
    assert step_axes("dq", {}) == {"lr": DQ_LR}
    assert step_axes("fedavg", {}) == {"client-lr": CLIENT_LR}
    assert step_axes("gradient", {"codec": "qsgd"}) == {"lr": GRADIENT_LR}
    assert step_axes("gradient", {"codec": "sign", "aggregation": "auto"}) == {"lr": SIGN_LR}
    assert step_axes("gradient", {"codec": "qsgd", "local-epochs": 1}) == {"client-lr": CLIENT_LR}
    local = step_axes("gradient", {"codec": "qsgd", "local-steps": 5})
    assert set(local) == {"lr", "client-lr"} and len(grid_points(local)) == 9
    assert grid_points({"lr": (1, 2), "client-lr": (3,)}) == [{"lr": 1, "client-lr": 3},
                                                             {"lr": 2, "client-lr": 3}]


def test_choice_is_best_validation_accuracy_then_fewer_bytes():
    scores = [{"accuracy": 0.8, "up-bytes": 10}, {"accuracy": 0.9, "up-bytes": 30},
              {"accuracy": 0.9, "up-bytes": 20}, {"failed": True},
              {"accuracy": float("nan"), "up-bytes": 1}]
    assert choose(scores) == 2
    assert choose([{"failed": True}]) is None
    with pytest.raises(ValueError, match="tune-rounds"):
        TuneSettings(rounds=0)
    with pytest.raises(ValueError, match="validation-fraction"):
        TuneSettings(validation_fraction=0.0)


def test_tuning_runs_the_grid_on_the_validation_split_and_records_grid_scores_and_choice(
        monkeypatch):
    # Prepare: record every array the server evaluates on
    seen = []
    real = server_app.evaluate
    monkeypatch.setattr(server_app, "evaluate",
                        lambda model, x, y: seen.append(x.shape[0]) or real(model, x, y))
    preset = Preset(name="t", methods=("signsgd",), num_clients=2, rounds=4)
    plan = plan_runs(preset)[0]
    # Execute
    record = tune_plan(plan, TuneSettings(rounds=2, validation_fraction=0.3))
    # Assert
    n_val = validation_view(load_dataset_cached("digits", None, 0), 0.3, 0).test_x.shape[0]
    assert set(seen) == {n_val}  # only the held-out training rows, never the test set
    grid = record["axes"]["lr"]  # SIGN_LR, extended where the best point sat on an edge
    assert grid[grid.index(SIGN_LR[0]):][:len(SIGN_LR)] == list(SIGN_LR)
    assert len(grid) == len(SIGN_LR) + record["extensions"] and record["rounds"] == 2
    assert [s["knobs"] for s in record["scores"]] == [{"lr": v} for v in grid]
    accs = [s["accuracy"] for s in record["scores"]]
    assert record["choice"] == {"lr": grid[int(np.argmax(accs))]}
    tuned = apply_tuning(preset, {"signsgd": record})
    assert plan_runs(tuned)[0].resolved["lr"] == record["choice"]["lr"]
    assert tuned.tuning["signsgd"]["choice"] == record["choice"]
    assert record["partition"] == "iid" and "dirichlet-alpha" not in record


def test_a_tuning_record_keeps_the_split_it_was_tuned_on(monkeypatch):
    from dq_flower.compare import tune
    score, _ = _fake_scores(0.1)
    monkeypatch.setattr(tune, "_score_points", score)
    preset = Preset(name="t", methods=("qsgd",), num_clients=2, rounds=4,
                    partition="dirichlet", dirichlet_alpha=0.3)
    record = tune_plan(plan_runs(preset)[0], TuneSettings(rounds=2))
    assert record["partition"] == "dirichlet" and record["dirichlet-alpha"] == 0.3


def test_next_grid_values_follow_the_1_3_10_sequence_or_the_edge_ratio():
    assert extend_axes({"lr": (0.01, 0.03, 0.1, 0.3)}, {"lr": 0.3}) == {
        "lr": (0.01, 0.03, 0.1, 0.3, 1.0)}
    assert extend_axes({"lr": (0.01, 0.03, 0.1, 0.3, 1.0)}, {"lr": 1.0})["lr"][-1] == 3.0
    assert extend_axes({"lr": (0.001, 0.003, 0.01)}, {"lr": 0.001})["lr"][0] == 0.0003
    assert extend_axes({"lr": (0.0003, 0.001)}, {"lr": 0.0003})["lr"][0] == 0.0001
    assert extend_axes({"lr": (0.2, 0.4)}, {"lr": 0.4})["lr"][-1] == 0.8  # edge ratio 2
    # inside the grid, a single-value axis and a non-positive lower edge stay as they are
    assert extend_axes({"lr": (0.1, 0.3, 1.0)}, {"lr": 0.3}) == {"lr": (0.1, 0.3, 1.0)}
    assert extend_axes({"lr": (0.1,)}, {"lr": 0.1}) == {"lr": (0.1,)}
    assert extend_axes({"lr": (0.0, 0.1)}, {"lr": 0.0}) == {"lr": (0.0, 0.1)}
    # two axes: each edge the choice sits on is extended
    assert extend_axes({"lr": (0.3, 1.0), "client-lr": (0.03, 0.1)},
                       {"lr": 1.0, "client-lr": 0.03}) == {
        "lr": (0.3, 1.0, 3.0), "client-lr": (0.01, 0.03, 0.1)}


def _fake_scores(best_lr):
    """A stand-in for the grid runs: accuracy peaks at ``best_lr`` (log distance)."""
    ran = []

    def score(plan, points, rounds, settings, report, cpus):
        ran.extend(dict(p) for p in points)
        return [{"knobs": dict(p),
                 "accuracy": 1 - abs(np.log10(next(iter(p.values())) / best_lr)),
                 "up-bytes": 1, "failed": False} for p in points]
    return score, ran


@pytest.mark.parametrize(("best_lr", "grid", "choice", "extensions"), [
    (3.0, [0.01, 0.03, 0.1, 0.3, 1.0, 3.0], 3.0, 2),  # two steps up, then it is inside
    (100.0, [0.01, 0.03, 0.1, 0.3, 1.0, 3.0], 3.0, 2),  # still at the edge after two
    (0.003, [0.001, 0.003, 0.01, 0.03, 0.1, 0.3], 0.003, 2),  # down, and down again
    (0.1, [0.01, 0.03, 0.1, 0.3], 0.1, 0),  # inside: nothing added
])
def test_tuning_extends_an_axis_while_the_best_point_sits_on_its_edge(
        monkeypatch, best_lr, grid, choice, extensions):
    from dq_flower.compare import tune
    score, ran = _fake_scores(best_lr)
    monkeypatch.setattr(tune, "_score_points", score)
    plan = plan_runs(Preset(name="t", methods=("qsgd",), num_clients=2, rounds=4))[0]
    record = tune_plan(plan, TuneSettings(rounds=2))
    assert record["axes"] == {"lr": grid} and record["extensions"] == extensions
    assert record["choice"] == {"lr": choice}
    assert [s["knobs"]["lr"] for s in record["scores"]] == grid  # every point once, in order
    assert sorted(p["lr"] for p in ran) == grid
    no_extension = tune_plan(plan, TuneSettings(rounds=2, max_extensions=0))
    assert no_extension["axes"] == {"lr": list(GRADIENT_LR)}


def test_summary_names_the_tuned_step_sizes_and_their_grid():
    res = _results([_run("qsgd", [0.1, 0.5, 0.9], 100)])
    res["runs"][0]["config"]["lr"] = 0.03
    res["preset"]["tuning"] = {"qsgd": {
        "rounds": 5, "validation-fraction": 0.2, "axes": {"lr": [0.01, 0.03, 0.1, 0.3]},
        "choice": {"lr": 0.03},
        "scores": [{"knobs": {"lr": v}, "accuracy": a, "up-bytes": 9}
                   for v, a in ((0.01, 0.5), (0.03, 0.7), (0.1, 0.6), (0.3, 0.1))]}}
    text = summary_markdown(res)
    assert ("- qsgd: lr 0.03, tuned over 0.01, 0.03, 0.1, 0.3 (validation accuracy 50.0%, "
            "70.0%, 60.0%, 10.0%)") in text
    assert "held-out 20.0%" in text and "the test set was never read" in text
    assert "tuned on the" not in text  # no split recorded: nothing to compare
    # tuned on one split, run on another (--partition on compare): said on the line
    res["preset"]["tuning"]["qsgd"]["partition"] = "iid"
    res["preset"].update(partition="iid")
    assert "tuned on the" not in summary_markdown(res)
    res["preset"].update(partition="dirichlet", dirichlet_alpha=0.1)
    assert ("70.0%, 60.0%, 10.0%); **tuned on the iid split, used unchanged on this run's "
            "dirichlet (alpha 0.1)**") in summary_markdown(res)
    res["runs"][0]["config"]["lr"] = 0.5  # a later --set overrode the tuned value
    assert "**the tuned lr 0.03 was overridden**" in summary_markdown(res)
    res["preset"]["tuning"] = {}
    assert "- qsgd: lr 0.5 (default, not tuned)" in summary_markdown(res)


def test_unstable_runs_are_named_in_the_table_and_the_verdict():
    res = _results([_run("dq", [0.1, 0.85, 0.9, 0.88], 100, family="dq"),
                    _run("topk", [0.1, 0.9, 0.5, 0.84], 10, codec="topk")])
    text = summary_markdown(res)
    assert "| 84.0% **unstable** | 90.0% |" in text  # topk: 6 points below its best
    assert "88.0% **unstable**" not in text  # dq: 2 points
    assert "- **Unstable** (final accuracy more than 5 points below its best): topk " \
           "(final 84.0%, best 90.0%)." in text


def test_tune_command_writes_a_preset_that_compare_runs(tmp_path, capsys):
    # Execute
    out = tmp_path / "tuned.toml"
    code = main(["tune", "--preset", "digits-mlp", "--methods", "sgd", "--num-clients", "2",
                 "--rounds", "3", "--tune-rounds", "1", "--out", str(out), "--quiet"])
    # Assert
    assert code == 0 and out.is_file()
    tuned = load_preset(str(out))
    lr = tuned.method_knobs["sgd"]["lr"]
    assert lr in GRADIENT_LR and tuned.tuning["sgd"]["choice"] == {"lr": lr}
    assert f"sgd: lr {lr:g}" in capsys.readouterr().out
    folder = tmp_path / "cmp"
    assert main(["compare", "--preset", str(out), "--engine", "inprocess", "--quiet",
                 "--link", "lte", "--out", str(folder)]) == 0
    text = (folder / "summary.md").read_text()
    assert f"- sgd: lr {lr:g}, tuned over 0.01, 0.03, 0.1, 0.3" in text
    assert "tuned on the" not in text
    # the same tuned preset on another split says where its step sizes come from
    assert main(["compare", "--preset", str(out), "--engine", "inprocess", "--quiet",
                 "--partition", "dirichlet", "--alpha", "0.1",
                 "--out", str(tmp_path / "dir")]) == 0
    assert ("**tuned on the iid split, used unchanged on this run's dirichlet (alpha 0.1)**"
            in (tmp_path / "dir" / "summary.md").read_text())
    # a record written before records kept their split: the file's own scenario
    written = out.read_text()
    cut = written.rindex('partition = "iid"\n')  # the [tuning.sgd] record's
    old = written[:cut] + written[cut + len('partition = "iid"\n'):]
    assert old.count('partition = "iid"') == 1 and cut > written.index("[tuning.sgd]")
    (tmp_path / "old.toml").write_text(old)
    assert load_preset(str(tmp_path / "old.toml")).tuning["sgd"]["partition"] == "iid"
    with pytest.raises(SystemExit) as exc:
        main(["tune", "--preset", "digits-mlp", "--validation-fraction", "1.5"])
    assert exc.value.code == 2
    assert "--validation-fraction: must be in" in capsys.readouterr().err


def test_epoch_methods_tune_over_their_own_horizon_and_a_matching_earlier_tuning_is_kept(
        monkeypatch):
    from dq_flower.compare import tune
    score, ran = _fake_scores(0.1)
    monkeypatch.setattr(tune, "_score_points", score)
    plans = plan_runs(Preset(name="t", methods=("qsgd", "fedavg"), num_clients=2, rounds=6))
    settings = TuneSettings(rounds=4, epoch_rounds=1)
    assert [settings.rounds_for(p) for p in plans] == [4, 1]
    saved = []
    records = tune_runs(plans, settings, on_record=lambda r: saved.append(sorted(r)))
    assert records["qsgd"]["rounds"] == 4 and records["fedavg"]["rounds"] == 1
    assert saved == [["qsgd"], ["fedavg", "qsgd"]]  # written after each method
    # Execute: resume with the records; fedavg's was made under other settings
    ran.clear()
    stale = {**records["fedavg"], "rounds": 3}
    again = tune_runs(plans, settings, earlier={"qsgd": records["qsgd"], "fedavg": stale})
    # Assert: qsgd kept (nothing of it ran again), fedavg tuned anew
    assert again["qsgd"] == records["qsgd"]
    assert ran and all("client-lr" in p for p in ran)
    # a record tuned on another split is not kept either
    ran.clear()
    other_split = {**records["qsgd"], "partition": "dirichlet", "dirichlet-alpha": 0.1}
    tune_runs(plans[:1], settings, earlier={"qsgd": other_split})
    assert ran and all("lr" in p for p in ran)
    with pytest.raises(ValueError, match="tune-epoch-rounds"):
        TuneSettings(epoch_rounds=0)


def test_a_shared_run_takes_its_sources_tuned_step_sizes_without_a_search(monkeypatch):
    from dq_flower.compare import tune
    score, ran = _fake_scores(0.1)
    monkeypatch.setattr(tune, "_score_points", score)
    plans = plan_runs(Preset(name="t", methods=("fedavg-qsgd2", "fedavg"), num_clients=2,
                             rounds=3))
    settings = TuneSettings(rounds=1, share=(("fedavg-qsgd2", "fedavg"),))
    records = tune_runs(plans, settings)
    # Assert: one search (fedavg's), and the shared record says where it came from
    assert len(ran) == len(CLIENT_LR)
    assert records["fedavg-qsgd2"]["choice"] == records["fedavg"]["choice"] == {
        "client-lr": 0.1}
    assert records["fedavg-qsgd2"]["shared-from"] == "fedavg"
    tuned = apply_tuning(Preset(name="t", methods=("fedavg-qsgd2", "fedavg")), records)
    assert plan_runs(tuned)[0].resolved["client-lr"] == 0.1
    # resumed without the share, the shared record is not kept: the run gets its own search
    ran.clear()
    own = tune_runs(plans, TuneSettings(rounds=1), earlier=records)
    assert len(ran) == len(CLIENT_LR)
    assert "shared-from" not in own["fedavg-qsgd2"]
    assert own["fedavg"] == records["fedavg"]
    with pytest.raises(ValueError, match="both must be among the runs"):
        tune_runs(plans, TuneSettings(rounds=1, share=(("fedavg-topk", "fedavg"),)))
    with pytest.raises(ValueError, match="tune-share"):
        TuneSettings(share=(("fedavg", "fedavg"),))
