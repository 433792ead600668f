"""The folder of the package's own Flower app: what ``flwr run`` and ``dq-flower deploy`` run."""

from __future__ import annotations

from pathlib import Path

__all__ = ["app_folder", "default_app"]

_PACKAGE = Path(__file__).resolve().parents[1]


def app_folder() -> Path:
    """The folder whose ``pyproject.toml`` declares the package's own Flower app.

    From an installed wheel, ``dq_flower/app/`` (``setup.py`` writes the project's
    ``pyproject.toml`` there at build; the app's code is the installed package); in a
    checkout (an editable install), the repository root.
    """
    packaged = _PACKAGE / "app"
    if (packaged / "pyproject.toml").is_file():
        return packaged
    return _PACKAGE.parent


def default_app(cwd: Path | None = None) -> Path:
    """The app a ``dq-flower deploy`` command runs without ``--app``.

    The current folder where it has a ``pyproject.toml`` (a checkout's root, or a Flower app
    of your own), else the package's own app (:func:`app_folder`), so that an installed wheel
    runs it from any folder.
    """
    folder = Path(".") if cwd is None else cwd
    return folder if (folder / "pyproject.toml").is_file() else app_folder()
