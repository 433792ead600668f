"""Error feedback: residual memory around any codec (Seide et al. 2014; Karimireddy et al. 2019).

``encode(x)`` codes ``p = x + e`` and keeps ``e' = p - decode(payload)``, so that
``x + e == decode(payload) + e'`` at every step (up to float32 rounding): nothing the codec
drops is lost, it is sent later. The state (the residual, and the wrapped codec's own
state such as PowerSGD's warm start) goes in and out as a dict of numpy arrays, for
Flower's ``Context.state``.
"""

from __future__ import annotations

import numpy as np

from .base import Codec, Payload, check_finite

__all__ = ["ErrorFeedback"]

_RESIDUAL = "residual"
_CODEC_PREFIX = "codec/"


class ErrorFeedback:
    """Wrap ``codec`` with a residual ``e`` (zero at first).

    Parameters
    ----------
    codec : Codec
        The codec to wrap (typically a biased one: sign, ef-sign, topk, powersgd, bingrad).
    """

    def __init__(self, codec: Codec) -> None:
        if not isinstance(codec, Codec):
            raise ValueError(f"ErrorFeedback wraps a Codec, got {type(codec).__name__}")
        self.codec = codec
        self.residual: np.ndarray | None = None

    @property
    def name(self) -> str:
        """The wrapped codec's registry name (payloads carry it)."""
        return self.codec.name

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.codec!r})"

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x + residual`` and keep the new residual.

        Raises ``ValueError`` if ``x`` holds NaN or inf or its shape differs from the residual's.
        """
        arr = check_finite(x)
        if self.residual is None:
            target = arr.astype(np.float32, copy=True)
        else:
            if self.residual.shape != arr.shape:
                raise ValueError(f"input shape {arr.shape} differs from the residual's "
                                 f"{self.residual.shape}; call reset() when the model changes")
            target = arr + self.residual
        payload = self.codec.encode(target, rng)
        target -= self.codec.decode(payload)
        self.residual = target
        return payload

    def decode(self, p: Payload) -> np.ndarray:
        """Decode with the wrapped codec (the residual lives on the sender only)."""
        return self.codec.decode(p)

    def reset(self) -> None:
        """Drop the residual (and the codec's own state, if it has any)."""
        self.residual = None
        if hasattr(self.codec, "reset"):
            self.codec.reset()

    def state_dict(self) -> dict[str, np.ndarray]:
        """The residual (if any) and the codec's state, as float32 arrays."""
        state: dict[str, np.ndarray] = {}
        if self.residual is not None:
            state[_RESIDUAL] = self.residual.copy()
        if hasattr(self.codec, "state_dict"):
            for key, value in self.codec.state_dict().items():
                state[_CODEC_PREFIX + key] = value
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned.

        No ``residual`` means zero; without ``codec/`` keys the codec keeps its own state.

        Raises
        ------
        ValueError
            On unknown keys or a residual with NaN or inf.
        """
        unknown = [k for k in state if k != _RESIDUAL and not k.startswith(_CODEC_PREFIX)]
        if unknown:
            raise ValueError(f"unknown error-feedback state keys {unknown}")
        residual = state.get(_RESIDUAL)
        codec_state = {k[len(_CODEC_PREFIX):]: v for k, v in state.items()
                       if k.startswith(_CODEC_PREFIX)}
        if codec_state and not hasattr(self.codec, "load_state_dict"):
            raise ValueError(f"codec {self.codec.name!r} keeps no state")
        new_residual = None if residual is None else check_finite(residual, "residual").copy()
        if codec_state and hasattr(self.codec, "load_state_dict"):  # checked above
            self.codec.load_state_dict(codec_state)
        self.residual = new_residual
