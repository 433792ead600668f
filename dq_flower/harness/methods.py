"""Registry of training methods: name -> family, config class and strategy builder.

A method family has one client handler (``dq_flower.harness.client_app``) and one strategy; the
methods of a family differ by configuration (the gradient codec, for instance). The table
itself is :mod:`dq_flower.harness.method_registry`; this module registers the built-in
methods' builders. Client devices without PyTorch import it: builders import their strategies.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from dq_flower.baselines.config import FedAvgConfig, GradientConfig
from dq_flower.compression.config import CompressionConfig
from dq_flower.config import field_keys, inherit, preset, read, refuse_unknown, write
from dq_flower.dq.config import DQConfig
from dq_flower.harness.method_registry import METHODS, Method, register_method
from dq_flower.harness.runtime import TaskInfo
from dq_flower.harness.task_config import CLIENT_TASK_KEYS, TaskConfig
from dq_flower.wire.dq_batch import DataSpec

__all__ = ["Method", "register_method", "get_method", "method_names",
           "validate_run_config", "client_config"]


def get_method(name: str) -> Method:
    """The method registered as ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(method_names())}") from None


def method_names() -> list[str]:
    """Names of all registered methods, in registration order."""
    return list(METHODS)


#: Run-config keys of the package's own apps beside the knobs: the method, where the
#: ServerApp writes its results.
HARNESS_KEYS = frozenset({"method", "results-path"})


def run_config_keys() -> frozenset[str]:
    """Every key a run config of the package's apps may carry (any method's knob)."""
    return _run_config_keys(tuple(METHODS))


@functools.cache
def _run_config_keys(names: tuple[str, ...]) -> frozenset[str]:
    known = field_keys(TaskConfig) | HARNESS_KEYS
    return frozenset(known.union(*(get_method(name).knob_keys() for name in names)))


def validate_run_config(run_config: Mapping[str, Any],
                        nodes: int | None = None) -> tuple[TaskConfig, Any]:
    """Parse and check the whole run config before any work starts.

    Returns the task config and the method's config; raises ``ValueError`` naming the key,
    also where ``min-available`` asks for more replies than the run's ``nodes`` can send
    (the server would wait for them).
    """
    method = get_method(str(run_config.get("method", "dq")))
    refuse_unknown(run_config, run_config_keys(), "for the package's apps")
    task = read(TaskConfig, run_config)
    knobs: Any = read(method.config_cls, run_config)
    client_config(run_config)
    if nodes is not None and task.min_available > nodes:
        raise ValueError(f"min-available: {task.min_available} replies a round cannot come "
                         f"from {nodes} nodes")
    return task, knobs


def client_config(run_config: Mapping[str, Any]) -> Any | None:
    """The method's client-only config (:attr:`Method.client_config_cls`), or ``None``.

    Raises ``ValueError`` naming the key of a bad value.
    """
    method = get_method(str(run_config.get("method", "dq")))
    if method.client_config_cls is None:
        return None
    return read(method.client_config_cls, run_config)


def client_task_config(task: TaskConfig, method: str) -> ConfigRecord:
    """The method name and the task keys (not at their defaults) the ClientApp needs."""
    return ConfigRecord({"method": method,
                         **write(task, changed_only=True, keys=CLIENT_TASK_KEYS)})


def _preset(base: type, method: str, defaults: Mapping[str, Any]) -> type:
    """Method ``method``'s config class: ``base`` with its ``defaults`` (``QsgdConfig``).

    A class of this module, so that its configs pickle.
    """
    name = "".join(part.title() for part in method.split("-")) + "Config"
    cls = preset(base, name, f"The knobs of method {method!r}: {base.__name__} with "
                 f"{dict(defaults)}.", **defaults)
    cls.__module__ = __name__
    globals()[name] = cls
    return cls


def _register_dq(name: str, config_cls: type) -> None:
    def build(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
        from dq_flower.dq.server.strategy import DQStrategy  # PyTorch: see above

        # with dataset "none" the server learns the layout from the first data round's
        # replies
        spec = None
        if task.dataset != "none":
            spec = DataSpec(info.input_shape, "class" if info.num_classes else "float",
                            info.target_dim)
        strategy = DQStrategy(model, seed=task.seed, fraction_train=task.fraction_train,
                              min_available_nodes=task.min_available,
                              fraction_evaluate=task.fraction_evaluate,
                              num_classes=info.num_classes or None, data_spec=spec,
                              config=read(config_cls, run_config))
        return strategy, client_task_config(task, "dq")

    build.__doc__ = (f"Data quantization (method {name!r}): the public "
                     ":class:`dq_flower.DQStrategy` on the harness's model.")
    register_method(name, family="dq", config_cls=config_cls)(build)


#: DQ's selection and schedule replaced by one upload of every row, trained to a plateau:
#: at DQ's bits and coder, and at 8 bits (lossless for 8-bit images)
UPLOAD_ALL_METHODS: dict[str, dict[str, Any]] = {
    "upload-all": {"upload_schedule": "all"},
    "upload-all-8bit": {"upload_schedule": "all", "bits": 8},
}
_register_dq("dq", DQConfig)
for _name, _defaults in UPLOAD_ALL_METHODS.items():
    _register_dq(_name, _preset(DQConfig, _name, _defaults))


@register_method("fedavg", family="fedavg", config_cls=FedAvgConfig)
def build_fedavg(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
    """Flower's own ``FedAvg`` (float32 weights, E local epochs), configured, not rewritten.

    ``min_train_nodes=1``: a larger minimum would wait for nodes that may never connect.
    FedAvg samples with Python's global ``random``, seeded here with the run seed.
    """
    knobs = read(FedAvgConfig, run_config)
    random.seed(task.seed)
    strategy = FedAvg(fraction_train=task.fraction_train,
                      fraction_evaluate=task.fraction_evaluate, min_train_nodes=1,
                      min_evaluate_nodes=1, min_available_nodes=task.min_available)
    config = client_task_config(task, "fedavg")
    config.update(write(knobs, changed_only=True))
    return strategy, config


#: Gradient baselines: name -> knob defaults. The codec's parameters come from
#: ``dq_flower.codec_choice.CODEC_DEFAULTS``; ``signsgd``'s aggregation (majority
#: vote), downlink (1-bit vote) and error feedback (off) follow from its ``sign`` codec.
GRADIENT_METHODS: dict[str, dict[str, Any]] = {
    "sgd": {"codec": "identity"}, "fp16": {"codec": "fp16"}, "qsgd": {"codec": "qsgd"},
    "terngrad": {"codec": "terngrad"}, "signsgd": {"codec": "sign", "lr": 0.005},
    "ef-signsgd": {"codec": "ef-sign"}, "topk": {"codec": "topk"},
    "powersgd": {"codec": "powersgd"}, "bingrad": {"codec": "bingrad"}, "orq": {"codec": "orq"},
}


@dataclass(frozen=True)
class FedAvgCompressionConfig(CompressionConfig):
    """The ``fedavg-*`` methods: ``CompressedUpdates`` around FedAvg, as a Flower user builds it.

    Like ``FedAvg`` they take the plain example-weighted mean: no clipping, weight cap or
    direction screen (the wrapper's norm screen stays). The "not set" spellings the other
    methods' configs use for these keys (``clip-factor = 1.0``, ``weight-cap = 2.0``,
    ``min-cosine = -0.1``, ``downlink = "auto"``) keep these defaults, so one run config
    serves every method.
    """

    clip_factor: float = inherit(CompressionConfig, "clip_factor", default=0.0, unset=1.0)
    weight_cap: float = inherit(CompressionConfig, "weight_cap", default=0.0, unset=2.0)
    min_cosine: float = inherit(CompressionConfig, "min_cosine", default=-1.0, unset=-0.1)
    downlink: str = inherit(CompressionConfig, "downlink", unset="auto")
    preset_of = CompressionConfig  # the clients read a CompressionConfig


#: FedAvg with a compressed update, as a Flower user builds it: ``FedAvg`` in
#: :class:`dq_flower.CompressedUpdates`, each client's local epoch (``local-epochs`` 1)
#: uploaded through :func:`dq_flower.compression_mod` as the coded difference of its
#: weights (``levels`` 1: 2-bit QSGD, 7: 4-bit; ``fedavg-fp32``: FedAvg round for round,
#: with the lossless ``entropy-coder`` stage).
FEDAVG_COMPRESSED_METHODS: dict[str, dict[str, Any]] = {
    "fedavg-qsgd2": {"codec": "qsgd", "levels": 1},
    "fedavg-qsgd4": {"codec": "qsgd", "levels": 7},
    "fedavg-ef-sign": {"codec": "ef-sign"},
    "fedavg-topk": {"codec": "topk", "ratio": 0.01},
    "fedavg-fp16": {"codec": "fp16", "downlink": "fp16"},
    "fedavg-fp32": {"codec": "identity"},
}


def _register_gradient(name: str, defaults: Mapping[str, Any]) -> None:
    config_cls = _preset(GradientConfig, name, defaults)

    def build(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
        from dq_flower.baselines.strategy import GradientStrategy  # PyTorch: see above

        cfg = read(config_cls, run_config)
        strategy = GradientStrategy(model, seed=task.seed, fraction_train=task.fraction_train,
                                    min_available_nodes=task.min_available,
                                    fraction_evaluate=task.fraction_evaluate, config=cfg,
                                    method=name)
        return strategy, client_task_config(task, name)

    build.__doc__ = f"Distributed SGD with {defaults['codec']!r} uploads (method {name!r})."
    register_method(name, family="gradient", config_cls=config_cls)(build)


def _register_compressed(name: str, defaults: Mapping[str, Any]) -> None:
    config_cls = _preset(FedAvgCompressionConfig, name, defaults)

    def build(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
        from dq_flower.compression.strategy import CompressedUpdates  # PyTorch: see above

        inner, config = build_fedavg(task, run_config, model, info)
        config["method"] = name
        return CompressedUpdates(inner, config=read(config_cls, run_config)), config

    build.__doc__ = (f"Flower's FedAvg with {defaults['codec']!r}-coded updates "
                     f"(method {name!r}).")
    register_method(name, family="compressed", config_cls=config_cls,
                    client_config_cls=FedAvgConfig)(build)


for _name, _defaults in GRADIENT_METHODS.items():
    _register_gradient(_name, _defaults)
for _name, _defaults in FEDAVG_COMPRESSED_METHODS.items():
    _register_compressed(_name, _defaults)
