"""Glue shared by client and server: data of a node, models, weighted gradients, model records."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context

from .codecs import Payload, make
from .config import TaskConfig
from .tasks.data import load_dataset_cached, load_partition
from .tasks.models import make_model
from .tasks.params import get_flat, set_flat

__all__ = [
    "TaskInfo",
    "task_info",
    "node_partition",
    "client_data",
    "build_model",
    "resolve_device",
    "state_arrays",
    "weighted_loss_grad",
    "model_record",
    "load_model_record",
    "round_rng",
]

MODEL_KEY = "model"


@dataclass(frozen=True)
class TaskInfo:
    """What both sides must agree on about the data: classes, sample shape, dimension."""

    num_classes: int
    input_shape: tuple[int, ...]
    dim: int


def task_info(task: TaskConfig) -> TaskInfo:
    """Describe the task's data set (loads it once per process)."""
    ds = load_dataset_cached(task.dataset, task.data_dir or None, task.seed)
    return TaskInfo(ds.num_classes, tuple(ds.input_shape), ds.dim)


def node_partition(context: Context, task: TaskConfig) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config (simulation sets them)."""
    cfg = context.node_config
    try:
        pid = int(cfg["partition-id"])
        num = int(cfg.get("num-partitions", task.num_partitions))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            "node config needs 'partition-id' (and 'num-partitions'); start the SuperNode "
            "with --node-config \"partition-id=K num-partitions=N\""
        ) from exc
    if not 0 <= pid < num:
        raise ValueError(f"partition-id {pid} is outside 0..{num - 1}")
    return pid, num


def client_data(context: Context, task: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """Return this node's own training rows ``(x, y)``, never the whole data set."""
    pid, num = node_partition(context, task)
    data_dir = str(context.node_config.get("data-dir", "")) or task.data_dir or None
    x, y, _ = load_partition(task.dataset, pid, num, task.partition, task.dirichlet_alpha,
                             task.seed, data_dir)
    return x, y


def resolve_device(name: str) -> torch.device:
    """``auto``: a CUDA GPU when one is visible to this process, else the CPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but no CUDA GPU is visible")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def build_model(task: TaskConfig, info: TaskInfo) -> torch.nn.Module:
    """The task's model, initialised from the run seed (on the CPU), on the task's device."""
    model = make_model(task.model, info.input_shape, info.num_classes, seed=task.seed)
    return model.to(resolve_device(task.device))


def state_arrays(model: torch.nn.Module) -> ArrayRecord:
    """The model's state dict as a Flower ``ArrayRecord`` (tensors copied to the CPU)."""
    return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})


def weighted_loss_grad(
    model: torch.nn.Module, x: np.ndarray, y: np.ndarray, w: np.ndarray
) -> tuple[float, np.ndarray]:
    """``sum_i w_i CE(model(x_i), y_i)`` and its flat float32 gradient."""
    params = list(model.parameters())
    dev = params[0].device
    xt = torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32).to(dev)
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long).to(dev)
    wt = torch.as_tensor(np.asarray(w), dtype=torch.float32).to(dev)
    with torch.enable_grad():
        loss = (F.cross_entropy(model(xt), yt, reduction="none") * wt).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, params, strict=True)])
    return float(loss.detach()), flat.detach().cpu().numpy().astype(np.float32, copy=True)


def model_record(model: torch.nn.Module) -> ArrayRecord:
    """The model's parameters as one raw float32 vector (no ``np.save`` headers)."""
    return make("identity").encode(get_flat(model)).to_record()


def load_model_record(model: torch.nn.Module, record: ArrayRecord) -> None:
    """Load parameters sent by :func:`model_record`; raises ``ValueError`` if inconsistent."""
    vec = make("identity").decode(Payload.from_record(record))
    set_flat(model, vec)


def round_rng(seed: int, server_round: int, node: int, purpose: int = 0) -> np.random.Generator:
    """Generator for one (run seed, round, node, purpose): never the global RNG or the clock."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(server_round), int(node), purpose])
