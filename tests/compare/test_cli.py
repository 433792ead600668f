"""The ``dq-flower`` command: files and columns it writes, and its one-line errors."""

from __future__ import annotations

import csv
import json
import re

import pytest

from dq_flower.cli import build_parser, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAST = ["--engine", "inprocess", "--num-clients", "2", "--rounds", "2", "--quiet"]


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    code = main(["compare", "--preset", "digits-mlp", "--methods", "dq,fedavg,qsgd", *FAST,
                 "--target-accuracy", "0.3", "--set", "dq.server-steps=3", "--set",
                 "batch-size=16", "--out", str(out)])
    return code, out


def test_compare_writes_every_file(compare_run):
    code, out = compare_run
    assert code == 0
    for name in ("results.json", "results.csv", "summary.md", "accuracy_vs_uplink.png",
                 "accuracy_vs_rounds.png"):
        assert (out / name).is_file(), name
    for name in ("accuracy_vs_uplink.png", "accuracy_vs_rounds.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_results_csv_has_one_row_per_method_and_round(compare_run):
    _, out = compare_run
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert set(rows[0]) >= {"label", "method", "round", "accuracy", "loss", "up_bytes",
                            "down_bytes", "cum_up_bytes", "cum_down_bytes", "wall_s"}
    assert [(r["label"], r["round"]) for r in rows] == [
        (m, str(k)) for m in ("dq", "fedavg", "qsgd") for k in range(3)]
    last = [r for r in rows if r["label"] == "qsgd"][-1]
    assert int(last["cum_up_bytes"]) > 0 and 0.0 <= float(last["accuracy"]) <= 1.0


def test_results_json_records_scenario_and_overrides(compare_run):
    _, out = compare_run
    data = json.loads((out / "results.json").read_text())
    runs = {r["label"]: r for r in data["runs"]}
    assert set(runs) == {"dq", "fedavg", "qsgd"}
    assert all(r["status"] == "ok" for r in runs.values())
    assert runs["dq"]["config"]["server-steps"] == 3
    assert runs["qsgd"]["config"]["batch-size"] == 16 == runs["fedavg"]["config"]["batch-size"]
    # same scenario for every method
    for key in ("seed", "partition", "num-partitions", "num-server-rounds", "dataset"):
        assert len({r["config"][key] for r in runs.values()}) == 1
    assert data["preset"]["rounds"] == 2 and data["engine"] == "inprocess"
    assert len(data["summaries"]) == 3


def test_summary_states_model_and_data_dims_and_the_ratio_to_dq(compare_run):
    _, out = compare_run
    text = (out / "summary.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    for column in ("| D |", "| d |", "uplink payload", "final acc", "rounds to 30.0%",
                   "uplink to 30.0%", "uplink vs dq"):
        assert column in header
    assert "D = 9,610 model parameters, d = 64 data coordinates" in text
    assert "## Verdict" in text and "trusted networks" in text
    dq_row = next(line for line in text.splitlines() if line.startswith("| dq |"))
    assert "b/sample" in dq_row


def test_report_redraws_from_results_json(compare_run, capsys):
    _, out = compare_run
    (out / "summary.md").unlink()
    assert main(["report", str(out), "--target-accuracy", "0.99"]) == 0
    assert "rounds to 99.0%" in (out / "summary.md").read_text()
    assert main(["report", str(out / "nowhere")]) == 2
    assert "no results.json" in capsys.readouterr().err


def _error(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse-level errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code not in (0, None)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_unknown_preset(capsys):
    err = _error(capsys, ["compare", "--preset", "no-such-preset"])
    assert "unknown preset 'no-such-preset'" in err and "digits-mlp" in err


def test_unknown_method(capsys):
    err = _error(capsys, ["compare", "--methods", "dq,nosuch", *FAST])
    assert "unknown method 'nosuch'" in err and "fedavg" in err


@pytest.mark.parametrize("argv, names", [
    (["--rounds", "0"], "--rounds"),
    (["--rounds", "x"], "--rounds"),
    (["--alpha", "-1"], "--alpha"),
    (["--fraction-train", "1.5"], "--fraction-train"),
    (["--target-accuracy", "0"], "--target-accuracy"),
    (["--partition", "zipf"], "--partition"),
    (["--engine", "gpu"], "--engine"),
    (["--num-gpus-per-client", "-1"], "--num-gpus-per-client"),
])
def test_bad_flag_value_names_the_flag(capsys, argv, names):
    err = _error(capsys, ["compare", *argv])
    assert names in err


@pytest.mark.parametrize("setting, names", [
    ("bits=9", "bits"),
    ("dq.budget=0", "budget"),
    ("no-such-knob=1", "no-such-knob"),
    ("seed=3", "seed"),
    ("qsgd.levels=abc", "levels"),
    ("nothing", "--set"),
])
def test_bad_set_value_names_the_key(capsys, setting, names):
    err = _error(capsys, ["compare", "--methods", "dq,qsgd", *FAST, "--set", setting])
    assert names in err


def test_missing_data_folder(capsys, tmp_path):
    err = _error(capsys, ["compare", "--preset", "fmnist-cnn", "--data-dir", str(tmp_path),
                          *FAST])
    assert "not found" in err and str(tmp_path) in err


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["compare"]
    for action in sub._actions:
        for flag in action.option_strings:
            assert flag in text
        assert action.help, action.dest


def test_list_presets(capsys):
    assert main(["compare", "--list-presets"]) == 0
    out = capsys.readouterr().out
    for name in ("digits-mlp", "fmnist-cnn", "fmnist-wide-cnn", "cifar10-resnet"):
        assert name in out
    assert "ef-signsgd" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "compare" in capsys.readouterr().out


def test_out_must_be_a_folder(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    err = _error(capsys, ["compare", "--methods", "dq", *FAST, "--out", str(tmp_path / "file")])
    assert "--out" in err


def _fail_methods(monkeypatch, labels):
    from dq_flower.compare import run as compare_run

    real = compare_run.run_one

    def run_one(plan, *args, **kwargs):
        if plan.spec.label in labels:
            raise RuntimeError(f"{plan.spec.label} crashed")
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(compare_run, "run_one", run_one)


def test_some_methods_failing_still_exits_zero(capsys, monkeypatch, tmp_path):
    _fail_methods(monkeypatch, {"signsgd"})
    code = main(["compare", "--methods", "signsgd,sgd", *FAST, "--rounds", "1", "--out",
                 str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0
    assert "signsgd failed: RuntimeError: signsgd crashed" in err
    assert "1 of 2 methods failed" in err and "dq-flower: sgd failed" not in err
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [(r["label"], r["failed"]) for r in runs] == [("signsgd", True), ("sgd", False)]


def test_every_method_failing_exits_non_zero(capsys, monkeypatch, tmp_path):
    _fail_methods(monkeypatch, {"signsgd", "sgd"})
    code = main(["compare", "--methods", "signsgd,sgd", *FAST, "--rounds", "1", "--out",
                 str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "signsgd failed: RuntimeError: signsgd crashed" in err
    assert "sgd failed: RuntimeError: sgd crashed" in err
    assert "every method failed" in err
    assert (tmp_path / "summary.md").is_file()


def test_every_client_failing_ends_compare_with_the_cause_in_its_last_line(capsys, monkeypatch,
                                                                          tmp_path):
    from dq_flower.compare import run as compare_run

    real_grid = compare_run.InProcessGrid

    def failing_grid(client_app, num_nodes, **kwargs):  # every reply an error reply
        return real_grid(client_app, num_nodes, failing=lambda _rnd, _node: True)

    monkeypatch.setattr(compare_run, "InProcessGrid", failing_grid)
    code = main(["compare", "--methods", "qsgd", *FAST, "--rounds", "3", "--out",
                 str(tmp_path)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert last.startswith("dq-flower: error: every method failed"), last
    assert re.search(r"qsgd: ClientFailureError: \[qsgd\] every sampled client failed for 3 "
                     r"consecutive rounds; first client error, from node \d+ \(partition "
                     r"unknown: the error names none\): simulated failure$", last), last


@pytest.mark.slow
def test_compare_in_flowers_simulation_engine(tmp_path):
    code = main(["compare", "--methods", "dq,signsgd", "--num-clients", "2", "--rounds", "2",
                 "--quiet", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["engine"] == "simulation"
    assert [len(r["history"]) for r in data["runs"]] == [3, 3]


def test_compare_on_a_row_subset_reports_time_per_device_and_link(tmp_path, capsys):
    out = tmp_path / "devices"
    code = main(["compare", "--preset", "digits-mlp", "--methods", "dq,fedavg", *FAST,
                 "--set", "train-rows=300", "--set", "test-rows=100", "--device", "rpi4",
                 "--device", "mcu", "--server-device", "gpu", "--link", "lte", "--link",
                 "nbiot", "--out", str(out)])
    assert code == 0
    assert "(d = 64, 300 training samples)" in capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert data["workload"]["rows_per_client"] == [150, 150]  # the subset, split in two
    assert [d["name"] for d in data["devices"]] == ["rpi4", "mcu"]
    assert data["server_device"]["name"] == "gpu"
    assert all(r["config"]["train-rows"] == 300 for r in data["runs"])
    text = (out / "summary.md").read_text()
    rows = [x for x in text.splitlines() if x.startswith(("| rpi4 |", "| mcu |"))]
    assert len(rows) == 4  # two devices on two links
    mcu_lte = next(x for x in rows if x.startswith("| mcu | lte |"))
    assert mcu_lte.split("|")[4].strip() == "cannot train"  # fedavg's clients train
    assert "Raspberry Pi 4" in text and "NB-IoT" in text
    verdict = text.split("## Verdict")[1]
    assert "with every client on mcu (server on gpu): lte " in verdict  # fastest per pair
    assert "with every client on rpi4 (server on gpu): lte " in verdict


def test_report_adds_the_device_table_without_rerunning(compare_run, capsys):
    _, out = compare_run
    before = json.loads((out / "results.json").read_text())
    assert "workload" not in before
    assert main(["report", str(out), "--device", "phone", "--device", "slowpi=2"]) == 0
    text = (out / "summary.md").read_text()
    assert "| phone | lte |" in text and "| slowpi | wifi |" in text
    assert "server on measured" in text
    after = json.loads((out / "results.json").read_text())
    assert after["workload"]["rows_per_client"] == [719, 718]  # digits' 1,437 training rows
    assert [r["history"] for r in after["runs"]] == [r["history"] for r in before["runs"]]
    err = _error(capsys, ["report", str(out), "--device", "toaster"])
    assert "unknown device profile 'toaster'" in err and "rpi4" in err
