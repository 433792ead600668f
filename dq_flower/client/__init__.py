"""Client functions to call from a Flower app's own ``@app.train()`` handler.

- :func:`dq_train` answers a :class:`dq_flower.DQStrategy` round with quantized samples;
- :func:`gradient_train` answers a :class:`dq_flower.GradientStrategy` round with a coded
  gradient;
- :func:`evaluate` answers a federated-evaluation message (either strategy, or Flower's
  ``FedAvg``) with the loss and accuracy on the device's held-out data.
"""

from dq_flower.baselines.client import gradient_train
from dq_flower.client.evaluate import evaluate
from dq_flower.dq.client import dq_train

__all__ = ["dq_train", "gradient_train", "evaluate"]
