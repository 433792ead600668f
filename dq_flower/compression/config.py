"""Typed knobs of compressed model updates (:class:`CompressionConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dq_flower.baselines.config import GradientConfig
from dq_flower.config import CodecParams, client_keys, from_mapping, to_config_record
from dq_flower.knob import NO_SPELLING, inherit, knob, one_of
from dq_flower.knobs import RobustConfig

__all__ = ["CompressionConfig", "DOWNLINKS", "MESSAGE_PREFIX"]

#: How the wrapper sends the model: as the inner strategy built it (``float32``) or with
#: every floating-point array in IEEE half precision (``fp16``).
DOWNLINKS = ("float32", "fp16")
#: Prefix of the wrapper's keys in a train message's config record.
MESSAGE_PREFIX = "compression-"


@dataclass(frozen=True)
class CompressionConfig:
    """Knobs of :class:`dq_flower.CompressedUpdates` (run-config keys hyphenated).

    The default ``clip-factor`` 2 scales an update above twice the round's median norm
    down to it (from the first round: a node's first updates get no free pass); honest
    updates are seldom that far out, so a lossless codec still gives the inner strategy the
    weights it would get without the wrapper (``clip-factor`` 0: always).
    """

    codec: str = knob("qsgd", lambda v: None if v != "sign" else (
        "'sign' is majority vote (GradientStrategy); use 'ef-sign' for a scaled sign"),
        client=True, doc="registry codec of the update (not `sign`: majority vote is "
                         "`GradientStrategy`'s)")
    codec_params: CodecParams = inherit(GradientConfig, "codec_params")
    levels: int | None = inherit(GradientConfig, "levels")
    bucket: int | None = inherit(GradientConfig, "bucket")
    ratio: float | None = inherit(GradientConfig, "ratio")
    rank: int | None = inherit(GradientConfig, "rank")
    entropy_coder: str = inherit(GradientConfig, "entropy_coder")
    error_feedback: str = inherit(GradientConfig, "error_feedback", doc=(
        "`on`, `off`; `auto` = on for biased codecs (the residual lives in each client's "
        "`Context.state`)"))
    per_tensor: str = inherit(GradientConfig, "per_tensor")
    downlink: str = knob("float32", one_of(DOWNLINKS), client=True, doc=(
        "`float32` (the inner strategy's broadcast, untouched) or `fp16`"))
    clip_factor: float = inherit(RobustConfig, "clip_factor", default=2.0, unset=NO_SPELLING)
    weight_cap: float = inherit(RobustConfig, "weight_cap", default=10.0, unset=NO_SPELLING)
    norm_bound_factor: float = inherit(RobustConfig, "norm_bound_factor")
    min_cosine: float = inherit(RobustConfig, "min_cosine", unset=NO_SPELLING)
    seed: int = knob(0, client=True, doc=(
        "root of the clients' stochastic rounding (with the round and the node)"))

    def __post_init__(self) -> None:
        """The codec, its parameters and the coder, checked together."""
        self.gradient_config()

    def gradient_config(self) -> GradientConfig:
        """The same codec settings as the gradient baselines' config (shared coding code)."""
        return GradientConfig(codec=self.codec, codec_params=self.codec_params,
                              levels=self.levels, bucket=self.bucket, ratio=self.ratio,
                              rank=self.rank, entropy_coder=self.entropy_coder,
                              error_feedback=self.error_feedback, per_tensor=self.per_tensor)

    def message_config(self) -> dict[str, Any]:
        """What travels in each train message's config: prefixed keys, changed knobs only."""
        travels = client_keys(CompressionConfig)
        out = {f"{MESSAGE_PREFIX}{k}": v for k, v in to_config_record(self).items()
               if k in travels}
        out[f"{MESSAGE_PREFIX}codec"] = self.codec  # always present: the mod's marker
        return out

    @classmethod
    def from_message_config(cls, config: dict[str, Any]) -> CompressionConfig:
        """Inverse of :meth:`message_config` (other keys of the config are ignored)."""
        n = len(MESSAGE_PREFIX)
        travels = client_keys(cls)
        return from_mapping(cls, {k[n:]: v for k, v in config.items()
                                  if k.startswith(MESSAGE_PREFIX) and k[n:] in travels})
