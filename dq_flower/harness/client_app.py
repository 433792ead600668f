"""The package's ``ClientApp``: the public client functions on the harness's named tasks.

A node's data comes from its node config (``data-file``, else ``partition-id`` of the named
data set), its model from the run config's name or a factory (``simulate(model=...)``). A
DQ data round with the ``uniform`` scorer and no compensation needs no PyTorch; every
other handler imports it first and, where it is missing, fails naming the knob.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from dq_flower.client import dq_train, evaluate
from dq_flower.config import read
from dq_flower.dq.scorer_choice import AUTO_SCORER_KEY, RUN_MODEL_KNOB_KEY, model_knob
from dq_flower.harness.methods import get_method
from dq_flower.harness.runtime import (
    ModelFactory,
    build_model,
    client_data,
    client_eval_data,
    task_info,
)
from dq_flower.harness.task_config import TaskConfig
from dq_flower.node import node_key
from dq_flower.torch_support import require_torch, torch_available
from dq_flower.wire.model import MODEL_KEY
from dq_flower.wire.partition import names_partition

if TYPE_CHECKING:
    import torch

__all__ = ["app", "make_client_app"]


def _task(msg: Message) -> tuple[dict[str, Any], TaskConfig]:
    config = dict(msg.content["config"].items()) if "config" in msg.content else {}
    return config, read(TaskConfig, config)


@contextmanager
def _threads(torch: Any, context: Context) -> Iterator[None]:
    """Give PyTorch the node config's ``num-threads`` (default 1) for one call, then restore.

    In the in-process engine the server shares this process and must not depend on it.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(context.node_config.get("num-threads", 1))))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_client_app(model_factory: ModelFactory | None = None) -> ClientApp:
    """A ClientApp for the harness; ``model_factory`` replaces the named model if given."""
    app = ClientApp()

    def model_for(task: TaskConfig) -> torch.nn.Module:
        return build_model(task, task_info(task)) if model_factory is None else model_factory()

    @app.train()
    @names_partition  # its own checks' errors too, as the client functions' below
    def train(msg: Message, context: Context) -> Message:
        """Route a train message to the method family's client function."""
        config, task = _task(msg)
        method = str(config.get("method", "dq"))
        family = get_method(method).family
        if family == "dq":
            knob = model_knob(config) or config.get(RUN_MODEL_KNOB_KEY)
            if knob is None and MODEL_KEY in msg.content.array_records:
                knob = "the model the server sent"
            if knob is None:  # model-free; under scorer "auto" a node with PyTorch scores
                holds = bool(config.get(AUTO_SCORER_KEY)) and torch_available()
                return dq_train(msg, context, client_data(context, task),
                                model=model_for(task) if holds else None)
            with _threads(require_torch(knob), context):
                return dq_train(msg, context, client_data(context, task), model=model_for(task))
        with _threads(require_torch(f"method {method!r}"), context):
            x, y = client_data(context, task)
            if family == "gradient":
                from dq_flower.baselines.client import gradient_train  # PyTorch, checked above

                return gradient_train(msg, context, (x, y), model=model_for(task))
            if family in ("fedavg", "compressed"):
                from dq_flower.harness.fedavg_client import fedavg_train  # PyTorch, checked above

                model = model_for(task)

                def local_epochs(m: Message, c: Context) -> Message:
                    return fedavg_train(m, c, x, y, model, task.seed, node_key(c))

                if family == "fedavg":
                    return local_epochs(msg, context)
                from dq_flower.compression.mod import compression_mod  # PyTorch, checked above

                return compression_mod(msg, context, local_epochs)  # the coded update
            raise ValueError(f"this ClientApp has no handler for method family {family!r}")

    @app.evaluate()
    @names_partition
    def evaluate_handler(msg: Message, context: Context) -> Message:
        """Evaluate the global model on this node's held-out rows."""
        with _threads(require_torch("federated evaluation (fraction-evaluate > 0)"), context):
            _, task = _task(msg)
            return evaluate(msg, context, client_eval_data(context, task), model=model_for(task))

    return app


#: The ClientApp of ``pyproject.toml`` (``flwr run``) and of ``simulate`` with model names.
app = make_client_app()
