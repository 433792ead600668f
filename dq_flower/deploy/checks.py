"""What a ``dq-flower deploy`` command checks before it starts anything: the app's run config.

Flower refuses a ``--run-config`` key that the app does not declare in its
``[tool.flwr.app.config]``, but only once the SuperLink is up and with a bare ``Invalid run
configuration``; the package's own app also checks every value only once its ServerApp
runs. Both are checked here first, each error naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dq_flower.config import closest

__all__ = ["FlowerApp", "read_app", "check_run_config", "declared_only", "run_errors",
           "PACKAGE_SERVERAPP"]

#: The ``serverapp`` component of the package's own app (the project's pyproject.toml).
PACKAGE_SERVERAPP = "dq_flower.harness.server_app:app"


@dataclass(frozen=True)
class FlowerApp:
    """A Flower app folder: its run config as Flower flattens it, and its ServerApp."""

    path: Path
    config: dict[str, Any]
    serverapp: str

    @property
    def is_package_app(self) -> bool:
        """Whether this is the package's own app, whose run config is every method's knobs."""
        return self.serverapp == PACKAGE_SERVERAPP


def read_app(path: str | Path) -> FlowerApp:
    """The Flower app in folder ``path``; ``ValueError`` where it is not one."""
    # Flower's config readers: only where an app folder is read (the CLI starts fast)
    from flwr.common.config import flatten_dict, get_project_config

    folder = Path(path)
    if not (folder / "pyproject.toml").is_file():
        raise ValueError(f"{folder} has no pyproject.toml; run from the dq_flower project "
                         "folder or pass --app DIR (a Flower app's folder)")
    try:
        project = get_project_config(folder)
    except ValueError as exc:  # Flower's own check of [tool.flwr.app]
        raise ValueError(f"{folder} is not a Flower app: {exc}") from None
    app = project["tool"]["flwr"]["app"]
    return FlowerApp(folder, flatten_dict(app.get("config", {})),
                     str(app.get("components", {}).get("serverapp", "")))


def declared_only(app: FlowerApp, values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` whose keys the app declares (what Flower lets through)."""
    return {key: value for key, value in values.items() if key in app.config}


def check_run_config(app: FlowerApp, overrides: Mapping[str, Any], *,
                     nodes: int | None = None) -> None:
    """Refuse what the run would fail on, before anything starts; ``ValueError`` names it.

    Every key of ``overrides`` must be declared by the app (Flower's rule); for the
    package's own app every value is checked as its ServerApp checks it, and
    ``min-available`` against the ``nodes`` of a local deployment.
    """
    for key in overrides:
        if key not in app.config:
            near = closest(key, app.config, what="declared key")
            raise ValueError(f"run config key {key!r} is not declared in "
                             f"{app.path / 'pyproject.toml'} [tool.flwr.app.config] ({near}); "
                             "Flower accepts only the keys an app declares")
    if not app.is_package_app:
        return
    # the harness (PyTorch): only for the package's own app
    from dq_flower.harness.methods import validate_run_config

    validate_run_config({**app.config, **overrides}, nodes=nodes)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR_LINE = re.compile(r"\bERROR\b|^Traceback|^\S*(Error|Exception)\b|^\s+raise\b")


def run_errors(log_lines: Iterable[str], limit: int = 20) -> list[str]:
    """The last ``limit`` error lines of a SuperLink's log (colours removed)."""
    found = [text for text in (_ANSI.sub("", line).rstrip() for line in log_lines)
             if text and _ERROR_LINE.search(text)]
    return found[-limit:]
