"""dq_flower: data quantization for communication-efficient training in Flower.

Uploads quantized data samples (plus optional compensation bits chosen by an importance
filter) instead of weights or gradients, and ships byte-exact baselines to compare with.
DQ sends quantized raw samples to the server: use it on trusted networks only.
"""

from .history import RunResult
from .simulate import simulate

__all__ = ["simulate", "RunResult"]
__version__ = "0.1.0"
