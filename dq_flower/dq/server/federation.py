"""What the server knows of the federation's data: its spec, layout, store and bounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.dq.server.store import RowLayout, SampleStore
from dq_flower.dq.server.token_intake import TokenLayout
from dq_flower.wire.dq_batch import DataSpec

__all__ = ["FederationData"]


@dataclass
class FederationData:
    """What the server knows of the federation's data; only its own methods write it.

    A spec or value bound learned from replies is provisional: :meth:`forget_unconfirmed`
    drops it while no row is stored.
    """

    num_classes: int | None = None
    value_bound: float | None = None  # largest absolute value an upload may decode to
    spec: DataSpec | None = None
    mode: str = "sample"  # range mode of the uploads: sample, channel or feature
    layout: RowLayout | TokenLayout | None = None
    store: SampleStore | None = None
    duplicates: int = 0  # rows of this round's replies the server already held
    provisional: dict[str, bool] = field(default_factory=lambda: {"spec": False,
                                                                  "bound": False})

    def __post_init__(self) -> None:
        self._given_classes = self.num_classes  # what forgetting a learned spec goes back to

    @property
    def ranges(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each client's feature ranges ``(lo, span)``, kept by the store."""
        return {} if self.store is None else self.store.ranges

    @property
    def stored(self) -> int:
        """Samples in the store."""
        return 0 if self.store is None else len(self.store)

    def adopt(self, spec: DataSpec, classes: int | None, mode: str,
              layout: RowLayout | TokenLayout, store: SampleStore,
              provisional: bool = False) -> None:
        """Take ``spec`` (``classes``: what the model check gave) with its layout and store.

        ``provisional``: learned from replies (forgotten while none of its rows is stored).
        """
        if spec.target == "class":
            self.num_classes = classes
        self.spec, self.mode, self.layout, self.store = spec, mode, layout, store
        self.provisional["spec"] = provisional

    def learn_bound(self, bound: float) -> None:
        """Take the value bound the round's replies agreed on (provisional)."""
        self.value_bound, self.provisional["bound"] = bound, True

    def forget_unconfirmed(self) -> None:
        """Forget a spec and bound learned from replies while no row of them is stored."""
        if not self.stored and self.provisional["spec"]:
            self.spec, self.layout, self.store, self.mode = None, None, None, "sample"
            self.num_classes = self._given_classes
        if not self.stored and self.provisional["bound"]:
            self.value_bound = None
        self.provisional = {"spec": False, "bound": False}

    def count_duplicates(self, rows: int) -> None:
        """Count ``rows`` of a reply that the server already held (dropped)."""
        self.duplicates += rows

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

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """What was learned: spec, classes, feature ranges, the store, the value bound."""
        return {"spec": None if self.spec is None else dataclasses.asdict(self.spec),
                "num_classes": self.num_classes,
                "ranges": {int(k): (lo.copy(), span.copy())
                           for k, (lo, span) in self.ranges.items()},
                "store": None if self.store is None else self.store.state(),
                "value_bound": self.value_bound, "provisional": dict(self.provisional)}

    def load_state(self, state: dict[str, Any], fix_spec: Callable[[DataSpec], None]) -> None:
        """Inverse of :meth:`state`; ``fix_spec`` adopts the spec again (a new store)."""
        self.num_classes = state.get("num_classes", self.num_classes)
        if state.get("spec") is not None:
            spec = state["spec"]
            fix_spec(DataSpec(tuple(spec["sample_shape"]), spec["target"],
                              int(spec["target_dim"])))
        if self.store is not None:
            for node, (lo, span) in state.get("ranges", {}).items():
                self.store.set_ranges(int(node), lo, span)
            if state.get("store") is not None:
                self.store.load_state(state["store"])
        self.value_bound = state.get("value_bound", self.value_bound)
        self.provisional = {"spec": False, "bound": False, **state.get("provisional", {})}
