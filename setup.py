"""Build hook: the wheel carries the package's own Flower app (``dq_flower/app/``).

Everything else is in ``pyproject.toml``. ``flwr run`` and ``dq-flower deploy`` need a folder
whose ``pyproject.toml`` declares the app (``[tool.flwr.app]``: its components and the run
config's keys and defaults). In a checkout that folder is the repository root; an installed
wheel has no root, so the build writes the root ``pyproject.toml`` into the wheel as
``dq_flower/app/pyproject.toml``: one source, no second copy in the repository. The FAB made
from that folder holds only the file (its ``fab-include`` patterns name the checkout's
sources, so the copy leaves them out); the app's code is the installed package.
"""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

APP_PYPROJECT = ("dq_flower", "app", "pyproject.toml")


class BuildPyWithApp(build_py):
    """``build_py`` that also writes ``dq_flower/app/pyproject.toml`` (not in editable mode)."""

    def run(self) -> None:
        """Build the package, then write the app's ``pyproject.toml`` beside it."""
        super().run()
        if getattr(self, "editable_mode", False):  # a checkout: the root is the app folder
            return
        text = Path("pyproject.toml").read_text(encoding="utf-8")
        text, found = re.subn(r"(?m)^fab-include = .*$",
                              "# fab-include: none (the app's code is the installed package)",
                              text)
        if found != 1:
            raise RuntimeError("pyproject.toml: expected one fab-include line in [tool.flwr.app]")
        target = Path(self.build_lib, *APP_PYPROJECT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """The built files, the app's ``pyproject.toml`` included."""
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(str(Path(self.build_lib, *APP_PYPROJECT)))
        return outputs


setup(cmdclass={"build_py": BuildPyWithApp})
