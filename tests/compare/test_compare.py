"""The comparison harness: presets, knob layering, statistics, summary verdicts, failures."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

import dq_flower
from dq_flower import compare
from dq_flower.compare import (
    ConsoleProgress,
    parse_set,
    plan_runs,
    run_comparison,
    run_summaries,
    summary_markdown,
)
from dq_flower.compare import run as compare_run
from dq_flower.compare.presets import (
    PRESET_DIR,
    Preset,
    load_preset,
    parse_preset,
    preset_names,
)
from dq_flower.harness.methods import method_names

REQUIRED_PRESETS = {"digits-mlp", "fmnist-cnn", "fmnist-wide-cnn", "cifar10-resnet"}


# ---------------------------------------------------------------------------- presets
def test_required_presets_exist_as_files():
    files = {p.stem for p in PRESET_DIR.glob("*.toml")}
    assert files >= REQUIRED_PRESETS
    assert set(preset_names()) >= REQUIRED_PRESETS


@pytest.mark.parametrize("name", sorted(p.stem for p in PRESET_DIR.glob("*.toml")))
def test_every_preset_loads_and_validates(name):
    preset = load_preset(name)
    plans = plan_runs(preset)  # validates every method's knobs (no data needed)
    assert plans and len({p.spec.label for p in plans}) == len(plans)
    scenario = {(p.run_config["seed"], p.run_config["partition"],
                 p.run_config["num-partitions"], p.run_config["dataset"],
                 p.run_config["model"]) for p in plans}
    assert len(scenario) == 1  # same seed, partition, clients, data and model for all


def test_the_presets_are_package_data():
    # the wheel ships dq_flower/ only: the presets live inside it, one file each
    assert PRESET_DIR.parent == Path(dq_flower.__file__).parent
    assert set(preset_names()) == {p.stem for p in PRESET_DIR.glob("*.toml")}
    # commands recorded with the presets' old folder still find them
    assert load_preset("simulations/digits-mlp.toml") == load_preset("digits-mlp")
    labels = [p.spec.label for p in plan_runs(load_preset("digits-mlp"))]
    assert labels[:len(method_names())] == method_names()  # "all" = every registered method


def test_large_d_preset_is_large_d():
    preset = load_preset("fmnist-wide-cnn")
    assert (preset.dataset, preset.model, preset.num_clients) == ("fmnist", "wide-cnn", 10)
    assert preset.target_accuracy == 0.85


def test_preset_from_path_and_variants(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('rounds = 3\nrun = ["dq", "fast-qsgd"]\n[knobs]\nbatch-size = 8\n'
                    '[methods.fast-qsgd]\nmethod = "qsgd"\nlocal-steps = 2\n')
    plans = plan_runs(load_preset(str(path)))
    assert [(p.spec.label, p.spec.method) for p in plans] == [("dq", "dq"), ("fast-qsgd", "qsgd")]
    assert plans[1].resolved["local-steps"] == 2 and plans[1].resolved["batch-size"] == 8
    assert "batch-size" not in plans[0].run_config  # dq has no batch-size knob


@pytest.mark.parametrize("data, message", [
    ({"rounds": 0}, "rounds"),
    ({"rounds": "ten"}, "rounds"),
    ({"target-accuracy": 85}, "target-accuracy"),
    ({"partition": "zipf"}, "partition"),
    ({"colour": "red"}, "colour"),
    ({"run": 3}, "run"),
])
def test_bad_preset_values_name_the_key(data, message):
    with pytest.raises(ValueError, match=message):
        parse_preset(data, "bad")


def test_unknown_variant_method():
    preset = parse_preset({"run": ["x"], "methods": {"x": {"method": "nope"}}}, "p")
    with pytest.raises(ValueError, match="variant 'x': unknown method 'nope'"):
        plan_runs(preset)


# ---------------------------------------------------------------------------- knobs
def test_parse_set_reads_toml_scalars():
    assert parse_set(["bits=3", "dq.lr=0.5", "stochastic=false", "codec-params=levels=4"]) == [
        (None, "bits", 3), ("dq", "lr", 0.5), (None, "stochastic", False),
        (None, "codec-params", "levels=4")]
    with pytest.raises(ValueError, match="--set"):
        parse_set(["bits"])


def test_knob_layering():
    preset = Preset(name="t", methods=("dq", "qsgd", "fedavg"), knobs={"lr": 0.2},
                    method_knobs={"fedavg": {"client-lr": 0.01}})
    plans = {p.spec.label: p for p in plan_runs(
        preset, parse_set(["batch-size=16", "qsgd.lr=0.3", "fedavg.num-server-rounds=2"]))}
    assert plans["dq"].resolved["lr"] == 0.2 and plans["qsgd"].resolved["lr"] == 0.3
    assert plans["fedavg"].resolved["client-lr"] == 0.01
    assert plans["qsgd"].resolved["batch-size"] == 16 == plans["fedavg"].resolved["batch-size"]
    # rounds may differ per method; the scenario may not
    assert plans["fedavg"].run_config["num-server-rounds"] == 2
    assert plans["dq"].run_config["num-server-rounds"] == preset.rounds
    with pytest.raises(ValueError, match="part of the scenario"):
        plan_runs(preset, parse_set(["dq.partition=dirichlet"]))
    with pytest.raises(ValueError, match="not among the selected"):
        plan_runs(preset, parse_set(["topk.ratio=0.1"]))


# ---------------------------------------------------------------------------- statistics
def _run(label, accs, up_per_round, family="gradient", codec="qsgd", status="ok"):
    hist, cum = [], 0
    for r, acc in enumerate(accs):
        up = 0 if r == 0 else up_per_round
        cum += up
        hist.append({"round": r, "accuracy": acc, "loss": 1.0, "up_bytes": up,
                     "down_bytes": 10, "cum_up_bytes": cum, "cum_down_bytes": 10 * r,
                     "wall_s": float(r), "up_payload_bits": 8 * up, "replies": 2,
                     "selected": 4})
    return {"label": label, "method": label, "family": family, "status": status,
            "error": "" if status == "ok" else "RuntimeError: boom",
            "config": {"codec": codec, "bits": 2, "num-partitions": 2}, "num_params": 1000,
            "data_dim": 10, "history": hist if status == "ok" else [], "wall_s": 1.0}


def _results(runs, target=0.8):
    preset = compare_run._preset_json(Preset(name="syn", target_accuracy=target))
    return {"format": compare.RESULTS_FORMAT, "preset": preset, "engine": "inprocess",
            "target_accuracy": target, "runs": runs}


def test_bytes_and_rounds_to_target():
    res = _results([_run("dq", [0.1, 0.5, 0.85, 0.9], 100, family="dq"),
                    _run("qsgd", [0.1, 0.6, 0.7, 0.81], 1000)])
    dq, qsgd = run_summaries(res)
    assert (dq["rounds_to_target"], dq["up_bytes_to_target"]) == (2, 200)
    assert (qsgd["rounds_to_target"], qsgd["up_bytes_to_target"]) == (3, 3000)
    assert dq["uplink"]["unit"] == "sample" and dq["uplink"]["bits"] == 200
    assert qsgd["uplink"]["unit"] == "coord" and qsgd["uplink"]["bits"] == pytest.approx(4.0)
    text = summary_markdown(res)
    assert "| 15x |" in text  # 3000 / 200
    assert "dq used 15x fewer uplink bytes" in text


def test_dq_gradient_rounds_are_reported_per_coordinate_apart_from_the_samples():
    # Prepare: rounds 1-2 upload samples (4 each, 800 bits per round), round 3 a gradient
    # (2 replies of 1000 coordinates at 4 bits)
    run = _run("dq-auto", [0.1, 0.5, 0.6, 0.7], 100, family="dq")
    run["history"][3].update({"gradient_round": 1, "up_payload_bits": 8000, "selected": 0})
    # Execute
    unit = run_summaries(_results([run]))[0]["uplink"]
    # Assert
    assert unit["bits"] == 200 and unit["gradient_rounds"] == 1
    assert unit["gradient_bits_per_coord"] == pytest.approx(4.0)
    assert "200 b/sample (20.00 b/coord, 2 b quantizer); 4 b/coord in 1 gradient round" in (
        summary_markdown(_results([run])))


def test_summary_says_plainly_where_dq_does_not_win():
    res = _results([_run("dq", [0.1, 0.5, 0.85], 1000, family="dq"),
                    _run("signsgd", [0.1, 0.9, 0.9], 100, codec="sign"),
                    _run("topk", [0.1, 0.2, 0.3], 10, codec="topk")])
    text = summary_markdown(res)
    assert "**dq does not win against signsgd" in text
    assert "> 0.01x (not reached)" in text  # topk: 20 bytes, never reached
    assert "Did not reach 80.0% within the rounds: topk" in text


def test_summary_when_dq_misses_the_target():
    res = _results([_run("dq", [0.1, 0.5, 0.6], 100, family="dq"),
                    _run("qsgd", [0.1, 0.9, 0.9], 1000)])
    text = summary_markdown(res)
    assert "**dq did not reach 80.0%**" in text and "no byte ratio" in text
    assert "Reached the target: qsgd" in text


def test_progress_lines_without_a_terminal():
    stream = io.StringIO()
    progress = ConsoleProgress(stream)
    plan = plan_runs(Preset(name="t", methods=("dq",), rounds=2))[0]
    progress.start(1, 1, plan)
    progress.round({"round": 0, "accuracy": 0.1, "cum_up_bytes": 0, "cum_down_bytes": 0,
                    "wall_s": 0.0})
    progress.round({"round": 1, "accuracy": 0.5, "cum_up_bytes": 2500, "cum_down_bytes": 10,
                    "wall_s": 1.5})
    record = _run("dq", [0.1, 0.5, 0.9], 100, family="dq")
    record["stats"] = run_summaries(_results([record]))[0]
    progress.end(record, 0.8)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[1/1] dq: starting (dq, 2 rounds)"
    assert lines[1].startswith("[1/1] dq round   1/2  acc  50.0%  up    2.5 kB")
    assert "reached 80.0% at round 2" in lines[2] and len(lines) == 3


# ---------------------------------------------------------------------------- harness
def test_a_failing_method_is_recorded_and_the_others_run(tmp_path, monkeypatch):
    real = compare_run.run_one

    def flaky(plan, *args, **kwargs):
        if plan.spec.label == "signsgd":
            raise RuntimeError("simulated crash")
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(compare_run, "run_one", flaky)
    preset = Preset(name="t", methods=("signsgd", "sgd"), rounds=1, num_clients=2,
                    target_accuracy=0.5)
    results = run_comparison(preset, tmp_path, engine="inprocess")
    status = {r["label"]: r["status"] for r in results["runs"]}
    assert status == {"signsgd": "failed", "sgd": "ok"}
    text = (tmp_path / "summary.md").read_text()
    assert "signsgd: RuntimeError: simulated crash" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["runs"][0]["failed"] is True and saved["runs"][1]["failed"] is False
    assert saved["runs"][0]["error"] == "RuntimeError: simulated crash"
    assert saved["summaries"][0]["error"] == "RuntimeError: simulated crash"


def test_resume_reuses_identical_runs_only(tmp_path, monkeypatch):
    preset = Preset(name="t", methods=("sgd", "fp16"), rounds=1, num_clients=2)
    first = run_comparison(preset, tmp_path, engine="inprocess")
    calls = []
    real = compare_run.run_one

    def counting(plan, *args, **kwargs):
        calls.append(plan.spec.label)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(compare_run, "run_one", counting)
    # an interrupted resume keeps the reused runs in results.json
    monkeypatch.setattr(compare_run, "run_one", lambda *a, **k: (_ for _ in ()).throw(
        KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_comparison(preset, tmp_path, engine="inprocess", resume=True,
                       sets=parse_set(["fp16.lr=0.05"]))
    kept = json.loads((tmp_path / "results.json").read_text())
    assert [r["label"] for r in kept["runs"]] == ["sgd"]
    monkeypatch.setattr(compare_run, "run_one", counting)
    again = run_comparison(preset, tmp_path, engine="inprocess", resume=True,
                           sets=parse_set(["fp16.lr=0.05"]))
    assert calls == ["fp16"]  # sgd unchanged: reused; fp16's config changed: rerun
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["label"] for r in saved["runs"]] == ["sgd", "fp16"]
    assert again["runs"][0]["reused"] and again["runs"][0]["history"] == first["runs"][0]["history"]
    assert (tmp_path / "summary.md").is_file()


def test_an_interrupted_resume_keeps_the_earlier_runs_it_had_not_reached(tmp_path,
                                                                        monkeypatch):
    # Prepare: sgd and fp16 finished; a resume adds qsgd between them and is killed in it
    # (after it has rewritten the file with the reused sgd)
    run_comparison(Preset(name="t", methods=("sgd", "fp16"), rounds=1, num_clients=2),
                   tmp_path, engine="inprocess")
    real = compare_run.run_one
    longer = Preset(name="t", methods=("sgd", "qsgd", "fp16"), rounds=1, num_clients=2)
    monkeypatch.setattr(compare_run, "run_one", lambda *a, **k: (_ for _ in ()).throw(
        KeyboardInterrupt()))
    # Execute
    with pytest.raises(KeyboardInterrupt):
        run_comparison(longer, tmp_path, engine="inprocess", resume=True)
    # Assert: the file still holds both finished runs (pending: not in the reports)
    kept = compare.load_results(tmp_path)
    assert [r["label"] for r in kept["runs"]] == ["sgd"]
    assert [r["label"] for r in kept["pending"]] == ["fp16"]
    assert "| fp16 |" not in (tmp_path / "summary.md").read_text()
    calls = []
    monkeypatch.setattr(compare_run, "run_one",
                        lambda plan, *a, **k: calls.append(plan.spec.label) or real(plan, *a, **k))
    again = run_comparison(longer, tmp_path, engine="inprocess", resume=True)
    assert calls == ["qsgd"]  # the next resume reuses both
    assert [r.get("reused", False) for r in again["runs"]] == [True, False, True]
    assert compare.load_results(tmp_path)["pending"] == []


# ---------------------------------------------------------------------------- failures
def test_every_client_failing_is_a_failed_method_and_the_others_still_run(tmp_path,
                                                                          monkeypatch):
    # Prepare: the first method's in-process grid answers every message with an error, so
    # run_server's FailureWatch raises ClientFailureError (max-failed-rounds=1)
    real_grid, grids = compare_run.InProcessGrid, []

    def grid(client_app, num_nodes, **kwargs):
        grids.append(num_nodes)
        failing = (lambda rnd, node: True) if len(grids) == 1 else None
        return real_grid(client_app, num_nodes, failing=failing)

    monkeypatch.setattr(compare_run, "InProcessGrid", grid)
    preset = Preset(name="t", methods=("qsgd", "sgd"), rounds=1, num_clients=2,
                    target_accuracy=0.5)
    progress = io.StringIO()
    # Execute
    results = run_comparison(preset, tmp_path, engine="inprocess",
                             sets=parse_set(["max-failed-rounds=1"]),
                             progress=ConsoleProgress(progress, rounds=False))
    # Assert
    failed, ok = results["runs"]
    assert len(grids) == 2
    assert failed["failed"] and failed["status"] == "failed" and failed["history"] == []
    assert failed["error"].startswith("ClientFailureError: [qsgd] every sampled client failed")
    assert "simulated failure" in failed["error"] and "ClientFailureError" in failed["traceback"]
    assert not ok["failed"] and ok["status"] == "ok" and len(ok["history"]) == 2
    assert "[1/2] qsgd: FAILED after" in progress.getvalue()
    text = (tmp_path / "summary.md").read_text()
    assert "## Failed runs" in text and "- qsgd: ClientFailureError: [qsgd]" in text
    assert "| qsgd | - | - | - | - | - | failed |" in text
    with (tmp_path / "results.csv").open() as fh:
        assert {row.split(",")[0] for row in fh.read().splitlines()[1:]} == {"sgd"}
    for name in ("accuracy_vs_uplink.png", "accuracy_vs_rounds.png"):
        assert (tmp_path / name).is_file()
    saved = compare.load_results(tmp_path)
    assert [r["failed"] for r in saved["runs"]] == [True, False]


def test_resume_reruns_a_failed_method(tmp_path, monkeypatch):
    # Prepare: fp16 fails the first time
    real = compare_run.run_one
    calls = []

    def fp16_fails(plan, *args, **kwargs):
        if plan.spec.label == "fp16":
            raise RuntimeError("out of memory")
        return real(plan, *args, **kwargs)

    def counting(plan, *args, **kwargs):
        calls.append(plan.spec.label)
        return real(plan, *args, **kwargs)

    preset = Preset(name="t", methods=("sgd", "fp16"), rounds=1, num_clients=2)
    monkeypatch.setattr(compare_run, "run_one", fp16_fails)
    first = run_comparison(preset, tmp_path, engine="inprocess")
    assert [r["failed"] for r in first["runs"]] == [False, True]
    # Execute
    monkeypatch.setattr(compare_run, "run_one", counting)
    again = run_comparison(preset, tmp_path, engine="inprocess", resume=True)
    # Assert: sgd is reused, the failed fp16 runs again (same run config)
    assert calls == ["fp16"]
    assert again["runs"][0]["reused"] and not again["runs"][0]["failed"]
    assert again["runs"][1]["status"] == "ok" and again["runs"][1]["error"] == ""
    assert "## Failed runs" not in (tmp_path / "summary.md").read_text()


def test_reports_of_failed_records_do_not_crash(tmp_path):
    # a minimal failed record (no status, history or sizes), a multi-line error
    bare = {"label": "topk", "method": "topk", "family": "gradient", "config": {},
            "failed": True, "error": "ClientFailureError: first client error:\n  Traceback"}
    res = _results([_run("dq", [0.1, 0.5, 0.85], 100, family="dq"),
                    _run("qsgd", [], 0, status="failed"), bare])
    paths = compare.write_reports(res, tmp_path)
    text = paths["summary"].read_text()
    assert "- qsgd: RuntimeError: boom" in text
    assert "- topk: ClientFailureError: first client error: Traceback" in text
    assert "Every method failed" not in text
    assert [s["status"] for s in run_summaries(res)] == ["ok", "failed", "failed"]
    rows = paths["csv"].read_text().splitlines()[1:]
    assert len(rows) == 3 and all(r.startswith("dq,") for r in rows)
    # dq-flower report redraws from the written file
    again = compare.write_reports(compare.load_results(tmp_path), tmp_path)
    assert again["summary"].read_text() == text


def test_rounds_without_evaluation_survive_a_write_and_a_reload(tmp_path):
    # Prepare: eval-every leaves nan accuracy/loss in the rounds it skipped
    rec = _run("dq", [0.1, 0.5, 0.9], 100, family="dq")
    rec["history"][1].update(accuracy=math.nan, loss=math.nan)
    res = _results([rec])
    compare.write_reports(res, tmp_path)
    assert '"accuracy": null' in (tmp_path / "results.json").read_text()
    # Execute: what --resume and dq-flower report do
    saved = compare.load_results(tmp_path)
    # Assert: the skipped round reads back as nan and the summary is unchanged
    row = saved["runs"][0]["history"][1]
    assert math.isnan(row["accuracy"]) and math.isnan(row["loss"])
    assert saved["runs"][0]["history"][2]["accuracy"] == 0.9
    assert run_summaries(saved)[0]["rounds_to_target"] == run_summaries(res)[0][
        "rounds_to_target"] == 2
    assert summary_markdown(saved) == summary_markdown(res)


def test_summary_when_every_method_failed():
    res = _results([_run("dq", [], 0, family="dq", status="failed"),
                    _run("qsgd", [], 0, status="failed")])
    text = summary_markdown(res)
    assert "dq did not run successfully" in text
    assert "- dq: RuntimeError: boom" in text and "- qsgd: RuntimeError: boom" in text
    assert "Every method failed" in text
    assert [r["label"] for r in compare.failed_runs(res)] == ["dq", "qsgd"]


def test_error_line_is_one_bounded_line():
    long = {"error": "ValueError: " + "x " * 400 + "\nTraceback"}
    line = compare.error_line(long)
    assert "\n" not in line and len(line) == 300 and line.endswith("...")
    assert compare.error_line({"error": ""}) == "unknown error"
    assert compare.is_failed({"status": "failed"}) and compare.is_failed({"failed": True})
    assert not compare.is_failed({"status": "ok", "failed": False})


def test_verdict_names_the_strongest_competitor_of_any_kind():
    # fedavg (not a quantized gradient) needs the fewest bytes after dq; qsgd more
    res = _results([_run("dq", [0.1, 0.5, 0.85, 0.9], 100, family="dq"),
                    _run("qsgd", [0.1, 0.6, 0.7, 0.81], 1000),
                    _run("fedavg", [0.1, 0.9], 500, family="fedavg", codec="none")])
    text = summary_markdown(res)
    assert ("- **Strongest competitor overall** (fewest uplink bytes to 80.0% of every other "
            "method): fedavg with 500 B: dq used 2.5x fewer uplink bytes.") in text
    # a competitor that needs fewer bytes than dq is named as such
    res["runs"][2] = _run("fedavg", [0.1, 0.9], 150, family="fedavg", codec="none")
    assert ("fedavg with 150 B: dq used more (fedavg needed only 0.75x of dq's)."
            in summary_markdown(res))
    # nobody else reaches the target: a lower bound from the least total uplink
    res = _results([_run("dq", [0.1, 0.85], 100, family="dq"),
                    _run("qsgd", [0.1, 0.5, 0.6], 1000),
                    _run("fedavg", [0.1, 0.5], 700, family="fedavg", codec="none")])
    assert ("- **Strongest competitor overall**: no other method reached 80.0%; dq used at "
            "least 7x fewer uplink bytes than any of them (fedavg sent the least, 700 B)."
            in summary_markdown(res))


def test_eval_every_skips_the_test_set_between_evaluations_and_the_summary_ignores_the_gaps():
    from tests.dq.helpers import run_inprocess
    # Execute: 5 rounds, evaluated before round 1, after rounds 3 and 5 (the last) only
    every, _ = run_inprocess(rounds=5, seed=2, min_holdout_rows=0, **{"eval-every": 3})
    each, _ = run_inprocess(rounds=5, seed=2, min_holdout_rows=0)
    # Assert: the same training; accuracy only where evaluated, equal to the full run's
    accs = [r["accuracy"] for r in every.history]
    assert [math.isnan(a) for a in accs] == [False, True, True, False, True, False]
    for i in (0, 3, 5):
        assert accs[i] == each.history[i]["accuracy"]
    assert [r["cum_up_bytes"] for r in every.history] == \
        [r["cum_up_bytes"] for r in each.history]
    rec = {**_run("dq", [0.1], 1, family="dq"), "history": every.history}
    stats = run_summaries(_results([rec], target=0.01))[0]
    assert stats["best_accuracy"] == max(accs[i] for i in (0, 3, 5))
    assert stats["final_accuracy"] == accs[5]
    with pytest.raises(ValueError, match="eval-every: must be >= 1"):
        run_inprocess(rounds=2, **{"eval-every": 0})
