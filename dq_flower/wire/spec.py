"""The data spec, kept here for the harness's import: it lives in :mod:`dq_flower.wire.dq_batch`."""

from dq_flower.wire.dq_batch import DataSpec

__all__ = ["DataSpec"]
