"""Three presets' round histories match the committed references (``tests/reference``).

A change that moves code without changing behaviour leaves them identical. A change that
means to alter behaviour rerecords them (``python -m tests.reference.histories --write``,
on each kind of machine that has references) and says so. The comparison is exact on the
kind of machine that recorded them; on another kind, whose CPU kernels round differently,
it is loose (final accuracy and uplink per method, see ``histories.LOOSE``).
"""

from __future__ import annotations

import json

import pytest

from tests.reference.histories import (
    FIRST,
    SCENARIOS,
    compare_with_references,
    differences,
    loose_differences,
    run_scenario,
)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_history_matches_reference(name, tmp_path):
    diff = compare_with_references(name, run_scenario(name, tmp_path / name))
    assert not diff, "\n".join(diff[:30])


def test_the_loose_comparison_notices_a_changed_outcome():
    expected = json.loads((FIRST / "digits-mlp.json").read_text())
    assert loose_differences(expected, json.loads(json.dumps(expected))) == []
    worse = json.loads(json.dumps(expected))
    worse["dq"][-1]["accuracy"] -= 0.06
    worse["qsgd"][-1]["cum_up_bytes"] *= 1.2
    worse["fedavg-qsgd2"] = worse["fedavg-qsgd2"][:-1]
    assert sorted(loose_differences(expected, worse)) == sorted([
        ".dq: final accuracy " + f"{expected['dq'][-1]['accuracy'] - 0.06:.4f}, expected "
        + f"{expected['dq'][-1]['accuracy']:.4f}",
        ".qsgd: uplink " + f"{expected['qsgd'][-1]['cum_up_bytes'] * 1.2:.0f} B, expected "
        + f"{expected['qsgd'][-1]['cum_up_bytes']:.0f} B",
        f".fedavg-qsgd2: {len(worse['fedavg-qsgd2'])} rounds, expected "
        + f"{len(expected['fedavg-qsgd2'])}"])


def test_differences_notices_a_changed_byte_count():
    history = {"dq": [{"round": 1, "up_bytes": 100, "accuracy": 0.5}]}
    changed = {"dq": [{"round": 1, "up_bytes": 101, "accuracy": 0.5}]}
    assert differences(history, changed) == [".dq[0].up_bytes: 101, expected 100"]
    assert differences(history, json.loads(json.dumps(history))) == []
