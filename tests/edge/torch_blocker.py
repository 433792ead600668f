"""An import blocker: any import of ``torch`` (or ``torchvision``) raises ``ImportError``.

Installed by :func:`install` at the front of ``sys.meta_path``, so the interpreter acts as
one where PyTorch is not installed; every refused import is appended to the file named by
``DQ_TORCH_BLOCK_LOG`` (one module name a line) where that variable is set. Used by the
torch-free client worker and, as ``sitecustomize``, by a SuperNode that must run without
PyTorch.
"""

from __future__ import annotations

import os
import sys

BLOCKED = ("torch", "torchvision", "torchaudio")


class TorchBlocker:
    """A ``sys.meta_path`` finder that refuses PyTorch's packages."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            log = os.environ.get("DQ_TORCH_BLOCK_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(f"{os.getpid()} {name}\n")
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: a node without "
                                      "PyTorch)", name=name)
        return None


def install() -> None:
    """Put the blocker first on ``sys.meta_path`` (once); fail if torch is already loaded."""
    if any(isinstance(f, TorchBlocker) for f in sys.meta_path):
        return
    loaded = [m for m in sys.modules if m.partition(".")[0] in BLOCKED]
    if loaded:
        raise RuntimeError(f"torch was imported before the blocker: {loaded[:3]}")
    sys.meta_path.insert(0, TorchBlocker())
