"""What the server knows of the federation's data: its spec, layout, store and bounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dq_flower.dq.server.store import RowLayout, SampleStore
from dq_flower.dq.server.token_intake import TokenLayout
from dq_flower.wire.dq_batch import DataSpec

__all__ = ["FederationData"]


@dataclass
class FederationData:
    """What the server knows of the federation's data (the intake writes, the rest reads)."""

    num_classes: int | None = None
    value_bound: float | None = None  # largest absolute value an upload may decode to
    spec: DataSpec | None = None
    mode: str = "sample"  # range mode of the uploads: sample, channel or feature
    layout: RowLayout | TokenLayout | None = None
    store: SampleStore | None = None
    duplicates: int = 0  # rows of this round's replies the server already held

    @property
    def ranges(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each client's feature ranges ``(lo, span)``, kept by the store."""
        return {} if self.store is None else self.store.ranges

    @property
    def stored(self) -> int:
        """Samples in the store."""
        return 0 if self.store is None else len(self.store)

    def take_duplicates(self) -> int:
        """Rows of the round's replies the server already held (dropped); the count restarts."""
        out, self.duplicates = self.duplicates, 0
        return out

    def may_use_feature_ranges(self, ranges: str) -> bool:
        """Whether replies may carry feature ranges under the ``ranges`` knob."""
        if self.spec is None:
            return ranges in ("auto", "feature")
        return self.mode == "feature"

    def shaped(self, x: np.ndarray) -> np.ndarray:
        """Flat rows shaped as the data spec's samples (batch first)."""
        assert self.spec is not None
        return x.reshape(-1, *self.spec.sample_shape)
