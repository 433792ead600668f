"""The comparison's log axes label their ticks without overlap, however narrow the span."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dq_flower.compare.reports import label_log_axis  # noqa: E402


def _tick_boxes(lo: float, hi: float, fix: bool) -> tuple[list[str], bool]:
    """The visible x tick labels of a log plot from ``lo`` to ``hi``, and whether any overlap."""
    fig, ax = plt.subplots(figsize=(8.5, 5.0), dpi=110)  # the size write_plots draws
    ax.plot([lo, hi], [80.0, 86.0])
    ax.set_xscale("log")
    if fix:
        label_log_axis(ax)
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    labels = [t for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)
              if t.get_text() and lo <= t.get_position()[0] <= hi]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    plt.close(fig)
    overlap = any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:], strict=False))
    return [t.get_text() for t in labels], overlap


@pytest.mark.parametrize(("lo", "hi"), [(0.1, 0.102), (250.0, 255.0), (120.0, 700.0),
                                        (20.0, 2300.0), (1e3, 1e9)])
def test_log_axis_labels_do_not_overlap(lo, hi):
    texts, overlap = _tick_boxes(lo, hi, fix=True)
    assert not overlap, texts
    assert len(texts) >= 2, texts  # still says where the data is


def test_matplotlibs_own_labels_overlap_on_a_narrow_span():
    """The case the helper exists for (a run's times within 2% of each other)."""
    texts, overlap = _tick_boxes(0.1, 0.102, fix=False)
    assert overlap, texts
