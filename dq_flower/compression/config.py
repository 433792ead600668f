"""Typed knobs of compressed model updates (:class:`CompressionConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dq_flower.codec_choice import CodecChoice
from dq_flower.config import (
    NO_SPELLING,
    RobustConfig,
    client_keys,
    inherit,
    knob,
    one_of,
    read,
    write,
)

__all__ = ["CompressionConfig", "DOWNLINKS", "MESSAGE_PREFIX"]

#: How the wrapper sends the model: as the inner strategy built it (``float32``) or with
#: every floating-point array in IEEE half precision (``fp16``).
DOWNLINKS = ("float32", "fp16")
#: Prefix of the wrapper's keys in a train message's config record.
MESSAGE_PREFIX = "compression-"


@dataclass(frozen=True)
class CompressionConfig(CodecChoice):
    """Knobs of :class:`dq_flower.CompressedUpdates` (run-config keys hyphenated).

    The codec's knobs are the :class:`~dq_flower.codec_choice.CodecChoice` group, as the
    gradient baselines'. The default ``clip-factor`` 2 scales an update above twice the
    round's median norm down to it (from the first round: a node's first updates get no
    free pass); honest updates are seldom that far out, so a lossless codec still gives the
    inner strategy the weights it would get without the wrapper (``clip-factor`` 0: always).
    """

    codec: str = inherit(CodecChoice, "codec", default="qsgd", check=lambda v: None if v != "sign"
                         else "'sign' is majority vote (GradientStrategy); use 'ef-sign' for "
                              "a scaled sign",
                         doc="registry codec of the update (not `sign`: majority vote is "
                             "`GradientStrategy`'s)")
    error_feedback: str = inherit(CodecChoice, "error_feedback", doc=(
        "`on`, `off`; `auto` = on for biased codecs (the residual lives in each client's "
        "`Context.state`)"))
    downlink: str = knob("float32", one_of(DOWNLINKS), client=True, doc=(
        "`float32` (the inner strategy's broadcast, untouched) or `fp16`"))
    clip_factor: float = inherit(RobustConfig, "clip_factor", default=2.0, unset=NO_SPELLING)
    weight_cap: float = inherit(RobustConfig, "weight_cap", default=10.0, unset=NO_SPELLING)
    norm_bound_factor: float = inherit(RobustConfig, "norm_bound_factor")
    min_cosine: float = inherit(RobustConfig, "min_cosine", unset=NO_SPELLING)
    seed: int = knob(0, client=True, doc=(
        "root of the clients' stochastic rounding (with the round and the node)"))

    def message_config(self) -> dict[str, Any]:
        """What travels in each train message's config: prefixed keys, changed knobs only."""
        out = {f"{MESSAGE_PREFIX}{k}": v
               for k, v in write(self, changed_only=True, keys=CLIENT_KEYS).items()}
        out[f"{MESSAGE_PREFIX}codec"] = self.codec  # always present: the mod's marker
        return out

    @classmethod
    def from_message_config(cls, config: dict[str, Any]) -> CompressionConfig:
        """Inverse of :meth:`message_config` (other keys of the config are ignored)."""
        n = len(MESSAGE_PREFIX)
        return read(cls, {k[n:]: v for k, v in config.items()
                          if k.startswith(MESSAGE_PREFIX) and k[n:] in CLIENT_KEYS})


#: The knobs that travel to the clients (:func:`dq_flower.compression_mod` reads them).
CLIENT_KEYS = frozenset(client_keys(CompressionConfig))
