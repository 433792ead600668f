"""``simulate()``: run one method in Flower's simulation engine (Ray backend)."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dq_flower.config import field_keys, refuse_unknown
from dq_flower.extras import explain_missing
from dq_flower.harness.client_app import make_client_app
from dq_flower.harness.history import RunResult
from dq_flower.harness.methods import get_method, validate_run_config
from dq_flower.harness.ray_backend import ray_backend_config
from dq_flower.harness.runtime import model_factory, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import from_arrays, save_npz

__all__ = ["simulate", "build_run_config"]


def build_run_config(method: str = "dq", dataset: Any = "digits", model: Any = "mlp",
                     num_clients: int = 4, rounds: int = 5, seed: int = 0, **knobs: Any
                     ) -> dict[str, Any]:
    """The hyphenated run config ``simulate`` would use, every knob checked.

    Numpy arrays as ``dataset`` are written to a temporary ``.npz`` (``npz:<path>``). An
    unknown knob or a bad value raises ``ValueError`` naming the key.
    """
    spec = get_method(method)
    if not isinstance(model, str):
        model = "custom"  # the model itself travels as a factory (see simulate)
    if not isinstance(dataset, str):
        if not (isinstance(dataset, Sequence) and len(dataset) in (2, 4)):
            raise ValueError("dataset must be a name or a tuple (X, y) or (X, y, X_test, y_test)")
        arrays = [np.asarray(a) for a in dataset]
        x_test, y_test = (arrays[2], arrays[3]) if len(arrays) == 4 else (None, None)
        ds = from_arrays(arrays[0], arrays[1], x_test, y_test, seed=seed)
        npz = os.path.join(tempfile.mkdtemp(prefix="dq-flower-"), "dataset.npz")
        dataset = "npz:" + str(save_npz(ds, npz))
    allowed = field_keys(TaskConfig) | spec.knob_keys()
    run_config: dict[str, Any] = {
        "method": method, "dataset": dataset, "model": model,
        "num-partitions": int(num_clients), "num-server-rounds": int(rounds), "seed": int(seed),
    }
    refuse_unknown([name.replace("_", "-") for name in knobs], allowed, f"for method {method!r}")
    for name, value in knobs.items():
        key = name.replace("_", "-")
        if isinstance(value, Mapping):  # a table of codec parameters, as Flower flattens one
            run_config.update((f"{key}.{param}", v) for param, v in value.items())
        else:
            run_config[key] = value
    validate_run_config(run_config, nodes=int(num_clients))
    return run_config


@explain_missing("dq_flower.simulate")  # a client-only install: name the extra
def simulate(method: str = "dq", dataset: Any = "digits", model: Any = "mlp", num_clients: int = 4,
             rounds: int = 5, seed: int = 0, num_cpus_per_client: float = 1.0,
             num_gpus_per_client: float = 0.0, verbose: bool = False,
             on_round: Callable[[dict[str, Any]], None] | None = None,
             ray_address: str | None = None, **knobs: Any) -> RunResult:
    """Run ``method`` in Flower's simulation engine and return its measured history.

    Parameters
    ----------
    method : str
        ``dq`` or a baseline name (see :func:`dq_flower.harness.methods.method_names`).
    dataset : str or tuple
        A data-set name (``digits``, ``fmnist``, ``cifar10``, ``hapt``, ``npz:<path>``) or numpy
        arrays ``(X, y)`` / ``(X, y, X_test, y_test)``.
    model : str, nn.Module or callable
        A model name (``logreg``, ``mlp``, ``cnn``, ``wide-cnn``, ``cnn1d``, ``resnet20``,
        ``resnet18``), an ``nn.Module`` (copied for the server and each client), or a class
        or factory returning one. Ray pickles it to its workers, so it must be importable
        there: a class or function defined at module level, not inside a function.
    num_clients : int
        Simulated SuperNodes, one partition each.
    rounds : int
        Server rounds.
    seed : int
        Root of every random choice.
    on_round : callable, optional
        Called with each round's row as it completes (see
        :func:`dq_flower.harness.server_app.run_server`).
    num_cpus_per_client, num_gpus_per_client : float
        Ray resources of each simulated client. With ``num_gpus_per_client=0`` (default)
        Ray hides GPUs from the clients, which then train on the CPU; the server uses a GPU
        whenever one is visible (``device="auto"``).
    ray_address : str, optional
        Join this existing Ray cluster (``HOST:PORT`` of a head started with ``ray start
        --head``, ``auto`` or ``ray://HOST:PORT``) instead of starting Ray here; its nodes
        host the simulated clients, this process runs the server. ``None`` (default): the
        ``RAY_ADDRESS`` environment variable if set, else a Ray on this machine with every
        core. Every node must import ``dq_flower`` (and a custom model's module).
    **knobs
        Any task or method knob, in underscore form (``server_steps=10``).

    Returns
    -------
    RunResult
        ``history`` has one row per round with ``round``, ``accuracy``, ``loss``,
        ``up_bytes``, ``down_bytes``, ``cum_up_bytes``, ``cum_down_bytes``, ``wall_s``.

    Raises
    ------
    ValueError
        A bad knob, an unknown model name, a missing data file, a model that does not
        take the data's samples or a malformed ``ray_address``: all checked before the
        engine starts.
    ClientFailureError
        Every sampled client failed ``max_failed_rounds`` (default 3) rounds in a row; the
        message quotes the first client error.
    """
    # Ray and the server side (PyTorch) load only here: client devices import this module
    from flwr.simulation import run_simulation
    backend_config = ray_backend_config(num_cpus_per_client, num_gpus_per_client, ray_address)
    server_app, client_app, holder = _apps(method, dataset, model, num_clients, rounds, seed,
                                           knobs, on_round)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=int(num_clients), verbose_logging=verbose,
                       backend_config=backend_config)
    if "error" in holder:
        raise holder["error"]
    if "result" not in holder:
        raise RuntimeError("the simulation ended without a result; see the log above")
    return holder["result"]


def _apps(method: str, dataset: Any, model: Any, num_clients: int, rounds: int, seed: int,
          knobs: dict[str, Any], on_round: Callable[[dict[str, Any]], None] | None
          ) -> tuple[Any, Any, dict[str, Any]]:
    """The server and client apps of a run checked before the engine starts, and a holder.

    The server app stores ``run_server``'s result in the holder under ``"result"``, or what
    it raised under ``"error"``.
    """
    # Flower's server side: loaded when a simulation runs
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    # the server side (PyTorch): likewise
    from dq_flower.harness.server_app import prepare_model, run_server
    from dq_flower.server.common import wait_for_nodes

    run_config = build_run_config(method, dataset, model, num_clients, rounds, seed, **knobs)
    factory = model_factory(model)
    task, _ = validate_run_config(run_config)
    prepare_model(task, task_info(task), factory)  # fails here, before the engine starts
    client_app = make_client_app(factory)
    holder: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            # the engine registers its nodes while this thread already runs: sample from all
            wait_for_nodes(grid, int(num_clients))
            holder["result"] = run_server(grid, run_config, on_round=on_round,
                                          model_factory=factory)
        except BaseException as exc:
            holder["error"] = exc
            raise

    return server_app, client_app, holder
