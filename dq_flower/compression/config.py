"""Typed knobs of compressed model updates (:class:`CompressionConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dq_flower.baselines.config import ERROR_FEEDBACK, PER_TENSOR, GradientConfig
from dq_flower.config import (
    check,
    check_choice,
    check_off_or_more,
    clear_unset,
    client_keys,
    client_knob,
    from_mapping,
    to_config_record,
)

__all__ = ["CompressionConfig", "DOWNLINKS", "MESSAGE_PREFIX"]

#: How the wrapper sends the model: as the inner strategy built it (``float32``) or with
#: every floating-point array in IEEE half precision (``fp16``).
DOWNLINKS = ("float32", "fp16")
#: Prefix of the wrapper's keys in a train message's config record.
MESSAGE_PREFIX = "compression-"


@dataclass(frozen=True)
class CompressionConfig:
    """Knobs of :class:`dq_flower.CompressedUpdates` (run-config keys hyphenated).

    Attributes
    ----------
    codec : str
        Registry codec of the update (``identity``, ``fp16``, ``qsgd``, ``terngrad``,
        ``ef-sign``, ``topk``, ``powersgd``, ``bingrad``, ``orq``). ``sign`` (majority vote)
        is :class:`dq_flower.GradientStrategy`'s: its 1-bit update carries no scale.
    codec_params : str
        The codec's parameters, ``"levels=1,bucket=512"``, over the defaults of the gradient
        baselines (``dq_flower.baselines.config.CODEC_DEFAULTS``).
    levels, bucket, ratio, rank
        The shortcuts over ``codec_params``, as in
        :class:`dq_flower.baselines.config.GradientConfig` (``None`` or 0: not set).
    entropy_coder : str
        Lossless coding of every payload: ``none``, ``zlib`` (default), ``lzma``, ``zstd``,
        or ``context`` (the codes of ``qsgd`` and ``terngrad`` updates modelled, per message
        the smaller of it and zlib; zlib for the other codecs and the broadcast).
    error_feedback : str
        ``auto`` (for biased codecs), ``on`` or ``off``; the residual lives in each client's
        ``Context.state``.
    per_tensor : str
        ``auto`` (PowerSGD and TernGrad code each array on its own), ``on`` or ``off``.
    downlink : str
        ``float32`` (the inner strategy's broadcast, untouched) or ``fp16``.
    clip_factor : float
        Clip every client's update to this multiple of the round's median norm before the
        inner strategy aggregates (0: off, the default: the inner strategy's aggregation is
        the user's choice, e.g. ``FedMedian`` or ``FedTrimmedAvg`` for robustness, and a
        lossless codec gives it exactly the weights it would get without the wrapper).
    weight_cap : float
        A client's example count weighs at most this multiple of the round's median
        (default 10; 0: off).
    norm_bound_factor : float
        Reject an update whose norm exceeds this multiple of the recent rounds' median
        norms (default 5; 0: off; see :mod:`dq_flower.server.robust`).
    min_cosine : float
        Leave out of the round a node whose updates' mean cosine with the others' mean,
        over its last 10 rounds (from its third), is below this (default -0.1, as the
        gradient baselines; -1: off; see :class:`dq_flower.server.robust.DirectionScreen`).
        A reversed or sign-flipped client points against the others every round; an honest
        one, on average, does not.
    seed : int
        Root of the clients' stochastic rounding (with the round and the node).
    """

    codec: str = client_knob("qsgd")
    codec_params: str = client_knob("", unset="")
    levels: int | None = client_knob(None, unset=0)
    bucket: int | None = client_knob(None, unset=0)
    ratio: float | None = client_knob(None, unset=0.0)
    rank: int | None = client_knob(None, unset=0)
    entropy_coder: str = client_knob("zlib")
    error_feedback: str = client_knob("auto", unset="auto")
    per_tensor: str = client_knob("auto", unset="auto")
    downlink: str = client_knob("float32")
    clip_factor: float = 0.0
    weight_cap: float = 10.0
    norm_bound_factor: float = 5.0
    min_cosine: float = -0.1
    seed: int = client_knob(0)

    def __post_init__(self) -> None:
        clear_unset(self)  # the old spelling of "not set", 0, is None
        check(self.codec != "sign", "codec",
              "'sign' is majority vote (GradientStrategy); use 'ef-sign' for a scaled sign")
        check_choice(self.error_feedback, ERROR_FEEDBACK, "error_feedback")
        check_choice(self.per_tensor, PER_TENSOR, "per_tensor")
        check_choice(self.downlink, DOWNLINKS, "downlink")
        check_off_or_more(self, ("norm_bound_factor", "clip_factor", "weight_cap"))
        check(-1.0 <= self.min_cosine <= 1.0, "min_cosine", "must lie in [-1, 1]")
        # the codec, its parameters and the coder: "context" stays for the codecs whose
        # codes it models (qsgd, terngrad) and is zlib for the others
        object.__setattr__(self, "entropy_coder", self.gradient_config().entropy_coder)

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
