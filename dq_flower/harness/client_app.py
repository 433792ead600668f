"""The package's ``ClientApp``: the public client functions on the harness's named tasks.

Each node finds its data from its node config (``data-file`` for the device's own ``.npz``,
else ``partition-id``/``num-partitions`` of the named data set) and its model from the run
config's name, or from a factory (``simulate(model=...)``). Training goes through the same
public functions a user's app calls: :func:`dq_flower.client.dq_train`,
:func:`dq_flower.client.gradient_train` and :func:`dq_flower.client.evaluate`.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from dq_flower.client import dq_train, evaluate, gradient_train
from dq_flower.config import from_mapping
from dq_flower.harness.fedavg_client import fedavg_train
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
from dq_flower.protocol.model import MODEL_KEY

__all__ = ["app", "make_client_app"]


def _task(msg: Message) -> tuple[dict[str, Any], TaskConfig]:
    config = dict(msg.content["config"].items()) if "config" in msg.content else {}
    return config, from_mapping(TaskConfig, config)


def make_client_app(model_factory: ModelFactory | None = None) -> ClientApp:
    """A ClientApp for the harness; ``model_factory`` replaces the named model if given."""
    app = ClientApp()

    def model_for(task: TaskConfig) -> torch.nn.Module:
        if model_factory is not None:
            return model_factory()
        return build_model(task, task_info(task))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        """Route a train message to the method family's client function."""
        torch.set_num_threads(max(1, int(context.node_config.get("num-threads", 1))))
        config, task = _task(msg)
        family = get_method(str(config.get("method", "dq"))).family
        x, y = client_data(context, task)
        if family == "dq":
            needs_model = MODEL_KEY in msg.content.array_records
            return dq_train(msg, context, (x, y), model=model_for(task) if needs_model else None)
        if family == "gradient":
            return gradient_train(msg, context, (x, y), model=model_for(task))
        if family == "fedavg":
            return fedavg_train(msg, context, x, y, model_for(task), task.seed,
                                node_key(context))
        raise ValueError(f"this ClientApp has no handler for method family {family!r}")

    @app.evaluate()
    def evaluate_handler(msg: Message, context: Context) -> Message:
        """Evaluate the global model on this node's held-out rows."""
        torch.set_num_threads(max(1, int(context.node_config.get("num-threads", 1))))
        _, task = _task(msg)
        x, y = client_eval_data(context, task)
        return evaluate(msg, context, (x, y), model=model_for(task))

    return app


#: The ClientApp of ``pyproject.toml`` (``flwr run``) and of ``simulate`` with model names.
app = make_client_app()
