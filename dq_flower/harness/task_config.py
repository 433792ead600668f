"""The harness's task: which named data set, model and partition a run uses.

Only the package's own harness (``simulate``, ``dq-flower compare``, the package's apps)
knows named data sets and models; the strategies never see a ``TaskConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dq_flower.config import check as _check
from dq_flower.config import client_keys, client_knob

__all__ = ["TaskConfig", "CLIENT_TASK_KEYS"]

#: Task keys the package's ClientApp reads from each message (nothing else travels).



@dataclass(frozen=True)
class TaskConfig:
    """What is trained on what: data set, model, partition, clients, rounds, seed.

    Attributes
    ----------
    dataset : str
        ``digits`` (default, ships with scikit-learn), ``fmnist``, ``cifar10``,
        ``npz:<path>``, or ``none`` (the server holds no data: every node brings its own
        ``data-file``; give ``input_shape`` and ``num_classes``).
    model : str
        ``logreg``, ``mlp``, ``cnn``, ``wide-cnn``, ``resnet20`` or ``resnet18``.
    num_partitions : int
        Number of client partitions (the number of SuperNodes in simulation).
    partition : str
        ``iid``, ``dirichlet`` or ``pathological``.
    dirichlet_alpha : float
        Concentration of the Dirichlet partition (smaller is more skewed).
    num_server_rounds : int
        Server rounds.
    fraction_train : float
        Fraction of available clients sampled each round.
    min_available : int
        Fewest valid replies a round needs to update the model.
    seed : int
        Root of every random choice.
    data_dir : str
        Where the data files live ("" means the data set's default).
    round_timeout : float
        Seconds to wait for replies each round.
    checkpoint_dir : str
        Folder for the server's checkpoint ("" = none); a run finding one there resumes.
    checkpoint_every : int
        Save the server's state every this many rounds.
    device : str
        Where models train: ``auto`` (a CUDA GPU when one is visible, else the CPU),
        ``cpu`` or ``cuda``.
    input_shape : str
        Sample shape (``"1,28,28"``) when ``dataset`` is ``none``.
    num_classes : int
        Classes when ``dataset`` is ``none`` (0 for float targets).
    fraction_evaluate : float
        Fraction of the nodes that evaluate the global model on their own held-out rows
        each round (federated evaluation; 0 = off, the server evaluates on its test set).
    max_failed_rounds : int
        Stop the run when every sampled client fails this many rounds in a row (0: never).
    validation_fraction : float
        With ``f > 0`` (learning-rate tuning) a fraction ``f`` of the named data set's
        training rows, drawn by ``seed``, is held out: clients train on the other rows only
        and the model is evaluated on the held-out ones instead of the test set, which is
        never read (see :func:`dq_flower.harness.tasks.data.validation_view`). 0 = off.
    train_rows : int
        Train on a subset of this many of the named data set's training rows, drawn by
        ``seed`` (the clients partition the subset), to size a run to a slow machine.
        0 (default): all.
    test_rows : int
        Evaluate on a subset of this many of its test rows, drawn by ``seed``. 0: all.
    eval_every : int
        The server evaluates the global model on its test rows every ``eval_every``
        rounds, and always before the first and after the last; the other rounds' history
        rows carry ``nan`` accuracy and loss (rounds and bytes to a target are then known
        to within ``eval_every`` rounds, rounded up). 1 (default): every round.
    """

    dataset: str = client_knob("digits")
    model: str = client_knob("mlp")
    num_partitions: int = client_knob(4)
    partition: str = client_knob("iid")
    dirichlet_alpha: float = client_knob(0.5)
    num_server_rounds: int = 5
    fraction_train: float = 1.0
    min_available: int = 1
    seed: int = client_knob(0)
    data_dir: str = client_knob("")
    round_timeout: float = 600.0
    checkpoint_dir: str = ""
    checkpoint_every: int = 1
    device: str = client_knob("auto")
    input_shape: str = client_knob("")
    num_classes: int = client_knob(0)
    fraction_evaluate: float = client_knob(0.0)
    max_failed_rounds: int = 3
    validation_fraction: float = client_knob(0.0)
    train_rows: int = client_knob(0)
    test_rows: int = client_knob(0)
    eval_every: int = 1

    def __post_init__(self) -> None:
        _check(self.num_partitions >= 1, "num_partitions", "must be >= 1")
        _check(self.partition in {"iid", "dirichlet", "pathological"}, "partition",
               f"must be iid, dirichlet or pathological, got {self.partition!r}")
        _check(self.dirichlet_alpha > 0, "dirichlet_alpha", "must be > 0")
        _check(self.num_server_rounds >= 1, "num_server_rounds", "must be >= 1")
        _check(0 < self.fraction_train <= 1, "fraction_train", "must be in (0, 1]")
        _check(self.min_available >= 1, "min_available", "must be >= 1")
        _check(self.round_timeout > 0, "round_timeout", "must be > 0")
        _check(self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
        _check(0 <= self.fraction_evaluate <= 1, "fraction_evaluate", "must be in [0, 1]")
        _check(self.num_classes >= 0, "num_classes", "must be >= 0")
        _check(self.max_failed_rounds >= 0, "max_failed_rounds", "must be >= 0")
        _check(self.eval_every >= 1, "eval_every", "must be >= 1")
        _check(self.train_rows >= 0, "train_rows", "must be >= 0 (0: all)")
        _check(self.test_rows >= 0, "test_rows", "must be >= 0 (0: all)")
        _check(0 <= self.validation_fraction < 1, "validation_fraction", "must be in [0, 1)")
        if self.validation_fraction:
            _check(self.dataset != "none", "validation_fraction",
                   "needs a named data set (the server holds no training rows with 'none')")
        if self.dataset == "none":
            _check(bool(self.input_shape), "input_shape",
                   "is needed when dataset is 'none' (the server holds no data)")
            _check(self.fraction_evaluate > 0, "fraction_evaluate",
                   "must be > 0 when dataset is 'none' (no test set on the server)")
        _check(self.device in {"auto", "cpu", "cuda"}, "device",
               f"must be auto, cpu or cuda, got {self.device!r}")


#: Task keys the package's ClientApp reads (the fields marked ``client_knob``).
CLIENT_TASK_KEYS = client_keys(TaskConfig)
