"""The harness's glue: named tasks to models and to each node's own data.

The plugin never imports it. PyTorch is imported only where a model is built, so a node's
data (its ``data-file``) loads without it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Context

from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import (
    load_dataset_cached,
    load_node_data,
    load_partition,
    load_task_dataset,
)

if TYPE_CHECKING:
    import torch

__all__ = ["TaskInfo", "ModelFactory", "task_info", "node_partition", "client_data",
           "client_eval_data", "build_model", "model_factory"]

#: ``factory() -> nn.Module``: a user's model given to ``simulate`` instead of a name.
ModelFactory = Callable[[], "torch.nn.Module"]


@dataclass(frozen=True)
class TaskInfo:
    """A task's data: classes (0 for float targets, ``target_dim`` wide), sample shape, d."""

    num_classes: int
    input_shape: tuple[int, ...]
    dim: int
    target_dim: int = 1

    @property
    def outputs(self) -> int:
        """Width of the model's output."""
        return self.num_classes or self.target_dim


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"input-shape: expected sizes like '1,28,28', got {text!r}")
    return shape


def task_info(task: TaskConfig) -> TaskInfo:
    """Describe the task's data (the named data set, loaded once per process).

    With ``dataset = "none"`` (every node brings its own ``data-file``) the run config's
    ``input-shape`` and ``num-classes`` describe it.
    """
    if task.dataset == "none":
        shape = _parse_shape(task.input_shape)
        return TaskInfo(task.num_classes, shape, math.prod(shape))
    ds = load_dataset_cached(task.dataset, task.data_dir or None, task.seed)
    target_dim = int(ds.train_y.shape[1]) if ds.train_y.ndim == 2 else 1
    return TaskInfo(ds.num_classes, tuple(ds.input_shape), ds.dim, target_dim)


def node_partition(context: Context, task: TaskConfig) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config (simulation sets them)."""
    cfg = context.node_config
    try:
        pid = int(cfg["partition-id"])
        num = int(cfg.get("num-partitions", task.num_partitions))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            "node config needs 'data-file' (the node's own .npz) or 'partition-id' (and "
            "'num-partitions') of a named data set; start the SuperNode with --node-config "
            "\"data-file=/path/local.npz\" or \"partition-id=K num-partitions=N\""
        ) from exc
    if not 0 <= pid < num:
        raise ValueError(f"partition-id {pid} is outside 0..{num - 1}")
    return pid, num


def _shaped(x: np.ndarray, task: TaskConfig) -> np.ndarray:
    shape = task_info(task).input_shape
    if shape and x.ndim == 2 and len(shape) > 1 and x.shape[1] == math.prod(shape):
        return x.reshape(x.shape[0], *shape)
    return x


def _data_dir(context: Context, task: TaskConfig) -> str | None:
    return str(context.node_config.get("data-dir", "")) or task.data_dir or None


def client_data(context: Context, task: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """The node's own training rows ``(x, y)``: its ``data-file`` as it is, else its partition.

    The partition's samples are in their shape (``(n, C, H, W)`` for images).
    """
    path = str(context.node_config.get("data-file", ""))
    if path:
        data = load_node_data(path)
        return data.train_x, data.train_y
    pid, num = node_partition(context, task)
    x, y, _ = load_partition(task.dataset, pid, num, task.partition, task.dirichlet_alpha,
                             task.seed, _data_dir(context, task),
                             validation_fraction=task.validation_fraction,
                             train_rows=task.train_rows)
    return _shaped(x, task), y


def client_eval_data(context: Context, task: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """The node's held-out rows: its ``data-file``'s ``x_test``/``y_test``, else its share.

    The share is every ``num``-th row from ``partition-id`` of the test split (the
    validation rows with ``validation-fraction``).
    """
    path = str(context.node_config.get("data-file", ""))
    if path:
        data = load_node_data(path)
        if data.test_x is None or data.test_y is None:
            raise ValueError(f"{path} holds no x_test/y_test for federated evaluation")
        return data.test_x, data.test_y
    pid, num = node_partition(context, task)
    ds = load_task_dataset(task.dataset, _data_dir(context, task), task.seed,
                           task.validation_fraction, task.train_rows, task.test_rows)
    return _shaped(ds.test_x[pid::num], task), ds.test_y[pid::num]


def build_model(task: TaskConfig, info: TaskInfo) -> torch.nn.Module:
    """The task's named model, initialised from the run seed, on the task's device."""
    # PyTorch: loaded only where a model is built
    from dq_flower.harness.tasks.models import make_model
    from dq_flower.model_ops import resolve_device

    model = make_model(task.model, info.input_shape, info.outputs, seed=task.seed)
    return model.to(resolve_device(task.device))


def model_factory(model: object) -> ModelFactory | None:
    """A factory for ``simulate(model=...)``: ``None`` for a model name.

    An ``nn.Module`` is deep-copied each time; a class or callable returning one is called
    (under Ray it must be importable on the workers).
    """
    import torch  # only when a simulation starts: client devices import this module

    if model is None or isinstance(model, str):
        return None
    if isinstance(model, torch.nn.Module):
        template = copy.deepcopy(model)
        return lambda: copy.deepcopy(template)
    if callable(model):
        return model
    raise TypeError("model must be a model name, an nn.Module, or a callable returning one; "
                    f"got {type(model).__name__}")
