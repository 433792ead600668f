"""PyTorch where a step needs it: imported on demand, with a clear error where it is missing."""

from __future__ import annotations

from types import ModuleType

__all__ = ["INSTALL_HINT", "TorchUnavailableError", "require_torch", "torch_available"]

#: What to install on a node that lacks PyTorch.
INSTALL_HINT = "pip install 'dq-flower[server]' (or just: pip install torch)"


class TorchUnavailableError(ImportError):
    """A step that needs PyTorch ran where ``import torch`` fails."""


def require_torch(what: str) -> ModuleType:
    """``torch``, imported now; :class:`TorchUnavailableError` quoting ``what`` if missing."""
    try:
        import torch
    except ImportError as exc:
        raise TorchUnavailableError(
            f"{what} needs PyTorch (the model), which this node cannot import ({exc}). "
            f"Install it here with {INSTALL_HINT}, or use only model-free knobs on this "
            "node: scorer='uniform', compensation='none', upload-mode='data'") from exc
    return torch


def torch_available() -> bool:
    """Whether this node can import PyTorch (imports it if so)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
