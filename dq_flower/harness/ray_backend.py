"""The Ray backend config of Flower's simulation engine: a local Ray, or an existing cluster.

Flower's Ray backend passes ``backend_config["init_args"]`` to ``ray.init``. Without an
address it starts a Ray of its own on this machine with every core; with one
(``HOST:PORT`` of a head started by ``ray start --head``, ``auto``, or ``ray://HOST:PORT``)
it joins that cluster, whose nodes host the simulated clients. Ray refuses ``num_cpus``
when it joins a cluster (the cluster's nodes declare their own), so none is passed then.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["RAY_ADDRESS_ENV", "check_ray_address", "ray_backend_config"]

#: Ray's own variable: ``ray.init()`` joins the cluster it names.
RAY_ADDRESS_ENV = "RAY_ADDRESS"


def check_ray_address(address: str) -> str:
    """``address`` when it names a Ray cluster, else ``ValueError`` naming ``ray-address``.

    Accepted: ``auto`` (the cluster started on this machine), ``HOST:PORT`` (the head's GCS
    port, 6379 by default) and ``ray://HOST:PORT`` (Ray Client).
    """
    text = address.strip()
    if text == "auto":
        return text
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray-address: expected HOST:PORT, ray://HOST:PORT or auto, "
                         f"got {address!r}")
    return text


def ray_backend_config(num_cpus_per_client: float, num_gpus_per_client: float,
                       address: str | None = None) -> dict[str, dict[str, Any]]:
    """The ``backend_config`` of ``run_simulation``: client resources and ``ray.init`` args.

    ``address`` (when ``None``: the ``RAY_ADDRESS`` environment variable, if set) joins an
    existing cluster; with neither, Ray starts on this machine with every core. A malformed
    address raises ``ValueError`` naming ``ray-address``.
    """
    if address is None:
        address = os.environ.get(RAY_ADDRESS_ENV) or None
    init_args: dict[str, Any] = {"include_dashboard": False}
    if address is None:
        init_args["num_cpus"] = max(1, os.cpu_count() or 1)
    else:
        init_args["address"] = check_ray_address(address)
    return {
        "client_resources": {"num_cpus": float(num_cpus_per_client),
                             "num_gpus": float(num_gpus_per_client)},
        "init_args": init_args,
    }
