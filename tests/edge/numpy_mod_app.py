"""A user's ClientApp without PyTorch: a numpy "model" trained by its own ``train()``,
its update coded by :func:`dq_flower.compression_mod`.

Its training moves every weight a tenth of the way to ``TARGET``, so what the server
aggregates is known in advance.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import dq_flower

TARGET = 1.0
app = ClientApp(mods=[dq_flower.compression_mod])


@app.train()
def train(msg: Message, context) -> Message:
    trained = {name: Array((a + np.float32(0.1) * (np.float32(TARGET) - a)).astype(np.float32))
               for name, a in ((k, v.numpy()) for k, v in msg.content["arrays"].items())}
    return Message(RecordDict({"arrays": ArrayRecord(trained),
                               "metrics": MetricRecord({"num-examples": 10})}),
                   reply_to=msg)
