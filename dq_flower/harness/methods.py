"""Registry of training methods: name -> family, config class and strategy builder.

A method family has one client handler (``dq_flower.harness.client_app``) and one strategy; the
methods of a family differ by configuration (the gradient codec, for instance). The table
itself is :mod:`dq_flower.harness.method_registry`; this module registers the built-in
methods' builders. Client devices without PyTorch import it: builders import their strategies.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from dq_flower.baselines.config import FedAvgConfig, GradientConfig
from dq_flower.compression.config import CompressionConfig
from dq_flower.config import (
    field_keys,
    from_mapping,
    known_key,
    to_config_record,
    unknown_knob,
)
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


def run_config_keys() -> set[str]:
    """Every key a run config of the package's apps may carry (any method's knob)."""
    known = field_keys(TaskConfig) | HARNESS_KEYS
    return known.union(*(get_method(name).knob_keys() for name in method_names()))


def validate_run_config(run_config: Mapping[str, Any],
                        nodes: int | None = None) -> tuple[TaskConfig, Any]:
    """Parse and check the whole run config before any work starts.

    Returns the task config and the method's config; raises ``ValueError`` naming the key,
    also where ``min-available`` asks for more replies than the run's ``nodes`` can send
    (the server would wait for them).
    """
    method = get_method(str(run_config.get("method", "dq")))
    known = run_config_keys()
    for key in run_config:
        if not known_key(key, known):
            raise unknown_knob(key, known, "the package's apps")
    merged = method.merged(run_config)
    task = from_mapping(TaskConfig, merged)
    knobs: Any = from_mapping(method.config_cls, merged)
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
    return from_mapping(method.client_config_cls, method.merged(run_config))


def client_task_config(task: TaskConfig, method: str) -> ConfigRecord:
    """The method name and the task keys (not at their defaults) the ClientApp needs."""
    record = to_config_record(task)
    return ConfigRecord({"method": method, **{k: record[k] for k in CLIENT_TASK_KEYS
                                              if k in record}})


@register_method("dq", family="dq", config_cls=DQConfig)
def build_dq(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
    """Data quantization: the public :class:`dq_flower.DQStrategy` on the harness's model."""
    from dq_flower.dq.server.strategy import DQStrategy  # PyTorch: see above

    # with dataset "none" the server learns the layout from the first data round's replies
    spec = None
    if task.dataset != "none":
        spec = DataSpec(info.input_shape, "class" if info.num_classes else "float",
                        info.target_dim)
    strategy = DQStrategy(model, seed=task.seed, fraction_train=task.fraction_train,
                          min_available_nodes=task.min_available,
                          fraction_evaluate=task.fraction_evaluate,
                          num_classes=info.num_classes or None, data_spec=spec,
                          config=from_mapping(DQConfig, run_config))
    return strategy, client_task_config(task, "dq")


#: DQ's selection and schedule replaced by one upload of every row, trained to a plateau:
#: at DQ's bits and coder, and at 8 bits (lossless for 8-bit images)
UPLOAD_ALL_METHODS: dict[str, dict[str, Any]] = {
    "upload-all": {"upload-schedule": "all"},
    "upload-all-8bit": {"upload-schedule": "all", "bits": 8},
}
for _name, _defaults in UPLOAD_ALL_METHODS.items():
    register_method(_name, family="dq", config_cls=DQConfig, defaults=_defaults)(build_dq)


@register_method("fedavg", family="fedavg", config_cls=FedAvgConfig)
def build_fedavg(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
    """Flower's own ``FedAvg`` (float32 weights, E local epochs), configured, not rewritten.

    ``min_train_nodes=1``: a larger minimum would wait for nodes that may never connect.
    FedAvg samples with Python's global ``random``, seeded here with the run seed.
    """
    knobs = from_mapping(FedAvgConfig, run_config)
    random.seed(task.seed)
    strategy = FedAvg(fraction_train=task.fraction_train,
                      fraction_evaluate=task.fraction_evaluate, min_train_nodes=1,
                      min_evaluate_nodes=1, min_available_nodes=task.min_available)
    config = client_task_config(task, "fedavg")
    config.update(to_config_record(knobs))
    return strategy, config


#: Gradient baselines: name -> knob defaults. The codec's parameters come from
#: ``dq_flower.baselines.config.CODEC_DEFAULTS``; ``signsgd``'s aggregation (majority
#: vote), downlink (1-bit vote) and error feedback (off) follow from its ``sign`` codec.
GRADIENT_METHODS: dict[str, dict[str, Any]] = {
    "sgd": {"codec": "identity"}, "fp16": {"codec": "fp16"}, "qsgd": {"codec": "qsgd"},
    "terngrad": {"codec": "terngrad"}, "signsgd": {"codec": "sign", "lr": 0.005},
    "ef-signsgd": {"codec": "ef-sign"}, "topk": {"codec": "topk"},
    "powersgd": {"codec": "powersgd"}, "bingrad": {"codec": "bingrad"}, "orq": {"codec": "orq"},
}


#: FedAvg with a compressed update, as a Flower user builds it: ``FedAvg`` in
#: :class:`dq_flower.CompressedUpdates`, each client's local epoch uploaded through
#: :func:`dq_flower.compression_mod` as the coded difference of its weights (``levels`` 1:
#: 2-bit QSGD, 7: 4-bit; ``fedavg-fp32``: FedAvg round for round, with the lossless
#: ``entropy-coder`` stage). Like ``FedAvg`` they take the plain example-weighted mean
#: (no clipping, weight cap or direction screen; the wrapper's norm screen stays).
FEDAVG_EPOCH = {"local-epochs": 1, "clip-factor": 0.0, "weight-cap": 0.0,
                "min-cosine": -1.0, "downlink": "float32"}
FEDAVG_COMPRESSED_METHODS: dict[str, dict[str, Any]] = {
    "fedavg-qsgd2": {"codec": "qsgd", "levels": 1, **FEDAVG_EPOCH},
    "fedavg-qsgd4": {"codec": "qsgd", "levels": 7, **FEDAVG_EPOCH},
    "fedavg-ef-sign": {"codec": "ef-sign", **FEDAVG_EPOCH},
    "fedavg-topk": {"codec": "topk", "ratio": 0.01, **FEDAVG_EPOCH},
    "fedavg-fp16": {"codec": "fp16", **FEDAVG_EPOCH, "downlink": "fp16"},
    "fedavg-fp32": {"codec": "identity", **FEDAVG_EPOCH},
}


def _register_gradient(name: str, defaults: Mapping[str, Any]) -> None:
    def build(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
        from dq_flower.baselines.strategy import GradientStrategy  # PyTorch: see above

        cfg = from_mapping(GradientConfig, run_config)
        strategy = GradientStrategy(model, seed=task.seed, fraction_train=task.fraction_train,
                                    min_available_nodes=task.min_available,
                                    fraction_evaluate=task.fraction_evaluate, config=cfg,
                                    method=name)
        return strategy, client_task_config(task, name)

    build.__doc__ = f"Distributed SGD with {defaults['codec']!r} uploads (method {name!r})."
    register_method(name, family="gradient", config_cls=GradientConfig,
                    defaults=defaults)(build)


def _register_compressed(name: str, defaults: Mapping[str, Any]) -> None:
    def build(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
        from dq_flower.compression.strategy import CompressedUpdates  # PyTorch: see above

        inner, config = build_fedavg(task, run_config, model, info)
        config["method"] = name
        strategy = CompressedUpdates(inner, config=from_mapping(CompressionConfig, run_config))
        return strategy, config

    build.__doc__ = (f"Flower's FedAvg with {defaults['codec']!r}-coded updates "
                     f"(method {name!r}).")
    register_method(name, family="compressed", config_cls=CompressionConfig,
                    defaults=defaults, client_config_cls=FedAvgConfig)(build)


for _name, _defaults in GRADIENT_METHODS.items():
    _register_gradient(_name, _defaults)
for _name, _defaults in FEDAVG_COMPRESSED_METHODS.items():
    _register_compressed(_name, _defaults)
