"""Models that take flat inputs ``(batch, d)`` and reshape to the sample shape inside.

Names (`MODEL_NAMES`): ``logreg`` (one linear layer, the convex case), ``mlp``,
``cnn`` (small, no BatchNorm), ``wide-cnn`` (about 0.86M parameters on 1x28x28, no
BatchNorm), ``cnn1d`` (three 1-D convolutions over sensor windows ``(channels, time)``,
about 32k parameters on 6x128, no BatchNorm), ``resnet20`` (CIFAR ResNet-20, option-A
shortcuts, BatchNorm), ``resnet18`` (torchvision's ResNet-18 with the CIFAR stem,
BatchNorm) and ``char-transformer`` (a tiny causal transformer over token windows
``(length,)``, ``num_classes`` its vocabulary: `dq_flower.harness.tasks.char_lm`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from dq_flower.harness.tasks.char_lm import char_transformer

__all__ = ["MODEL_NAMES", "FlatInput", "LogitsOnly", "make_model"]


class FlatInput(nn.Module):
    """Reshape flat rows ``(batch, d)`` to ``(batch, *shape)`` before the network ``body``."""

    def __init__(self, shape: Sequence[int], body: nn.Module) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape and run the body."""
        return self.body(x.reshape(x.shape[0], *self.shape))


class LogitsOnly(nn.Module):
    """A ``transformers`` causal language model called on token windows, returning logits.

    ``model(ids)`` gives ``(batch, length, vocab)`` logits, as the package's own
    ``CharTransformer`` does: what DQ's server, the held-out scoring and the LoRA devices
    call (a ``transformers`` model returns an output object instead).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The next-token logits at every position of ``ids`` ``(batch, length)``."""
        return self.model(input_ids=ids, use_cache=False).logits


def _image_shape(input_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3:
        raise ValueError(f"{model} needs image inputs (C, H, W) or (H, W), got {shape}")
    return shape


def _logreg(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def _mlp(input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (128,)
         ) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _two_conv(input_shape: Sequence[int], num_classes: int, c1: int, c2: int, fc: int | None,
              model: str) -> nn.Module:
    c, h, w = _image_shape(input_shape, model)
    if h < 4 or w < 4:
        raise ValueError(f"{model} needs images of at least 4x4, got {h}x{w}")
    feat = c2 * (h // 4) * (w // 4)
    layers: list[nn.Module] = [
        nn.Conv2d(c, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    ]
    if fc is None:
        layers.append(nn.Linear(feat, num_classes))
    else:
        layers += [nn.Linear(feat, fc), nn.ReLU(), nn.Linear(fc, num_classes)]
    return FlatInput((c, h, w), nn.Sequential(*layers))


def _cnn(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    # conv5x5(16) - pool - conv5x5(32) - pool - linear: 28,938 parameters on 1x28x28.
    return _two_conv(input_shape, num_classes, 16, 32, None, "cnn")


def _wide_cnn(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    # conv5x5(32) - pool - conv5x5(64) - pool - fc 256 - linear: 857,738 on 1x28x28.
    return _two_conv(input_shape, num_classes, 32, 64, 256, "wide-cnn")


def _cnn1d(input_shape: Sequence[int], num_classes: int, width: int = 32) -> nn.Module:
    # conv5(32) - pool - conv5(64) - pool - conv5(64) - global average - linear over time:
    # 32,230 parameters on 6x128 (HAPT's windows)
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 2 or shape[1] < 4:
        raise ValueError(f"cnn1d needs sensor windows (channels, time) of at least 4 time "
                         f"steps, got {shape}")
    c, w2 = shape[0], 2 * width
    return FlatInput(shape, nn.Sequential(
        nn.Conv1d(c, width, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(width, w2, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(w2, w2, 5, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(w2, num_classes)))


class _BasicBlockA(nn.Module):
    """CIFAR ResNet basic block with the parameter-free option-A shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride = stride
        self.pad = cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Two 3x3 convolutions plus the (subsampled, zero-padded) identity."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = x
        if self.stride != 1 or self.pad:
            short = x[:, :, :: self.stride, :: self.stride]
            short = F.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + short)


class ResNetCifar(nn.Module):
    """ResNet-(6n+2) for small images (He et al. 2016, section 4.2, option A); n=3: ResNet-20."""

    def __init__(self, in_channels: int, num_classes: int, n: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        # block k of stage k // n: the first of stages 2 and 3 halves the size, doubles the width
        width = [16, *(cout for cout in (16, 32, 64) for _ in range(n))]
        self.layers = nn.Sequential(*(_BasicBlockA(width[k], width[k + 1],
                                                   2 if k >= n and k % n == 0 else 1)
                                      for k in range(3 * n)))
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stem, three stages, global average pool, linear."""
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def _resnet20(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    c, h, w = _image_shape(input_shape, "resnet20")
    return FlatInput((c, h, w), ResNetCifar(c, num_classes, n=3))


def _resnet18(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    # optional (torchvision): loaded when the model is built
    from torchvision.models import resnet18

    c, h, w = _image_shape(input_shape, "resnet18")
    net = resnet18(weights=None, num_classes=num_classes)
    # CIFAR stem: 3x3 stride-1 first convolution and no max-pool, for 32x32 inputs.
    net.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    net.maxpool = nn.Identity()
    return FlatInput((c, h, w), net)


#: Builders ``f(input_shape, num_classes, **kwargs) -> nn.Module``, by model name.
_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "logreg": _logreg, "mlp": _mlp, "cnn": _cnn, "wide-cnn": _wide_cnn, "cnn1d": _cnn1d,
    "resnet20": _resnet20, "resnet18": _resnet18, "char-transformer": char_transformer}
MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def make_model(name: str, input_shape: Sequence[int], num_classes: int, seed: int = 0,
               **kwargs: Any) -> nn.Module:
    """Build a model (CPU, training mode) that takes flat float32 rows.

    Parameters
    ----------
    name : str
        One of `MODEL_NAMES`.
    input_shape : tuple of int
        Shape of one sample, e.g. ``(1, 28, 28)``, or ``(6, 128)`` for ``cnn1d``; ``(d,)``
        only for ``logreg`` and ``mlp``.
    num_classes : int
        Number of output logits.
    seed : int
        Initialisation seed; the global torch RNG is left untouched.
    **kwargs
        Builder options, e.g. ``hidden=(256, 128)`` for ``mlp``.

    Raises
    ------
    ValueError
        Unknown name, or an input shape the model cannot take.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"bad input_shape {input_shape}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _REGISTRY[name](shape, int(num_classes), **kwargs)
    return model
