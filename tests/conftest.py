"""Shared test setup: keep Flower and Ray quiet and inside temporary folders."""

import os
import tempfile

import pytest

_TMP = tempfile.mkdtemp(prefix="dq-flower-tests-")
os.environ.setdefault("FLWR_HOME", os.path.join(_TMP, "flwr"))
os.environ.setdefault("RAY_TMPDIR", os.path.join(_TMP, "ray"))
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(autouse=True, scope="session")
def _few_threads_for_shared_fixtures():
    """One PyTorch thread before any module-scoped fixture runs: float results depend on it."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _few_threads():
    import torch

    torch.set_num_threads(1)
    yield
