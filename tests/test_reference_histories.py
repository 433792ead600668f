"""Three presets' round histories match the committed references (``tests/reference``).

The references were recorded before the package's layers were reorganised; a change that
moves code without changing behaviour leaves them identical. A change that means to alter
behaviour rerecords them (``python -m tests.reference.histories --write``) and says so.
"""

from __future__ import annotations

import json

import pytest

from tests.reference.histories import HERE, SCENARIOS, differences, run_scenario


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_history_matches_reference(name, tmp_path):
    expected = json.loads((HERE / f"{name}.json").read_text())
    diff = differences(expected, run_scenario(name, tmp_path / name), name)
    assert not diff, "\n".join(diff[:30])


def test_differences_notices_a_changed_byte_count():
    history = {"dq": [{"round": 1, "up_bytes": 100, "accuracy": 0.5}]}
    changed = {"dq": [{"round": 1, "up_bytes": 101, "accuracy": 0.5}]}
    assert differences(history, changed) == [".dq[0].up_bytes: 101, expected 100"]
    assert differences(history, json.loads(json.dumps(history))) == []
