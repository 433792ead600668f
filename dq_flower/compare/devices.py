"""Compute profiles: how fast a device (or the server) runs the model, in FLOP/s.

A round's compute is its FLOPs (:mod:`dq_flower.compare.work`, :func:`model_flops`) over
the profile's sustained FLOP/s; ``measured`` keeps this machine's measured times. A device
that cannot train (a microcontroller) can still run DQ's client, which trains nothing.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ComputeProfile", "ModelFlops", "MEASURED", "BUILTIN_DEVICES", "BUILTIN_SERVERS",
           "parse_device", "parse_server", "model_flops"]


@dataclass(frozen=True)
class ComputeProfile:
    """A device class and its sustained throughput."""

    name: str  # measured, rpi4, ...
    flops: float  # sustained FLOP/s; 0 for measured (this machine's measured times)
    can_train: bool = True  # whether it can run a backward pass
    source: str = ""  # where the figure comes from

    def __post_init__(self) -> None:
        if not (self.flops >= 0 and self.flops < float("inf")):
            raise ValueError(f"profile {self.name}: flops must be >= 0, got {self.flops!r}")
        if self.flops == 0 and self.name != "measured":
            raise ValueError(f"profile {self.name}: only 'measured' has no FLOP/s figure")

    @property
    def measured(self) -> bool:
        """Whether this profile uses this machine's measured times."""
        return self.flops == 0

    def seconds(self, flop_count: float) -> float:
        """Seconds to run ``flop_count`` FLOPs at this profile's rate."""
        if self.measured:
            raise ValueError("the measured profile has no FLOP/s figure")
        return float(flop_count) / self.flops

    def describe(self) -> str:
        """``rpi4 (8 GFLOP/s)``; ``measured (this machine's measured times)``."""
        if self.measured:
            return f"{self.name} (this machine's measured times)"
        text = f"{self.name} ({_flops(self.flops)}"
        return text + (", cannot train)" if not self.can_train else ")")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the fields)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ComputeProfile:
        """Inverse of :meth:`to_json`."""
        return cls(str(data["name"]), float(data["flops"]), bool(data.get("can_train", True)),
                   str(data.get("source", "")))


#: Every device and the server as fast as this machine (each one's measured time).
MEASURED = ComputeProfile("measured", 0.0, True,
                          "the compute each client and the server measured on this machine")

#: Device (client) profiles.
BUILTIN_DEVICES: dict[str, ComputeProfile] = {p.name: p for p in (
    MEASURED,
    ComputeProfile(
        "mcu", 0.432e9, False,
        "Cortex-M7 microcontroller at 216 MHz (STM32F7 class), peak of its single-precision "
        "FPU at one fused multiply-add (2 FLOPs) per cycle (Arm Cortex-M7 Technical "
        "Reference Manual): an optimistic bound; no backward pass (kilobytes of RAM)"),
    ComputeProfile(
        "rpi4", 8e9, True,
        "Raspberry Pi 4 (4 Cortex-A72 cores, 1.5 GHz): about 8 GFLOP/s measured with HPL "
        "on Raspberry Pi OS 64-bit (Feiereisen, 'Benchmarking the Raspberry Pi 4 with "
        "Raspberry Pi OS64', 2022, https://feiereisen.net/?page_id=924)"),
    ComputeProfile(
        "phone", 15e9, True,
        "phone CPU: 15 GFLOP/s, the low end of the 15-30 GFLOP/s measured for training "
        "kernels on Snapdragon 8-series CPUs with MNN (Das, Kwon, Chauhan, Mascolo, "
        "'Enabling On-Device Smartphone GPU based Training: Lessons Learned', arXiv "
        "2202.10100, 2022)"),
    ComputeProfile(
        "laptop-core", 40e9, True,
        "one x86-64 core (AMD Zen 3, the core of Ryzen 5000 laptop CPUs): the wide CNN's "
        "training step measured on one core of this machine's EPYC (Zen 3) with "
        "benchmarks/train_flops.py, rounded"),
)}

#: Server profiles.
BUILTIN_SERVERS: dict[str, ComputeProfile] = {p.name: p for p in (
    MEASURED,
    ComputeProfile(
        "gpu", 19.5e12, True,
        "datacenter GPU: NVIDIA A100, 19.5 TFLOP/s FP32 peak (NVIDIA A100 Tensor Core GPU "
        "datasheet); a peak a small model does not reach: an optimistic bound"),
    BUILTIN_DEVICES["laptop-core"],
)}


def _parse(text: str, builtins: Mapping[str, ComputeProfile], what: str) -> ComputeProfile:
    name, sep, spec = text.strip().partition("=")
    name = name.strip()
    if not sep:
        if name in builtins:
            return builtins[name]
        raise ValueError(f"unknown {what} profile {name!r}; built-in: "
                         f"{', '.join(builtins)}, or name=GFLOPS, e.g. mydevice=2.5")
    try:
        gflops = float(spec)
    except ValueError:
        raise ValueError(f"{what} profile {text!r}: expected name=GFLOPS") from None
    if not gflops > 0:
        raise ValueError(f"{what} profile {text!r}: GFLOP/s must be positive")
    return ComputeProfile(name, gflops * 1e9, True, "given on the command line")


def parse_device(text: str) -> ComputeProfile:
    """A device profile from a built-in name or ``name=GFLOPS``."""
    return _parse(text, BUILTIN_DEVICES, "device")


def parse_server(text: str) -> ComputeProfile:
    """A server profile from a built-in name or ``name=GFLOPS``."""
    return _parse(text, BUILTIN_SERVERS, "server")


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per sample of a model: one forward pass, one training step (forward + backward).

    Matrix products and convolutions only (2 FLOPs per multiply-add), as PyTorch's
    ``FlopCounterMode`` counts them.
    """

    forward: float
    train: float

    def to_json(self) -> dict[str, float]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelFlops:
        """Inverse of :meth:`to_json`."""
        return cls(float(data["forward"]), float(data["train"]))


def model_flops(model: Any, input_shape: Sequence[int], batch: int = 8,
                tokens: bool = False) -> ModelFlops:
    """Count ``model``'s FLOPs per sample, forward and forward + backward, on a copy.

    The model takes flat rows or, failing that, ``(batch, *input_shape)``; the count over
    ``batch`` rows is divided by ``batch``. ``tokens``: the rows are token ids (int64).
    """
    # PyTorch: loaded only where a model is counted
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = copy.deepcopy(model).train()
    dtype = torch.int64 if tokens else torch.float32
    x = torch.zeros(batch, math.prod(int(s) for s in input_shape), dtype=dtype)
    try:
        with torch.no_grad():
            model(x)
    except RuntimeError:
        x = torch.zeros(batch, *[int(s) for s in input_shape], dtype=dtype)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        model(x).float().sum().backward()
    return ModelFlops(forward / batch, counter.get_total_flops() / batch)


def _flops(value: float) -> str:
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} FLOP/s"
