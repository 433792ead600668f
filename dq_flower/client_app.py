"""The package's ``ClientApp``: one train handler per method family, chosen by the config."""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from .methods import get_method

__all__ = ["app", "HANDLERS"]


def _dq(msg: Message, context: Context) -> Message:
    from .clients.dq import train

    return train(msg, context)


def _gradient(msg: Message, context: Context) -> Message:
    from .clients.gradient import train

    return train(msg, context)


def _fedavg(msg: Message, context: Context) -> Message:
    from .clients.fedavg import train

    return train(msg, context)


#: Client handler of each method family.
HANDLERS = {"dq": _dq, "gradient": _gradient, "fedavg": _fedavg}

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Route a train message to its method family's handler."""
    torch.set_num_threads(max(1, int(context.node_config.get("num-threads", 1))))
    method = str(msg.content["config"]["method"])
    family = get_method(method).family
    if family not in HANDLERS:
        raise ValueError(f"this ClientApp has no handler for method family {family!r}")
    return HANDLERS[family](msg, context)
