"""The Ray backend config of Flower's simulation engine: a local Ray, or an existing cluster.

Ray refuses ``num_cpus`` when it joins a cluster (its nodes declare their own).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["RAY_ADDRESS_ENV", "check_ray_address", "ray_backend_config"]

#: Ray's own variable: ``ray.init()`` joins the cluster it names.
RAY_ADDRESS_ENV = "RAY_ADDRESS"


def check_ray_address(address: str) -> str:
    """``address`` if ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``, else ``ValueError``."""
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

    ``address`` (default: ``$RAY_ADDRESS``) joins an existing cluster; without one, Ray
    starts here with every core. A malformed address raises ``ValueError``.
    """
    if address is None:
        address = os.environ.get(RAY_ADDRESS_ENV) or None
    init_args: dict[str, Any] = {"include_dashboard": False}
    if address is None:
        init_args["num_cpus"] = max(1, os.cpu_count() or 1)
    else:
        init_args["address"] = check_ray_address(address)
    return {"client_resources": {"num_cpus": float(num_cpus_per_client),
                                 "num_gpus": float(num_gpus_per_client)},
            "init_args": init_args}
